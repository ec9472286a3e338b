package ledger

import (
	"bytes"
	"context"
	"database/sql"
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

// env is one test's service: its own database, its own proxy in front of stripe-mock, and the
// real echo instance with the app's authentication on /v1.
type env struct {
	t     *testing.T
	db    *gorm.DB
	proxy *stripetest.Proxy
	e     *echo.Echo
}

func newEnv(t *testing.T) *env {
	t.Helper()
	db := testenv.DB(t)
	proxy := stripetest.New(t, testenv.StripeMockURL(t))
	logger := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	svc := New(Deps{
		DB:     db,
		Stripe: stripeclient.New(proxy.URL, "sk_test_ledger", logger),
		Logger: logger,
		Now:    time.Now,
	})
	e := httpserver.New(httpserver.Options{
		Logger:   logger,
		Registry: prometheus.NewRegistry(),
		Ready:    func(context.Context) error { return nil },
	})
	svc.Mount(e.Group("/v1", auth.New([]string{appToken}, []string{adminToken}).Require(auth.RoleApp, false)))
	return &env{t: t, db: db, proxy: proxy, e: e}
}

// addCustomer links a user to a Stripe customer the way the customers package does.
func (v *env) addCustomer(userID string) string {
	v.t.Helper()
	stripeID := "cus_" + userID
	v.exec(`INSERT INTO customers (user_id, stripe_customer_id, email) VALUES (?, ?, ?)`, userID, stripeID, userID+"@example.com")
	return stripeID
}

func (v *env) exec(sql string, args ...any) {
	v.t.Helper()
	if err := v.db.Exec(sql, args...).Error; err != nil {
		v.t.Fatalf("exec %q: %v", sql, err)
	}
}

// do sends a request with the app token; body is sent as is when a string, else as JSON.
func (v *env) do(method, path string, body any) *httptest.ResponseRecorder {
	v.t.Helper()
	return v.doAs(appToken, method, path, body)
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

type chargeJSON map[string]any

func (v *env) charge(orderID, userID string, amount int64, currency string) *httptest.ResponseRecorder {
	v.t.Helper()
	return v.do(http.MethodPost, "/v1/charges", chargeJSON{
		"order_id": orderID, "user_id": userID, "amount": amount, "currency": currency,
	})
}

func (v *env) refund(orderID string, body map[string]any) *httptest.ResponseRecorder {
	v.t.Helper()
	return v.do(http.MethodPost, "/v1/charges/"+orderID+"/refunds", body)
}

// mustCharge makes a successful charge and returns its PaymentIntent id.
func (v *env) mustCharge(orderID, userID string, amount int64) string {
	v.t.Helper()
	rec := v.charge(orderID, userID, amount, "usd")
	expectStatus(v.t, rec, http.StatusCreated)
	return decode(v.t, rec)["payment_intent_id"].(string)
}

func (v *env) chargeRow(orderID string) chargeRow {
	v.t.Helper()
	var row chargeRow
	if err := v.db.Raw(`SELECT * FROM charges WHERE order_id = ?`, orderID).Scan(&row).Error; err != nil {
		v.t.Fatalf("load charge %s: %v", orderID, err)
	}
	return row
}

func (v *env) refundRow(orderID, refundID string) refundRow {
	v.t.Helper()
	var row refundRow
	if err := v.db.Raw(`SELECT * FROM refunds WHERE order_id = ? AND refund_id = ?`, orderID, refundID).Scan(&row).Error; err != nil {
		v.t.Fatalf("load refund %s/%s: %v", orderID, refundID, err)
	}
	return row
}

// expectStripeHeaders checks that every call that reached the proxy carried the pinned API
// version and, for writes, an idempotency key.
func (v *env) expectStripeHeaders() {
	v.t.Helper()
	if stripeclient.APIVersion != "2024-06-20" {
		v.t.Errorf("stripeclient pins %s, want 2024-06-20", stripeclient.APIVersion)
	}
	for _, r := range v.proxy.Requests() {
		if r.StripeVersion != "2024-06-20" {
			v.t.Errorf("%s %s: Stripe-Version %q, want 2024-06-20", r.Method, r.Path, r.StripeVersion)
		}
		if r.Method == http.MethodPost && r.IdempotencyKey == "" {
			v.t.Errorf("%s %s: no Idempotency-Key", r.Method, r.Path)
		}
	}
}

// expectKeys checks the idempotency keys of every request to method+path.
func (v *env) expectKeys(method, path, key string, wantRequests int) []stripetest.Request {
	v.t.Helper()
	reqs := v.proxy.Filter(method, path)
	if len(reqs) != wantRequests {
		v.t.Fatalf("%d requests to %s %s, want %d", len(reqs), method, path, wantRequests)
	}
	for i, r := range reqs {
		if r.IdempotencyKey != key {
			v.t.Errorf("request %d to %s: Idempotency-Key %q, want %q", i, path, r.IdempotencyKey, key)
		}
	}
	return reqs
}

// waitForLockWaiters blocks until n backends of this test's database wait on a lock: the
// concurrent requests are then provably queued behind the row lock.
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

// concurrently runs n copies of fn at once and returns their answers.
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

// expectError checks an error answer's status and code and returns its error object.
func expectError(t *testing.T, rec *httptest.ResponseRecorder, status int, code string) map[string]any {
	t.Helper()
	expectStatus(t, rec, status)
	e, _ := decode(t, rec)["error"].(map[string]any)
	if e == nil || e["code"] != code {
		t.Fatalf("error %s, want code %s", rec.Body.String(), code)
	}
	if msg, _ := e["message"].(string); strings.TrimSpace(msg) == "" {
		t.Errorf("error without message: %s", rec.Body.String())
	}
	return e
}

// testWriter sends log lines to the test's log, shown when it fails.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}
