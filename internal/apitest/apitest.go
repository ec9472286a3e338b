// Package apitest holds what the tests of the HTTP API share: requests with a bearer token,
// signed webhook deliveries, checks of the error shape, concurrent requests and a wait for
// requests queued on a row lock, a database that is down, and a logger into the test's log.
package apitest

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	gormlogger "gorm.io/gorm/logger"

	"billing/internal/auth"
	"billing/internal/httpserver"
	"billing/internal/stripeevents"
)

// Do sends a request to h with a bearer token (none when empty). body is sent as is when a
// string, as JSON otherwise, and not at all when nil.
func Do(t testing.TB, h http.Handler, token, method, path string, body any) *httptest.ResponseRecorder {
	t.Helper()
	var b []byte
	switch x := body.(type) {
	case nil:
	case string:
		b = []byte(x)
	default:
		var err error
		if b, err = json.Marshal(x); err != nil {
			t.Fatalf("encode body: %v", err)
		}
	}
	req := httptest.NewRequest(method, path, bytes.NewReader(b))
	if len(b) > 0 {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// DeliverWebhook posts payload to h's webhook endpoint (POST /webhooks/stripe) as Stripe does: JSON, with a
// Stripe-Signature of secret at the real time (the inbox checks its tolerance against its own
// clock). The answer is the caller's to check.
func DeliverWebhook(t testing.TB, h http.Handler, secret string, payload []byte) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, "/webhooks/stripe", bytes.NewReader(payload))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Stripe-Signature", stripeevents.SignatureHeader(payload, secret, time.Now()))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// ExpectStatus stops the test unless the answer has status want.
func ExpectStatus(t testing.TB, rec *httptest.ResponseRecorder, want int) {
	t.Helper()
	if rec.Code != want {
		t.Fatalf("status %d, want %d; body %s", rec.Code, want, rec.Body.String())
	}
}

// Decode decodes a JSON object answer.
func Decode(t testing.TB, rec *httptest.ResponseRecorder) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &m); err != nil {
		t.Fatalf("decode %q: %v", rec.Body.String(), err)
	}
	return m
}

// ExpectError checks an error answer: its status, {"error": {"code", "message"}} with the
// code wanted and a message. It returns the error object.
func ExpectError(t testing.TB, rec *httptest.ResponseRecorder, status int, code string) map[string]any {
	t.Helper()
	ExpectStatus(t, rec, status)
	e, _ := Decode(t, rec)["error"].(map[string]any)
	if e == nil || e["code"] != code {
		t.Fatalf("error %s, want code %s", rec.Body.String(), code)
	}
	if msg, _ := e["message"].(string); strings.TrimSpace(msg) == "" {
		t.Errorf("error without message: %s", rec.Body.String())
	}
	return e
}

// Concurrently runs n copies of fn, released at once, and returns their answers.
func Concurrently(n int, fn func(i int) *httptest.ResponseRecorder) []*httptest.ResponseRecorder {
	out := make([]*httptest.ResponseRecorder, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			out[i] = fn(i)
		})
	}
	close(start)
	wg.Wait()
	return out
}

// WaitForLockWaiters blocks until n backends of db's database wait on a lock: concurrent
// requests are then provably queued behind a row lock. The deadline only bounds a failing test.
func WaitForLockWaiters(t testing.TB, db *gorm.DB, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting int
		if err := db.Raw(`SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting).Error; err != nil {
			t.Errorf("count lock waiters: %v", err)
			return
		}
		if waiting >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("only %d of %d requests wait on the lock", waiting, n)
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// UnreachableDB is a pool whose server is gone (port 1 on loopback refuses connections): every
// query fails the way it does when the database is down.
func UnreachableDB(t testing.TB) *gorm.DB {
	t.Helper()
	db, err := gorm.Open(postgres.Open("postgres://postgres@127.0.0.1:1/x?sslmode=disable&connect_timeout=2"),
		&gorm.Config{Logger: gormlogger.Default.LogMode(gormlogger.Silent), DisableAutomaticPing: true})
	if err != nil {
		t.Fatalf("open unreachable database: %v", err)
	}
	return db
}

// Logger logs from level up into the test's log, shown when it fails.
func Logger(t testing.TB, level slog.Level) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: level}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// Tokens of the app backend and of an admin in Server; as long as the configuration requires
// (32 characters or more), so that they could also configure a real service.
const (
	AppToken   = "app-token-for-tests-0123456789abcdef"
	AdminToken = "admin-token-for-tests-0123456789abcdef"
)

// Server is the service's real echo instance (error handler, middleware) with mount's routes on
// the /v1 group behind the app backend's authentication (AppToken; AdminToken gets 403).
func Server(logger *slog.Logger, mount func(v1 *echo.Group)) *echo.Echo {
	e := httpserver.New(httpserver.Options{
		Logger:   logger,
		Registry: prometheus.NewRegistry(),
		Ready:    func(context.Context) error { return nil },
	})
	mount(e.Group("/v1", auth.New([]string{AppToken}, []string{AdminToken}).Require(auth.RoleApp, false)))
	return e
}

// WaitForCount polls query, a count, on db until it is want; the deadline (30 s) only ends a
// failing test.
func WaitForCount(t testing.TB, db *gorm.DB, what, query string, want int, args ...any) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		if err := db.Raw(query, args...).Scan(&n).Error; err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if n == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d, want %d", what, n, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// WaitProcessed waits until every event of ids is stored processed.
func WaitProcessed(t testing.TB, db *gorm.DB, ids ...string) {
	t.Helper()
	WaitForCount(t, db, "processed events", `/* all modes: the tests' events, by id */ SELECT count(*) FROM webhook_events WHERE event_id = ANY($1) AND status = 'processed'`, len(ids), ids)
}
