package customers

import (
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"gorm.io/gorm"

	"billing/billing"
	"billing/entitlements"
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

type env struct {
	t        *testing.T
	db       *gorm.DB
	proxy    *stripeemu.Proxy
	e        *echo.Echo
	livemode bool
}

func newEnv(t *testing.T, livemode bool) *env {
	t.Helper()
	v := &env{t: t, db: testenv.DB(t), proxy: stripeemu.New(t, testenv.StripeMockURL(t)), livemode: livemode}
	v.mount(v.db)
	return v
}

// mount serves the endpoint on db (the test's database, or one that is down).
func (v *env) mount(db *gorm.DB) {
	logger := apitest.Logger(v.t, slog.LevelWarn)
	h := NewHandlers(Deps{
		DB:       db,
		Accounts: entitlements.New(entitlements.Deps{DB: db, Billing: billing.New(billing.Deps{DB: db, Logger: logger}), Logger: logger}),
		Stripe:   stripeclient.New(v.proxy.URL, "sk_test_customers", logger),
		Livemode: v.livemode,
		Logger:   logger,
		Now:      time.Now,
	})
	v.e = apitest.Server(logger, h.Mount)
}

func (v *env) exec(sql string, args ...any) { v.t.Helper(); testenv.Exec(v.t, v.db, sql, args...) }

func (v *env) put(userID string, body any) *httptest.ResponseRecorder {
	v.t.Helper()
	return v.doAs(appToken, "PUT", "/v1/customers/"+userID, body)
}

func (v *env) doAs(token, method, path string, body any) *httptest.ResponseRecorder {
	v.t.Helper()
	return apitest.Do(v.t, v.e, token, method, path, body)
}

func (v *env) row(userID string) Customer {
	v.t.Helper()
	return v.rowIn(userID, v.livemode)
}

// rowIn is the user's customer row of the given world (zero when none).
func (v *env) rowIn(userID string, live bool) Customer {
	v.t.Helper()
	var c Customer
	if err := v.db.Raw(`SELECT * FROM customers WHERE user_id = $1 AND livemode = $2`, userID, live).Scan(&c).Error; err != nil {
		v.t.Fatalf("load customer %s: %v", userID, err)
	}
	return c
}

// waitForLockWaiters blocks until n requests of this test wait on a lock.
func (v *env) waitForLockWaiters(n int) { apitest.WaitForLockWaiters(v.t, v.db, n) }

var (
	concurrently = apitest.Concurrently
	expectStatus = apitest.ExpectStatus
	decode       = apitest.Decode
	expectError  = apitest.ExpectError
)
