package httpserver_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"billing/internal/apierr"
	"billing/internal/httpserver"
)

func newServer(t *testing.T, ready httpserver.ReadyFunc) *echo.Echo {
	t.Helper()
	e := httpserver.New(httpserver.Options{Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry(), Ready: ready})
	e.GET("/api-error", func(c echo.Context) error {
		return apierr.New(apierr.CodeIdempotencyConflict, "order o1 was charged with other parameters")
	})
	e.GET("/detail", func(c echo.Context) error {
		return apierr.New(apierr.CodeCardDeclined, "the card was declined").With("decline_code", "insufficient_funds")
	})
	e.GET("/internal", func(c echo.Context) error {
		return errors.New("pq: password authentication failed for user secret_user")
	})
	e.GET("/panic", func(c echo.Context) error { panic("boom: secret detail") })
	e.POST("/json", func(c echo.Context) error {
		var v struct {
			Name string `json:"name"`
		}
		if err := httpserver.DecodeJSON(c, &v, false); err != nil {
			return err
		}
		return c.JSON(200, v)
	})
	return e
}

func TestErrorFormat(t *testing.T) {
	t.Parallel()
	e := newServer(t, func(context.Context) error { return nil })
	tests := []struct {
		name, method, path, body string
		status                   int
		code                     string
		extra                    map[string]string
	}{
		{"api error", "GET", "/api-error", "", 409, "idempotency_conflict", nil},
		{"detail fields", "GET", "/detail", "", 402, "card_declined", map[string]string{"decline_code": "insufficient_funds"}},
		{"internal error hides its cause", "GET", "/internal", "", 500, "internal_error", nil},
		{"panic is a 500", "GET", "/panic", "", 500, "internal_error", nil},
		{"unknown route", "GET", "/nope", "", 404, "route_not_found", nil},
		{"wrong method", "DELETE", "/api-error", "", 405, "method_not_allowed", nil},
		{"malformed JSON", "POST", "/json", "{", 400, "invalid_json", nil},
		{"unknown field", "POST", "/json", `{"nmae":"x"}`, 400, "invalid_json", nil},
		{"empty body", "POST", "/json", "", 400, "invalid_json", nil},
		{"trailing data", "POST", "/json", `{"name":"x"} {}`, 400, "invalid_json", nil},
		{"huge body", "POST", "/json", `{"name":"` + strings.Repeat("x", httpserver.MaxJSONBody) + `"}`, 413, "body_too_large", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rec := httptest.NewRecorder()
			e.ServeHTTP(rec, httptest.NewRequest(tc.method, tc.path, strings.NewReader(tc.body)))
			if rec.Code != tc.status {
				t.Fatalf("status %d, want %d: %s", rec.Code, tc.status, rec.Body)
			}
			if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
				t.Errorf("content type %q", ct)
			}
			var body struct {
				Error map[string]string `json:"error"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatalf("not JSON: %s", rec.Body)
			}
			if body.Error["code"] != tc.code || body.Error["message"] == "" {
				t.Errorf("error %v, want code %q and a message", body.Error, tc.code)
			}
			for k, v := range tc.extra {
				if body.Error[k] != v {
					t.Errorf("%s = %q, want %q", k, body.Error[k], v)
				}
			}
			if strings.Contains(rec.Body.String(), "secret") {
				t.Errorf("internal detail leaked: %s", rec.Body)
			}
		})
	}
}

func TestHealthAndReadiness(t *testing.T) {
	t.Parallel()
	var notReady error
	e := newServer(t, func(context.Context) error { return notReady })
	get := func(path string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		return rec
	}
	if rec := get("/healthz"); rec.Code != 200 {
		t.Errorf("/healthz %d", rec.Code)
	}
	if rec := get("/readyz"); rec.Code != 200 {
		t.Errorf("/readyz %d while ready", rec.Code)
	}
	if rec := get("/metrics"); rec.Code != 200 || !strings.Contains(rec.Body.String(), "billing_http_request_duration_seconds") {
		t.Errorf("/metrics %d, or without the request histogram", rec.Code)
	}
	notReady = errors.Join(httpserver.ErrNotReady{Reason: "database unreachable"}, errors.New("dial tcp postgres://user:pw@host"))
	rec := get("/readyz")
	if rec.Code != 503 || !strings.Contains(rec.Body.String(), "database unreachable") {
		t.Errorf("/readyz %d %s, want 503 naming the reason", rec.Code, rec.Body)
	}
	if strings.Contains(rec.Body.String(), "pw@") {
		t.Errorf("readiness leaked the connection string: %s", rec.Body)
	}
	if rec := get("/healthz"); rec.Code != 200 {
		t.Errorf("/healthz %d while not ready: liveness must not depend on dependencies", rec.Code)
	}
}
