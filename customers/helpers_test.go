package customers

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"gorm.io/gorm"

	"billing/internal/auth"
	"billing/internal/httpserver"
	"billing/internal/stripeclient"
	"billing/internal/stripetest"
	"billing/internal/testenv"
	"billing/migrations"
)

const (
	appToken   = "app-token-for-tests"
	adminToken = "admin-token-for-tests"
)

func TestMain(m *testing.M) {
	testenv.SetMigrator(func(ctx context.Context, db *sql.DB) error { return migrations.Apply(ctx, db, nil) })
	testenv.Main(m)
}

type env struct {
	t     *testing.T
	db    *gorm.DB
	proxy *stripetest.Proxy
	e     *echo.Echo
}

func newEnv(t *testing.T, livemode bool) *env {
	t.Helper()
	db := testenv.DB(t)
	proxy := stripetest.New(t, testenv.StripeMockURL(t))
	logger := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	h := NewHandlers(Deps{
		DB:       db,
		Stripe:   stripeclient.New(proxy.URL, "sk_test_customers", logger),
		Livemode: livemode,
		Logger:   logger,
		Now:      time.Now,
	})
	e := httpserver.New(httpserver.Options{
		Logger:   logger,
		Registry: prometheus.NewRegistry(),
		Ready:    func(context.Context) error { return nil },
	})
	h.Mount(e.Group("/v1", auth.New([]string{appToken}, []string{adminToken}).Require(auth.RoleApp, false)))
	return &env{t: t, db: db, proxy: proxy, e: e}
}

func (v *env) exec(sql string, args ...any) {
	v.t.Helper()
	if err := v.db.Exec(sql, args...).Error; err != nil {
		v.t.Fatalf("exec %q: %v", sql, err)
	}
}

func (v *env) put(userID string, body any) *httptest.ResponseRecorder {
	v.t.Helper()
	return v.doAs(appToken, "PUT", "/v1/customers/"+userID, body)
}

func (v *env) doAs(token, method, path string, body any) *httptest.ResponseRecorder {
	v.t.Helper()
	var b []byte
	switch x := body.(type) {
	case nil:
	case string:
		b = []byte(x)
	default:
		var err error
		if b, err = json.Marshal(x); err != nil {
			v.t.Fatalf("encode body: %v", err)
		}
	}
	req := httptest.NewRequest(method, path, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	v.e.ServeHTTP(rec, req)
	return rec
}

func (v *env) row(userID string) Customer {
	v.t.Helper()
	var c Customer
	if err := v.db.Raw(`SELECT * FROM customers WHERE user_id = ?`, userID).Scan(&c).Error; err != nil {
		v.t.Fatalf("load customer %s: %v", userID, err)
	}
	return c
}

// waitForLockWaiters blocks until n backends of this test's database wait on a lock.
func (v *env) waitForLockWaiters(n int) {
	v.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting int
		if err := v.db.Raw(`SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting).Error; err != nil {
			v.t.Fatalf("count lock waiters: %v", err)
		}
		if waiting >= n {
			return
		}
		if time.Now().After(deadline) {
			v.t.Fatalf("only %d of %d requests wait on the lock", waiting, n)
		}
	}
}

func concurrently(n int, fn func(i int) *httptest.ResponseRecorder) []*httptest.ResponseRecorder {
	out := make([]*httptest.ResponseRecorder, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			out[i] = fn(i)
		}()
	}
	close(start)
	wg.Wait()
	return out
}

func expectStatus(t *testing.T, rec *httptest.ResponseRecorder, want int) {
	t.Helper()
	if rec.Code != want {
		t.Fatalf("status %d, want %d; body %s", rec.Code, want, rec.Body.String())
	}
}

func decode(t *testing.T, rec *httptest.ResponseRecorder) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &m); err != nil {
		t.Fatalf("decode %q: %v", rec.Body.String(), err)
	}
	return m
}

func expectError(t *testing.T, rec *httptest.ResponseRecorder, status int, code string) {
	t.Helper()
	expectStatus(t, rec, status)
	e, _ := decode(t, rec)["error"].(map[string]any)
	if e == nil || e["code"] != code {
		t.Fatalf("error %s, want code %s", rec.Body.String(), code)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}
