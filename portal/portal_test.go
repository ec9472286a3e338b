package portal

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"gorm.io/gorm"

	"billing/catalog"
	"billing/internal/apitest"
	"billing/internal/stripeclient"
	"billing/internal/stripeemu"
	"billing/internal/testenv"
	"billing/migrations"
)

const (
	appToken     = apitest.AppToken
	adminToken   = apitest.AdminToken
	sessionsPath = "/v1/billing_portal/sessions"
	defaultURL   = "https://app.example.com/billing"
)

func TestMain(m *testing.M) {
	testenv.SetMigrator(migrations.ApplyQuietly)
	testenv.Main(m)
}

// sqlSubscriptions is the smallest SubscriptionLookup over the real subscriptions table (billing
// has the production one).
type sqlSubscriptions struct{ db *gorm.DB }

func (s sqlSubscriptions) CustomerSubscriptionStatus(ctx context.Context, stripeCustomerID string, livemode bool, subscriptionID string) (string, bool, error) {
	var statuses []string
	err := s.db.WithContext(ctx).Raw(`SELECT status FROM subscriptions WHERE subscription_id = ? AND stripe_customer_id = ? AND livemode = ?`,
		subscriptionID, stripeCustomerID, livemode).Scan(&statuses).Error
	if err != nil || len(statuses) == 0 {
		return "", false, err
	}
	return statuses[0], true, nil
}

type failingSubscriptions struct{}

func (failingSubscriptions) CustomerSubscriptionStatus(context.Context, string, bool, string) (string, bool, error) {
	return "", false, errors.New("lookup broke")
}

type env struct {
	t     *testing.T
	db    *gorm.DB
	proxy *stripeemu.Proxy
	e     *echo.Echo
}

func newEnv(t *testing.T, returnURL string, subs SubscriptionLookup) *env {
	t.Helper()
	db := testenv.DB(t)
	v := newEnvOn(t, db, returnURL, subs)
	v.exec(`INSERT INTO customers (user_id, stripe_customer_id, email) VALUES ('u1', 'cus_u1', 'u1@example.com'), ('u2', 'cus_u2', 'u2@example.com')`)
	v.exec(`INSERT INTO customers (user_id, email) VALUES ('halfway', 'h@example.com')`)
	for _, s := range []struct{ id, cus, status string }{
		{"sub_active", "cus_u1", "active"},
		{"sub_trialing", "cus_u1", "trialing"},
		{"sub_past_due", "cus_u1", "past_due"},
		{"sub_unpaid", "cus_u1", "unpaid"},
		{"sub_incomplete", "cus_u1", "incomplete"},
		{"sub_paused", "cus_u1", "paused"},
		{"sub_canceled", "cus_u1", "canceled"},
		{"sub_expired", "cus_u1", "incomplete_expired"},
		{"sub_of_u2", "cus_u2", "active"},
	} {
		v.exec(`INSERT INTO subscriptions (subscription_id, stripe_customer_id, status) VALUES (?, ?, ?)`, s.id, s.cus, s.status)
	}
	return v
}

// newEnvOn serves the endpoints on db, which may be down.
func newEnvOn(t *testing.T, db *gorm.DB, returnURL string, subs SubscriptionLookup) *env {
	t.Helper()
	proxy := stripeemu.New(t, testenv.StripeMockURL(t))
	logger := slog.New(slog.DiscardHandler)
	if subs == nil {
		subs = sqlSubscriptions{db}
	}
	svc := New(Deps{
		DB:               db,
		Stripe:           stripeclient.New(proxy.URL, "sk_test_portal", logger),
		Subscriptions:    subs,
		DefaultReturnURL: returnURL,
		Prices:           catalog.New(catalog.Deps{DB: db}),
		Now:              func() time.Time { return previewNow },
		Logger:           logger,
	})
	return &env{t: t, db: db, proxy: proxy, e: apitest.Server(logger, svc.Mount)}
}

func (v *env) exec(sql string, args ...any) {
	v.t.Helper()
	if err := v.db.Exec(sql, args...).Error; err != nil {
		v.t.Fatalf("exec %q: %v", sql, err)
	}
}

func (v *env) post(token, path, body string) *httptest.ResponseRecorder {
	v.t.Helper()
	return apitest.Do(v.t, v.e, token, http.MethodPost, path, body)
}

func cancelPath(user, sub string) string {
	return "/v1/customers/" + user + "/subscriptions/" + sub + "/cancel"
}

var (
	expectStatus = apitest.ExpectStatus
	expectError  = apitest.ExpectError
)

func expectForm(t *testing.T, r stripeemu.Request, want map[string]string) {
	t.Helper()
	for k, w := range want {
		if got := r.Form.Get(k); got != w {
			t.Errorf("form %s = %q, want %q", k, got, w)
		}
	}
}

