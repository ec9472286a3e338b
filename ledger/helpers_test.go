package ledger

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"gorm.io/gorm"

	"billing/internal/apitest"
	"billing/internal/stripeclient"
	"billing/internal/stripeemu"
	"billing/internal/testenv"
	"billing/migrations"
)

const (
	appToken   = apitest.AppToken
	adminToken = apitest.AdminToken
)

func TestMain(m *testing.M) { testenv.MainWith(m, migrations.ApplyQuietly) }

// env is one test's service: its own database, its own proxy in front of stripe-mock, and the
// real echo instance with the app's authentication on /v1.
type env struct {
	t     *testing.T
	db    *gorm.DB
	proxy *stripeemu.Proxy
	e     *echo.Echo
	svc   *Service
}

func newEnv(t *testing.T) *env {
	t.Helper()
	return newEnvLogging(t, apitest.Logger(t, slog.LevelWarn))
}

// newEnvLogging is newEnv with the service's (and the HTTP layer's) log going to logger.
func newEnvLogging(t *testing.T, logger *slog.Logger) *env {
	t.Helper()
	db := testenv.DB(t)
	proxy := stripeemu.New(t, testenv.StripeMockURL(t))
	svc := New(Deps{
		DB:     db,
		Stripe: stripeclient.New(proxy.URL, "sk_test_ledger", logger),
		Logger: logger,
		Now:    time.Now,
	})
	return &env{t: t, db: db, proxy: proxy, e: apitest.Server(logger, svc.Mount), svc: svc}
}

// addCustomer links a user to a Stripe customer the way the customers package does.
func (v *env) addCustomer(userID string) string {
	v.t.Helper()
	stripeID := "cus_" + userID
	testenv.LinkCustomer(v.t, v.db, userID, stripeID, userID+"@example.com", false)
	return stripeID
}

func (v *env) exec(sql string, args ...any) { v.t.Helper(); testenv.Exec(v.t, v.db, sql, args...) }

// do sends a request with the app token; body is sent as is when a string, else as JSON.
func (v *env) do(method, path string, body any) *httptest.ResponseRecorder {
	v.t.Helper()
	return v.doAs(appToken, method, path, body)
}

func (v *env) doAs(token, method, path string, body any) *httptest.ResponseRecorder {
	v.t.Helper()
	return apitest.Do(v.t, v.e, token, method, path, body)
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
	if err := v.db.Raw(`SELECT * FROM charges WHERE order_id = $1`, orderID).Scan(&row).Error; err != nil {
		v.t.Fatalf("load charge %s: %v", orderID, err)
	}
	return row
}

func (v *env) refundRow(orderID, refundID string) refundRow {
	v.t.Helper()
	var row refundRow
	if err := v.db.Raw(`SELECT * FROM refunds WHERE order_id = $1 AND refund_id = $2`, orderID, refundID).Scan(&row).Error; err != nil {
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
func (v *env) expectKeys(method, path, key string, wantRequests int) []stripeemu.Request {
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

// waitForLockWaiters blocks until n requests of this test wait on a lock.
func (v *env) waitForLockWaiters(n int) { apitest.WaitForLockWaiters(v.t, v.db, n) }

var (
	concurrently = apitest.Concurrently
	expectStatus = apitest.ExpectStatus
	decode       = apitest.Decode
	expectError  = apitest.ExpectError
)
