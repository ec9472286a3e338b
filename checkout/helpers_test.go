package checkout

import (
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
	"github.com/riverqueue/river"
	"gorm.io/gorm"

	"billing/billing"
	"billing/catalog"
	"billing/customers"
	"billing/entitlements"
	"billing/internal/apitest"
	"billing/internal/jobs"
	"billing/internal/stripeclient"
	"billing/internal/stripeemu"
	"billing/internal/stripeevents"
	"billing/internal/testenv"
	"billing/migrations"
	"billing/webhooks"
)

const (
	appToken      = apitest.AppToken
	webhookSecret = "whsec_checkout_test"
	sessionsPath  = "/v1/checkout/sessions"
	successURL    = "https://app.example.com/welcome?session_id={CHECKOUT_SESSION_ID}"
	cancelURL     = "https://app.example.com/pricing"
)

func TestMain(m *testing.M) { testenv.MainWith(m, migrations.ApplyQuietly) }

// env is the service as main wires it, on the test's own database: the checkout endpoints, the
// webhook inbox with billing's and checkout's handlers, River running the inbox's and the
// subscription reads' jobs, and a Stripe of stripe-mock behind the proxy, with the Checkout
// sessions and subscriptions kept by the test.
type env struct {
	t        *testing.T
	db       *gorm.DB
	proxy    *stripeemu.Proxy
	sessions *stripeemu.CheckoutSessions
	e        *echo.Echo
	svc      *Service
	billing  *billing.Service
	// clock is the service's; it starts at the real time, so that the sessions the double
	// stamps with the real time fall in the lookup's range.
	clock *testenv.Clock

	mu   sync.Mutex
	subs map[string]map[string]any
}

type envOpts struct {
	successURL, cancelURL string
	livemode              bool
	// stripeMock leaves /v1/checkout/sessions to stripe-mock (its schema checks the parameters).
	stripeMock bool
	// automaticTax is checkout.automatic_tax.
	automaticTax bool
}

func newEnv(t *testing.T, o envOpts) *env {
	t.Helper()
	v := &env{t: t, db: testenv.DB(t), clock: testenv.NewClock(time.Now()), subs: map[string]map[string]any{}}
	v.proxy = stripeemu.New(t, testenv.StripeMockURL(t))
	if !o.stripeMock {
		v.sessions = stripeemu.NewCheckoutSessions(v.proxy, o.livemode)
	}
	v.proxy.Handle("/v1/subscriptions", v.serveSubscription)

	sqlDB, err := v.db.DB()
	if err != nil {
		t.Fatal(err)
	}
	logger := apitest.Logger(t, slog.LevelWarn)
	registry := webhooks.NewRegistry()
	inbox := webhooks.New(webhooks.Config{
		DB: v.db, Logger: logger, Registry: registry, TestSecrets: []string{webhookSecret},
		LiveSecrets: []string{webhookSecret + "_live"}, Tolerance: 5 * time.Minute, MaxAttempts: 3,
		RetryDelay: time.Millisecond, Metrics: webhooks.NewMetrics(prometheus.NewRegistry()),
	})
	workers := river.NewWorkers()
	inbox.AddWorkers(workers)
	sync := NewSyncWorker()
	river.AddWorker(workers, sync)
	rc, err := jobs.NewClient(sqlDB, jobs.ClientOptions{
		Workers: workers, Queues: map[string]int{river.QueueDefault: 4, webhooks.QueueWebhooks: 4},
		PollInterval: 10 * time.Millisecond, Logger: logger, TestOnly: true,
	})
	if err != nil {
		t.Fatalf("river client: %v", err)
	}
	inbox.SetJobs(rc)

	sc := stripeclient.New(v.proxy.URL, "sk_test_checkout", logger)
	v.billing = billing.New(billing.Deps{DB: v.db, Jobs: rc, Logger: logger})
	ents := entitlements.New(entitlements.Deps{DB: v.db, Billing: v.billing, Jobs: rc, Logger: logger,
		Policy: entitlements.Policy{PastDueEntitled: true}})
	v.billing.SetTeller(ents)
	v.billing.Register(registry)
	ents.Register(registry)
	cust := customers.NewHandlers(customers.Deps{DB: v.db, Accounts: ents, Stripe: sc, Livemode: o.livemode, Logger: logger, Now: v.clock.Now})
	v.svc = New(Deps{
		DB: v.db, Stripe: sc, Customers: cust, Billing: v.billing, Entitlements: ents, Jobs: rc, Livemode: o.livemode,
		SuccessURL: o.successURL, CancelURL: o.cancelURL, Logger: logger, Now: v.clock.Now,
		Prices: catalog.New(catalog.Deps{DB: v.db, Livemode: o.livemode}), AutomaticTax: o.automaticTax,
	})
	v.svc.Register(registry)
	sync.Bind(v.svc)

	v.e = apitest.Server(logger, func(g *echo.Group) {
		v.svc.Mount(g)
		v.billing.MountAPI(g)
		ents.MountAPI(g)
	})
	inbox.MountWebhook(v.e)

	ctx, cancel := context.WithCancel(context.Background())
	if err := rc.Start(ctx); err != nil {
		t.Fatalf("start river: %v", err)
	}
	t.Cleanup(func() {
		stopCtx, stop := context.WithTimeout(context.Background(), 10*time.Second)
		defer stop()
		_ = rc.Stop(stopCtx)
		cancel()
	})
	return v
}

// defaultEnv has both default URLs configured.
func defaultEnv(t *testing.T) *env {
	return newEnv(t, envOpts{successURL: successURL, cancelURL: cancelURL})
}

