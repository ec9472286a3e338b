package auth_test

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"

	"billing/internal/auth"
	"billing/internal/httpserver"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
)

func TestRequire(t *testing.T) {
	t.Parallel()
	tokens := auth.New([]string{"app-1", "app-2"}, []string{"admin-1"})
	e := httpserver.New(httpserver.Options{Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry()})
	ok := func(c echo.Context) error { return c.String(200, "ok") }
	e.GET("/v1/x", ok, tokens.Require(auth.RoleApp, false))
	e.GET("/admin/x", ok, tokens.Require(auth.RoleAdmin, true))
	e.POST("/admin/x", ok, tokens.Require(auth.RoleAdmin, true))

	tests := []struct {
		name, path, header string
		basicPW            string
		status             int
		method, origin     string
		fetchSite          string
	}{
		{"app token", "/v1/x", "Bearer app-1", "", 200, "", "", ""},
		{"second app token", "/v1/x", "Bearer app-2", "", 200, "", "", ""},
		{"lower-case scheme", "/v1/x", "bearer app-1", "", 200, "", "", ""},
		{"no token", "/v1/x", "", "", 401, "", "", ""},
		{"wrong token", "/v1/x", "Bearer app-3", "", 401, "", "", ""},
		{"prefix of a token", "/v1/x", "Bearer app-", "", 401, "", "", ""},
		{"admin token on the app API", "/v1/x", "Bearer admin-1", "", 403, "", "", ""},
		{"basic auth not accepted on the app API", "/v1/x", "", "app-1", 401, "", "", ""},
		{"admin token", "/admin/x", "Bearer admin-1", "", 200, "", "", ""},
		{"admin token as basic password", "/admin/x", "", "admin-1", 200, "", "", ""},
		{"app token on admin", "/admin/x", "Bearer app-1", "", 403, "", "", ""},
		{"wrong basic password", "/admin/x", "", "nope", 401, "", "", ""},
		{"same-origin form post with basic auth but no CSRF token", "/admin/x", "", "admin-1", 403, "POST", "http://example.com", "same-origin"},
		{"cross-site form post with basic auth", "/admin/x", "", "admin-1", 403, "POST", "https://evil.test", "cross-site"},
		{"foreign origin with basic auth", "/admin/x", "", "admin-1", 403, "POST", "https://evil.test", ""},
		{"bearer post from anywhere, without a CSRF token", "/admin/x", "Bearer admin-1", "", 200, "POST", "https://evil.test", "cross-site"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			method := tc.method
			if method == "" {
				method = http.MethodGet
			}
			req := httptest.NewRequest(method, tc.path, nil)
			if tc.origin != "" {
				req.Header.Set("Origin", tc.origin)
			}
			if tc.fetchSite != "" {
				req.Header.Set("Sec-Fetch-Site", tc.fetchSite)
			}
			if tc.header != "" {
				req.Header.Set("Authorization", tc.header)
			}
			if tc.basicPW != "" {
				req.SetBasicAuth("admin", tc.basicPW)
			}
			rec := httptest.NewRecorder()
			e.ServeHTTP(rec, req)
			if rec.Code != tc.status {
				t.Errorf("status %d, want %d: %s", rec.Code, tc.status, rec.Body)
			}
		})
	}
}

