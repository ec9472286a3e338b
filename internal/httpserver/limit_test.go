package httpserver

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
)

// Over the limit, a matching request is refused 503 busy with Retry-After before its handler
// runs; other requests are never limited, and a freed slot is usable again.
func TestLimitConcurrency(t *testing.T) {
	e := echo.New()
	e.HTTPErrorHandler = ErrorHandler(slog.New(slog.DiscardHandler))
	release := make(chan struct{})
	entered := make(chan struct{}, 10)
	var mu sync.Mutex
	ran := 0
	g := e.Group("/v1", LimitConcurrency(2, 3*time.Second, CallsStripe))
	g.POST("/slow", func(c echo.Context) error {
		mu.Lock()
		ran++
		mu.Unlock()
		entered <- struct{}{}
		<-release
		return c.NoContent(http.StatusCreated)
	})
	g.GET("/read", func(c echo.Context) error { return c.NoContent(http.StatusOK) })

	var wg sync.WaitGroup
	codes := make([]int, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rec := httptest.NewRecorder()
			e.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/slow", nil))
			codes[i] = rec.Code
		}()
	}
	<-entered
	<-entered // both slots taken

	rec := httptest.NewRecorder()
	e.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/slow", nil))
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), `"busy"`) || rec.Header().Get("Retry-After") != "3" {
		t.Errorf("over the limit: %d %q Retry-After %q", rec.Code, rec.Body, rec.Header().Get("Retry-After"))
	}
	rec = httptest.NewRecorder()
	e.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/read", nil))
	if rec.Code != http.StatusOK {
		t.Errorf("a read was limited: %d", rec.Code)
	}
	close(release)
	wg.Wait()
	if codes[0] != http.StatusCreated || codes[1] != http.StatusCreated {
		t.Errorf("the admitted requests answered %v", codes)
	}
	mu.Lock()
	if ran != 2 {
		t.Errorf("the handler ran %d times, want 2 (the refused request must not run it)", ran)
	}
	mu.Unlock()

	rec = httptest.NewRecorder()
	e.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/slow", nil))
	if rec.Code != http.StatusCreated {
		t.Errorf("after the slots freed: %d", rec.Code)
	}
}

// Usage records are writes that never call Stripe: they are not limited.
func TestCallsStripeLeavesUsageRecordsOut(t *testing.T) {
	e := echo.New()
	for _, tc := range []struct {
		method, route string
		want          bool
	}{
		{http.MethodPost, "/v1/charges", true},
		{http.MethodPut, "/v1/customers/:user_id", true},
		{http.MethodPost, "/v1/customers/:user_id/usage", false},
		{http.MethodGet, "/v1/customers/:user_id/entitlement", false},
	} {
		c := e.NewContext(httptest.NewRequest(tc.method, "/", nil), httptest.NewRecorder())
		c.SetPath(tc.route)
		if got := CallsStripe(c); got != tc.want {
			t.Errorf("CallsStripe(%s %s) = %v, want %v", tc.method, tc.route, got, tc.want)
		}
	}
}