func TestCancelRedirectsToThePortalCancellationFlow(t *testing.T) {
	t.Parallel()
	v := newEnv(t, defaultURL, nil)
	for _, sub := range []string{"sub_active", "sub_trialing", "sub_past_due", "sub_unpaid", "sub_incomplete", "sub_paused"} {
		t.Run(sub, func(t *testing.T) {
			before := len(v.proxy.Filter(http.MethodPost, sessionsPath))
			rec := v.post(appToken, cancelPath("u1", sub), "")
			expectStatus(t, rec, http.StatusSeeOther)
			reqs := v.proxy.Filter(http.MethodPost, sessionsPath)
			if len(reqs) != before+1 {
				t.Fatalf("%d session requests, want %d", len(reqs), before+1)
			}
			r := reqs[len(reqs)-1]
			expectForm(t, r, map[string]string{
				"customer":        "cus_u1",
				"return_url":      defaultURL,
				"flow_data[type]": "subscription_cancel",
				"flow_data[subscription_cancel][subscription]":      sub,
				"flow_data[after_completion][type]":                 "redirect",
				"flow_data[after_completion][redirect][return_url]": defaultURL,
			})
			if r.StripeVersion != "2024-06-20" {
				t.Errorf("Stripe-Version %q", r.StripeVersion)
			}
			made := v.proxy.Objects(sessionsPath)
			url, _ := made[len(made)-1]["url"].(string)
			if loc := rec.Header().Get("Location"); loc == "" || loc != url {
				t.Errorf("Location %q, want the session URL %q", loc, url)
			}
		})
	}
	// The service never cancels anything itself.
	for _, r := range v.proxy.Requests() {
		if r.Path != sessionsPath {
			t.Errorf("unexpected Stripe call %s %s", r.Method, r.Path)
		}
	}
}

func TestCancelWithoutReturnURLUsesThePortalConfirmation(t *testing.T) {
	t.Parallel()
	v := newEnv(t, "", nil)
	expectStatus(t, v.post(appToken, cancelPath("u1", "sub_active"), ""), http.StatusSeeOther)
	r := v.proxy.Filter(http.MethodPost, sessionsPath)[0]
	for _, k := range []string{"return_url", "flow_data[after_completion][type]", "flow_data[after_completion][redirect][return_url]"} {
		if r.Form.Has(k) {
			t.Errorf("%s sent without a configured return URL", k)
		}
	}
	expectForm(t, r, map[string]string{"flow_data[type]": "subscription_cancel", "flow_data[subscription_cancel][subscription]": "sub_active"})
}

func TestCancelRefusals(t *testing.T) {
	t.Parallel()
	v := newEnv(t, defaultURL, nil)
	for _, tc := range []struct {
		name, user, sub, token string
		status                 int
		code                   string
	}{
		{"another user's subscription", "u1", "sub_of_u2", appToken, http.StatusNotFound, "not_found"},
		{"unknown subscription", "u1", "sub_nope", appToken, http.StatusNotFound, "not_found"},
		{"already canceled", "u1", "sub_canceled", appToken, http.StatusConflict, "subscription_already_canceled"},
		{"incomplete_expired", "u1", "sub_expired", appToken, http.StatusConflict, "subscription_already_canceled"},
		{"unknown user", "nobody", "sub_active", appToken, http.StatusNotFound, "customer_not_found"},
		{"user whose link is unfinished", "halfway", "sub_active", appToken, http.StatusNotFound, "customer_not_found"},
		{"invalid subscription id", "u1", "sub.1", appToken, http.StatusBadRequest, "invalid_subscription_id"},
		{"invalid user id", "u%201", "sub_active", appToken, http.StatusBadRequest, "invalid_user_id"},
		{"no token", "u1", "sub_active", "", http.StatusUnauthorized, "unauthorized"},
		{"admin token", "u1", "sub_active", adminToken, http.StatusForbidden, "forbidden"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := v.post(tc.token, cancelPath(tc.user, tc.sub), "")
			expectError(t, rec, tc.status, tc.code)
			if rec.Header().Get("Location") != "" {
				t.Errorf("refusal with a Location")
			}
		})
	}
	if n := len(v.proxy.Requests()); n != 0 {
		t.Errorf("refusals called Stripe %d times", n)
	}
}

func TestCancelFailures(t *testing.T) {
	t.Parallel()
	t.Run("subscription lookup fails", func(t *testing.T) {
		t.Parallel()
		v := newEnv(t, defaultURL, failingSubscriptions{})
		expectError(t, v.post(appToken, cancelPath("u1", "sub_active"), ""), http.StatusInternalServerError, "internal_error")
	})
	t.Run("Stripe unavailable", func(t *testing.T) {
		t.Parallel()
		v := newEnv(t, defaultURL, nil)
		v.proxy.InjectFault(http.MethodPost, sessionsPath, stripeemu.Fault500, 3)
		expectError(t, v.post(appToken, cancelPath("u1", "sub_active"), ""), http.StatusServiceUnavailable, "stripe_unavailable")
	})
}

