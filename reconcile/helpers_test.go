package reconcile

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverdatabasesql"
	"github.com/stripe/stripe-go/v79"
	"gorm.io/gorm"

	"billing/billing"
	"billing/entitlements"
	"billing/internal/stripeclient"
	"billing/internal/stripeemu"
	"billing/internal/testenv"
	"billing/migrations"
	"billing/webhooks"
)

func TestMain(m *testing.M) { testenv.MainWith(m, migrations.ApplyQuietly) }

// testLimits keep the tests fast: no rate limit to speak of, short backoffs. The sleeps are
// recorded (env.sleeps), not slept.
var testLimits = Limits{ReadsPerSecond: 10000, Burst: 10000, MaxAttempts: 5, BaseDelay: time.Millisecond,
	MaxDelay: 8 * time.Millisecond, MaxRetryAfter: time.Minute}

type env struct {
	t     testing.TB
	db    *gorm.DB
	proxy *stripeemu.Proxy
	acct  *stripeemu.Account
	subs  *billing.Service
	ents  *entitlements.Service
	jobs  *river.Client[*sql.Tx]
	reg   *webhooks.Registry
	rec   *Service
	prom  *prometheus.Registry

	mu     sync.Mutex
	sleeps []time.Duration
}

type envOpt func(*Deps)

func withLimits(l Limits) envOpt { return func(d *Deps) { d.Limits = l } }

// newEnv gives a test its own migrated database, the billing service on it, a programmable
// test-mode Stripe account behind the proxy, and a reconciler of test mode.
func newEnv(t testing.TB, opts ...envOpt) *env {
	t.Helper()
	return newEnvOn(t, testenv.DB(t), opts...)
}

// newEnvOn is newEnv on the database db (one of testenv's).
func newEnvOn(t testing.TB, db *gorm.DB, opts ...envOpt) *env {
	t.Helper()
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	rc, err := river.NewClient(riverdatabasesql.New(sqlDB), &river.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, db: db, jobs: rc, reg: webhooks.NewRegistry(), prom: prometheus.NewRegistry()}
	e.subs = billing.New(billing.Deps{DB: db, Jobs: rc, Logger: slog.New(slog.DiscardHandler)})
	e.ents = entitlements.New(entitlements.Deps{DB: db, Billing: e.subs, Jobs: rc, Logger: slog.New(slog.DiscardHandler),
		Policy: entitlements.Policy{PastDueEntitled: true}})
	e.subs.SetTeller(e.ents)
	e.subs.Register(e.reg)
	e.ents.Register(e.reg)
	e.proxy = stripeemu.New(t, testenv.StripeMockURL(t))
	e.acct = stripeemu.NewAccount(e.proxy, false)
	e.rec = e.reconciler(opts...)
	return e
}

// reconciler builds another reconciler of test mode on the env's database and account (the
// first one registers the metrics).
func (e *env) reconciler(opts ...envOpt) *Service {
	d := Deps{
		DB:           e.db,
		Stripe:       stripeclient.New(e.proxy.URL, "sk_test_reconcile", slog.New(slog.DiscardHandler)),
		Billing:      e.subs,
		Entitlements: e.ents,
		Livemode:     false,
		Logger:       slog.New(slog.DiscardHandler),
		Limits:       testLimits,
		Sleep: func(ctx context.Context, d time.Duration) error {
			if d > 0 {
				e.mu.Lock()
				e.sleeps = append(e.sleeps, d)
				e.mu.Unlock()
			}
			return ctx.Err()
		},
	}
	if e.rec == nil {
		d.Registerer = e.prom
	}
	for _, o := range opts {
		o(&d)
	}
	s := New(d)
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = s.Stop(ctx)
	})
	return s
}

func (e *env) recordedSleeps() []time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]time.Duration(nil), e.sleeps...)
}

// run runs a reconciliation and fails the test if it could not start.
func (e *env) run(dry bool) Summary {
	e.t.Helper()
	sum, err := e.rec.Run(context.Background(), RunOptions{DryRun: dry})
	if err != nil {
		e.t.Fatalf("run: %v", err)
	}
	return sum
}

func wantSummary(t *testing.T, got Summary, objects, drifted, repaired, missing, errors, exit int) {
	t.Helper()
	if got.Objects != objects || got.Drifted != drifted || got.Repaired != repaired || got.MissingAtStripe != missing ||
		got.Errors != errors || got.ExitCode() != exit {
		t.Fatalf("summary %q (exit %d, err %v), want objects=%d drifted=%d repaired=%d missing_at_stripe=%d errors=%d (exit %d)",
			got.Line(), got.ExitCode(), got.Err, objects, drifted, repaired, missing, errors, exit)
	}
}

