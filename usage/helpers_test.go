package usage

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"gorm.io/gorm"

	"billing/billing"
	"billing/entitlements"
	"billing/internal/apitest"
	"billing/internal/auth"
	"billing/internal/stripeclient"
	"billing/internal/stripeemu"
	"billing/internal/testenv"
	"billing/migrations"
)

func TestMain(m *testing.M) { testenv.MainWith(m, migrations.ApplyQuietly) }

// env is one test's service: its own database, a proxy in front of stripe-mock with the meter
// events double, and the real echo instance with the app's authentication on /v1.
type env struct {
	t      *testing.T
	db     *gorm.DB
	proxy  *stripeemu.Proxy
	meters *stripeemu.MeterEvents
	// clock is the service's; it starts at the real time (the double checks timestamps against
	// its own) and moves only when the test says.
	clock *testenv.Clock
	svc   *Service
	e     *echo.Echo
}

func newEnv(t *testing.T) *env {
	t.Helper()
	return newEnvMode(t, false)
}

func newEnvMode(t *testing.T, livemode bool) *env {
	t.Helper()
	logger := apitest.Logger(t, slog.LevelWarn)
	db := testenv.DB(t)
	proxy := stripeemu.New(t, testenv.StripeMockURL(t))
	v := &env{t: t, db: db, proxy: proxy, meters: stripeemu.NewMeterEvents(proxy, livemode),
		clock: testenv.NewClock(time.Now().UTC().Truncate(time.Second))}
	key := "sk_test_usage"
	if livemode {
		key = "sk_live_usage"
	}
	v.svc = New(Deps{
		DB: db, Stripe: stripeclient.New(proxy.URL, key, logger), Livemode: livemode,
		Periods: entitlements.New(entitlements.Deps{DB: db, Billing: billing.New(billing.Deps{DB: db, Logger: logger, Now: v.clock.Now}),
			Logger: logger, Now: v.clock.Now, Policy: entitlements.Policy{PastDueEntitled: true}}),
		// A rate the tests never wait for.
		ReportRate: 1000, Logger: logger, Now: v.clock.Now,
	})
	v.e = apitest.Server(logger, v.svc.Mount)
	v.svc.MountAdmin(v.e.Group("/admin", auth.New([]string{apitest.AppToken}, []string{apitest.AdminToken}).Require(auth.RoleAdmin, true)))
	return v
}

// addCustomer links a user to a Stripe customer the way the customers package does.
func (v *env) addCustomer(userID string, livemode bool) string {
	v.t.Helper()
	stripeID := "cus_" + userID
	testenv.LinkCustomer(v.t, v.db, userID, stripeID, userID+"@example.com", livemode)
	return stripeID
}

func (v *env) exec(sql string, args ...any) { v.t.Helper(); testenv.Exec(v.t, v.db, sql, args...) }

func (v *env) post(userID string, body any) *httptest.ResponseRecorder {
	v.t.Helper()
	return apitest.Do(v.t, v.e, apitest.AppToken, http.MethodPost, "/v1/customers/"+userID+"/usage", body)
}

func (v *env) admin(method, path string, body any) *httptest.ResponseRecorder {
	v.t.Helper()
	return apitest.Do(v.t, v.e, apitest.AdminToken, method, path, body)
}

func (v *env) get(path string) *httptest.ResponseRecorder {
	v.t.Helper()
	return apitest.Do(v.t, v.e, apitest.AppToken, http.MethodGet, path, nil)
}

func (v *env) row(userID, usageID string) record {
	v.t.Helper()
	var r record
	if err := v.db.Raw(`SELECT * FROM usage_records WHERE user_id = $1 AND usage_id = $2`, userID, usageID).Scan(&r).Error; err != nil {
		v.t.Fatalf("load usage record %s/%s: %v", userID, usageID, err)
	}
	return r
}

// report runs the reporter once over the due records.
func (v *env) report() int {
	v.t.Helper()
	n, err := v.svc.ReportDue(context.Background())
	if err != nil {
		v.t.Fatalf("ReportDue: %v", err)
	}
	return n
}

func expectError(t *testing.T, rec *httptest.ResponseRecorder, status int, code string) {
	t.Helper()
	if rec.Code != status {
		t.Fatalf("status %d, want %d: %s", rec.Code, status, rec.Body)
	}
	body := apitest.Decode(t, rec)
	e, _ := body["error"].(map[string]any)
	if e == nil || e["code"] != code {
		t.Fatalf("error %v, want code %s", body, code)
	}
}