func (v *env) exec(sql string, args ...any) { v.t.Helper(); testenv.Exec(v.t, v.db, sql, args...) }

// link links a user to a Stripe customer of the given mode.
func (v *env) link(userID, customerID string, livemode bool) {
	v.t.Helper()
	testenv.LinkCustomer(v.t, v.db, userID, customerID, userID+"@example.com", livemode)
}

func (v *env) post(path string, body any) *httptest.ResponseRecorder {
	v.t.Helper()
	return apitest.Do(v.t, v.e, appToken, http.MethodPost, path, body)
}

func (v *env) get(path string) *httptest.ResponseRecorder {
	v.t.Helper()
	return apitest.Do(v.t, v.e, appToken, http.MethodGet, path, nil)
}

func checkoutPath(userID string) string { return "/v1/customers/" + userID + "/checkout-sessions" }

// open asks for a session and expects a 201.
func (v *env) open(userID string, body map[string]any) map[string]any {
	v.t.Helper()
	rec := v.post(checkoutPath(userID), body)
	apitest.ExpectStatus(v.t, rec, http.StatusCreated)
	return apitest.Decode(v.t, rec)
}

// putSubscription makes Stripe hold a subscription (the object of API version 2024-06-20).
func (v *env) putSubscription(s stripeevents.Subscription) {
	v.t.Helper()
	var ev struct {
		Data struct {
			Object map[string]any `json:"object"`
		} `json:"data"`
	}
	if err := json.Unmarshal(stripeevents.SubscriptionEvent("evt_x", "customer.subscription.updated", time.Now(), false, s), &ev); err != nil {
		v.t.Fatal(err)
	}
	ev.Data.Object["latest_invoice"] = nil
	v.mu.Lock()
	defer v.mu.Unlock()
	v.subs[s.ID] = ev.Data.Object
}

func (v *env) serveSubscription(r stripeemu.Request) stripeemu.Answer {
	id := strings.TrimPrefix(r.Path, "/v1/subscriptions/")
	v.mu.Lock()
	defer v.mu.Unlock()
	if s := v.subs[id]; s != nil && r.Method == http.MethodGet {
		return stripeemu.Answer{Status: http.StatusOK, Body: s}
	}
	return stripeemu.Answer{Status: http.StatusNotFound, Body: map[string]any{"error": map[string]any{
		"type": "invalid_request_error", "code": "resource_missing", "message": "No such subscription: '" + id + "'"}}}
}

// deliver posts a signed test-mode event to the webhook endpoint and expects it stored.
func (v *env) deliver(payload []byte) { v.t.Helper(); v.deliverSigned(payload, webhookSecret) }

// deliverLive posts a live-mode event, signed with the live secret.
func (v *env) deliverLive(payload []byte) {
	v.t.Helper()
	v.deliverSigned(payload, webhookSecret+"_live")
}

func (v *env) deliverSigned(payload []byte, secret string) {
	v.t.Helper()
	rec := apitest.DeliverWebhook(v.t, v.e, secret, payload)
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"received"`) {
		v.t.Fatalf("delivery answered %d %s", rec.Code, rec.Body)
	}
}

// sessionEvent is a checkout.session.* event carrying the session as Stripe holds it.
func sessionEvent(id, typ string, created time.Time, session map[string]any) []byte {
	return stripeevents.Event(id, typ, created, false, session, nil)
}

// waitFor polls query (a count) until it is want.
func (v *env) waitFor(what, query string, want int, args ...any) {
	v.t.Helper()
	apitest.WaitForCount(v.t, v.db, what, query, want, args...)
}

func (v *env) processed(ids ...string) {
	v.t.Helper()
	apitest.WaitProcessed(v.t, v.db, ids...)
}

// synced waits until n subscription reads of a session have finished.
func (v *env) synced(sessionID string, n int) {
	v.t.Helper()
	v.waitFor("finished subscription reads", `SELECT count(*) FROM river_job WHERE kind = $1 AND args->>'session_id' = $2 AND state = 'completed'`,
		n, SyncJobKind, sessionID)
}

func (v *env) entitlement(userID string) entitlements.Entitlement {
	v.t.Helper()
	rec := v.get("/v1/customers/" + userID + "/entitlement")
	apitest.ExpectStatus(v.t, rec, http.StatusOK)
	var e entitlements.Entitlement
	if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil {
		v.t.Fatal(err)
	}
	return e
}

func (v *env) row(userID, requestID string) sessionRow {
	v.t.Helper()
	var r sessionRow
	if err := v.db.Raw(`SELECT * FROM checkout_sessions WHERE user_id = $1 AND request_id = $2`, userID, requestID).Scan(&r).Error; err != nil {
		v.t.Fatal(err)
	}
	return r
}

// activeSub is an active subscription of a customer, renewing in a month.
func activeSub(id, customer string) stripeevents.Subscription {
	now := time.Now().UTC().Truncate(time.Second)
	return stripeevents.Subscription{ID: id, Customer: customer, Status: "active", PriceID: "price_pro",
		CurrentPeriodStart: now.Add(-time.Minute), CurrentPeriodEnd: now.AddDate(0, 1, 0)}
}

func expectForm(t *testing.T, r stripeemu.Request, want map[string]string) {
	t.Helper()
	for k, w := range want {
		if got := r.Form.Get(k); got != w {
			t.Errorf("form %s = %q, want %q", k, got, w)
		}
	}
}

var (
	expectStatus = apitest.ExpectStatus
	expectError  = apitest.ExpectError
	decode       = apitest.Decode
)