// ago is a whole second in the past: events from before the run.
func ago(d time.Duration) time.Time { return time.Now().Add(-d).UTC().Truncate(time.Second) }

func newEventID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "evt_" + hex.EncodeToString(b[:])
}

// deliver applies an event through its handler in its own transaction, as the webhook worker does.
func (e *env) deliver(typ string, object json.RawMessage, created time.Time) {
	e.t.Helper()
	h, ok := e.reg.Lookup(typ)
	if !ok {
		e.t.Fatalf("no handler for %s", typ)
	}
	ev := webhooks.Event{ID: newEventID(), Type: typ, Livemode: false, Created: created, Object: object}
	if err := e.db.Transaction(func(tx *gorm.DB) error { return h.HandleEvent(context.Background(), tx, ev) }); err != nil {
		e.t.Fatalf("deliver %s: %v", typ, err)
	}
}

// deliverSub applies a customer.subscription.* event carrying the account's current object.
func (e *env) deliverSub(typ, id string, created time.Time) {
	e.t.Helper()
	e.deliver(typ, e.acct.Subscription(id), created)
}

// local returns the local row of a test-mode subscription (nil when unknown).
func (e *env) local(id string) *billing.Subscription {
	e.t.Helper()
	return e.localIn(id, false)
}

// localIn returns the local row of a subscription of the given world (nil when unknown).
func (e *env) localIn(id string, live bool) *billing.Subscription {
	e.t.Helper()
	s, err := e.subs.Subscription(context.Background(), id, live)
	if err != nil {
		e.t.Fatal(err)
	}
	return s
}

func (e *env) entitled(userID string) bool {
	e.t.Helper()
	ent, err := e.ents.Entitlement(context.Background(), userID)
	if err != nil {
		e.t.Fatalf("entitlement of %s: %v", userID, err)
	}
	return ent.Entitled
}

// linkUser links a user to a customer in test mode, as PUT /v1/customers does.
func (e *env) linkUser(userID, customerID string) {
	e.t.Helper()
	e.linkUserMode(userID, customerID, false)
}

func (e *env) linkUserMode(userID, customerID string, livemode bool) {
	e.t.Helper()
	testenv.LinkCustomer(e.t, e.db, userID, customerID, userID+"@example.com", livemode)
}

// driftRow is a recorded drift row.
type driftRow struct {
	SubscriptionID string  `gorm:"column:subscription_id"`
	Field          string  `gorm:"column:field"`
	Local          string  `gorm:"column:local"`
	Stripe         string  `gorm:"column:stripe"`
	Repaired       bool    `gorm:"column:repaired"`
	Reason         *string `gorm:"column:reason"`
}

func (e *env) drift(runID string) []driftRow {
	e.t.Helper()
	var rows []driftRow
	if err := e.db.Raw(`SELECT subscription_id, field, local, stripe, repaired, reason FROM reconcile_drift WHERE run_id = $1 ORDER BY id`, runID).
		Scan(&rows).Error; err != nil {
		e.t.Fatal(err)
	}
	return rows
}

// driftOf returns the fields recorded for a subscription in a run, with whether each was repaired.
func (e *env) driftOf(runID, subscriptionID string) map[string]bool {
	e.t.Helper()
	out := map[string]bool{}
	for _, r := range e.drift(runID) {
		if r.SubscriptionID == subscriptionID {
			out[r.Field] = r.Repaired
		}
	}
	return out
}

func (e *env) count(query string, args ...any) int {
	e.t.Helper()
	var n int64
	if err := e.db.Raw(query, args...).Scan(&n).Error; err != nil {
		e.t.Fatal(err)
	}
	return int(n)
}

// equalToStripe fails unless the local row says what the account says.
func (e *env) equalToStripe(id string) {
	e.t.Helper()
	params := &stripe.SubscriptionParams{}
	params.AddExpand("latest_invoice")
	sub, err := e.rec.stripe.Subscriptions.Get(id, params)
	if err != nil {
		e.t.Fatal(err)
	}
	if d := compare(e.local(id), sub); len(d) != 0 {
		e.t.Fatalf("subscription %s differs from Stripe: %+v", id, d)
	}
}

// period is a billing period around now.
func period() (start, end time.Time) {
	start = ago(24 * time.Hour)
	return start, start.AddDate(0, 1, 0)
}

// metricValue reads a counter or gauge.
func metricValue(t *testing.T, m prometheus.Metric) float64 {
	t.Helper()
	var out dto.Metric
	if err := m.Write(&out); err != nil {
		t.Fatal(err)
	}
	if c := out.GetCounter(); c != nil {
		return c.GetValue()
	}
	return out.GetGauge().GetValue()
}
