package auth_test

import (
	"net/http"
	"net/http/httptest"
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
		{"same-origin form post with basic auth", "/admin/x", "", "admin-1", 200, "POST", "http://example.com", "same-origin"},
		{"cross-site form post with basic auth", "/admin/x", "", "admin-1", 403, "POST", "https://evil.test", "cross-site"},
		{"foreign origin with basic auth", "/admin/x", "", "admin-1", 403, "POST", "https://evil.test", ""},
		{"bearer post from anywhere", "/admin/x", "Bearer admin-1", "", 200, "POST", "https://evil.test", "cross-site"},
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