func TestPortalSessions(t *testing.T) {
	t.Parallel()
	v := newEnv(t, defaultURL, nil)
	for _, tc := range []struct {
		name, body, wantReturn string
	}{
		{"no body: configured return URL", "", defaultURL},
		{"empty object", "{}", defaultURL},
		{"request return URL wins", `{"return_url":"https://app.example.com/account?tab=plan"}`, "https://app.example.com/account?tab=plan"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := v.post(appToken, "/v1/customers/u1/portal-sessions", tc.body)
			expectStatus(t, rec, http.StatusCreated)
			var got map[string]any
			if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
				t.Fatal(err)
			}
			made := v.proxy.Objects(sessionsPath)
			if url, _ := got["url"].(string); !strings.HasPrefix(url, "https://") || url != made[len(made)-1]["url"] {
				t.Errorf("answer %s", rec.Body)
			}
			reqs := v.proxy.Filter(http.MethodPost, sessionsPath)
			r := reqs[len(reqs)-1]
			expectForm(t, r, map[string]string{"customer": "cus_u1", "return_url": tc.wantReturn})
			if r.Form.Has("flow_data[type]") {
				t.Errorf("a plain portal session got a flow")
			}
		})
	}
	calls := len(v.proxy.Requests())
	for _, tc := range []struct {
		name, user, body, token string
		status                  int
		code                    string
	}{
		{"relative return URL", "u1", `{"return_url":"/account"}`, appToken, http.StatusBadRequest, "invalid_url"},
		{"javascript return URL", "u1", `{"return_url":"javascript:alert(1)"}`, appToken, http.StatusBadRequest, "invalid_url"},
		{"unknown field", "u1", `{"returnurl":"https://a.example"}`, appToken, http.StatusBadRequest, "invalid_json"},
		{"unknown user", "nobody", "", appToken, http.StatusNotFound, "customer_not_found"},
		{"invalid user id", "u.1", "", appToken, http.StatusBadRequest, "invalid_user_id"},
		{"wrong token", "u1", "", "nope", http.StatusUnauthorized, "unauthorized"},
		{"admin token", "u1", "", adminToken, http.StatusForbidden, "forbidden"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			expectError(t, v.post(tc.token, "/v1/customers/"+tc.user+"/portal-sessions", tc.body), tc.status, tc.code)
		})
	}
	if n := len(v.proxy.Requests()); n != calls {
		t.Errorf("refused requests called Stripe %d times", n-calls)
	}
}

func TestAnswers503WhenTheDatabaseIsDown(t *testing.T) {
	t.Parallel()
	v := newEnvOn(t, apitest.UnreachableDB(t), defaultURL, nil)
	expectError(t, v.post(appToken, "/v1/customers/u1/portal-sessions", ""), http.StatusServiceUnavailable, "database_unavailable")
	expectError(t, v.post(appToken, cancelPath("u1", "sub_active"), ""), http.StatusServiceUnavailable, "database_unavailable")
	if n := len(v.proxy.Requests()); n != 0 {
		t.Errorf("called Stripe %d times", n)
	}
}

// A service of one mode opens no portal for a user linked in the other: that user is unknown here.
func TestPortalRefusesACustomerOfTheOtherMode(t *testing.T) {
	t.Parallel()
	v := newEnv(t, defaultURL, nil)
	v.exec(`INSERT INTO customers (user_id, stripe_customer_id, email, livemode) VALUES ('u_live', 'cus_live', 'l@example.com', true)`)
	v.exec(`INSERT INTO subscriptions (subscription_id, stripe_customer_id, livemode, status) VALUES ('sub_live', 'cus_live', true, 'active')`)
	expectError(t, v.post(appToken, "/v1/customers/u_live/portal-sessions", ""), http.StatusNotFound, "customer_not_found")
	expectError(t, v.post(appToken, cancelPath("u_live", "sub_live"), ""), http.StatusNotFound, "customer_not_found")
	// A live row under a test customer's id is not that test customer's subscription.
	v.exec(`INSERT INTO subscriptions (subscription_id, stripe_customer_id, livemode, status) VALUES ('sub_live_u1', 'cus_u1', true, 'active')`)
	expectError(t, v.post(appToken, cancelPath("u1", "sub_live_u1"), ""), http.StatusNotFound, "not_found")
	if n := len(v.proxy.Requests()); n != 0 {
		t.Errorf("%d calls reached Stripe", n)
	}
}