// A write authenticated by Basic credentials needs the CSRF token of a page served to the same
// admin token; reads and bearer writes do not.
func TestRequireCSRF(t *testing.T) {
	t.Parallel()
	tokens := auth.New([]string{"app-1"}, []string{"admin-1", "admin-2"})
	e := httpserver.New(httpserver.Options{Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry()})
	admin := e.Group("/admin", tokens.Require(auth.RoleAdmin, true))
	admin.GET("/page", func(c echo.Context) error { return c.String(200, auth.CSRFToken(c)) })
	admin.POST("/x", func(c echo.Context) error { return c.String(200, "posted "+c.FormValue("v")) })

	tokenOf := func(password string) string {
		req := httptest.NewRequest(http.MethodGet, "/admin/page", nil)
		req.SetBasicAuth("admin", password)
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, req)
		if rec.Code != 200 || rec.Body.Len() == 0 {
			t.Fatalf("page: %d %q", rec.Code, rec.Body)
		}
		return rec.Body.String()
	}
	tok1, tok2 := tokenOf("admin-1"), tokenOf("admin-2")
	if tok1 == tok2 {
		t.Fatal("two admin tokens get the same CSRF token")
	}

	tests := []struct {
		name     string
		basicPW  string
		bearer   string
		form     url.Values
		header   string
		status   int
		wantBody string
		query    url.Values
	}{
		{"form field of the same admin", "admin-1", "", url.Values{"csrf_token": {tok1}, "v": {"a"}}, "", 200, "posted a", nil},
		{"header of the same admin", "admin-1", "", url.Values{"v": {"b"}}, tok1, 200, "posted b", nil},
		{"no token", "admin-1", "", url.Values{"v": {"c"}}, "", 403, "", nil},
		{"token of another admin token", "admin-1", "", url.Values{"csrf_token": {tok2}}, "", 403, "", nil},
		{"tampered token", "admin-1", "", url.Values{"csrf_token": {tok1 + "x"}}, "", 403, "", nil},
		{"garbage token", "admin-1", "", url.Values{"csrf_token": {"1.2"}}, "", 403, "", nil},
		{"wrong password with a token", "nope", "", url.Values{"csrf_token": {tok1}}, "", 401, "", nil},
		{"bearer needs none", "", "admin-1", url.Values{"v": {"d"}}, "", 200, "posted d", nil},
		// A token in the URL leaks (logs, history, Referer): only the form body counts.
		{"token in the query string only", "admin-1", "", url.Values{"v": {"e"}}, "", 403, "", url.Values{"csrf_token": {tok1}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			target := "/admin/x"
			if tc.query != nil {
				target += "?" + tc.query.Encode()
			}
			req := httptest.NewRequest(http.MethodPost, target, strings.NewReader(tc.form.Encode()))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.Header.Set("Sec-Fetch-Site", "same-origin")
			if tc.basicPW != "" {
				req.SetBasicAuth("admin", tc.basicPW)
			}
			if tc.bearer != "" {
				req.Header.Set("Authorization", "Bearer "+tc.bearer)
			}
			if tc.header != "" {
				req.Header.Set(auth.CSRFHeader, tc.header)
			}
			rec := httptest.NewRecorder()
			e.ServeHTTP(rec, req)
			if rec.Code != tc.status || (tc.wantBody != "" && rec.Body.String() != tc.wantBody) {
				t.Errorf("status %d %q, want %d %q", rec.Code, rec.Body, tc.status, tc.wantBody)
			}
		})
	}
}

// A named admin token ("name:TOKEN") authenticates with its token and acts as its name; an
// unnamed one acts as its fingerprint, never as itself.
func TestAdminActors(t *testing.T) {
	t.Parallel()
	const alice, other = "alice-0123456789abcdef0123456789abcd", "other-0123456789abcdef0123456789abcd"
	// A token that merely contains a colon is a token, not a name.
	const colon = "not a name:0123456789abcdef0123456789abcdef"
	tokens := auth.New(nil, []string{"alice:" + alice, other, colon})
	e := httpserver.New(httpserver.Options{Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry()})
	e.GET("/admin/who", func(c echo.Context) error { return c.String(200, auth.Actor(c.Request().Context())) },
		tokens.Require(auth.RoleAdmin, true))
	for _, tc := range []struct {
		token, want string
		status      int
	}{
		{alice, "alice", 200},
		{"alice:" + alice, "alice", 200}, // the whole entry still works, as the same actor
		{other, auth.Fingerprint(other), 200},
		{colon, auth.Fingerprint(colon), 200},
		{"alice", "", 401},
	} {
		req := httptest.NewRequest(http.MethodGet, "/admin/who", nil)
		req.Header.Set("Authorization", "Bearer "+tc.token)
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, req)
		if rec.Code != tc.status || (tc.status == 200 && rec.Body.String() != tc.want) {
			t.Errorf("token %q: %d %q, want %d %q", tc.token, rec.Code, rec.Body, tc.status, tc.want)
		}
		if strings.Contains(rec.Body.String(), "0123456789") {
			t.Errorf("actor %q shows the token", rec.Body)
		}
	}
	if fp := auth.Fingerprint(other); !strings.HasPrefix(fp, "token:") || len(fp) != len("token:")+12 || fp == auth.Fingerprint(alice) {
		t.Errorf("fingerprint %q", fp)
	}
	if n, tok := auth.SplitAdminToken("bob:" + alice); n != "bob" || tok != alice {
		t.Errorf("split: %q %q", n, tok)
	}
}
