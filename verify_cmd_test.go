package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"billing/appevents"
	"billing/billing"
	"billing/config"
	"billing/entitlements"
	"billing/internal/apitest"
	"billing/internal/database"
	"billing/internal/stripeevents"
	"billing/internal/testenv"
)

const verifySecret = "whsec_verify_0123456789abcdef0123456789"

// verifyLog is a small life of an account: subscriptions through their lifecycle, a payment
// hold and its lift, a customer deleted, a charge settled by its event.
func verifyLog(base time.Time) [][]byte {
	at := func(s int) time.Time { return base.Add(time.Duration(s) * time.Second) }
	period := func(s string, st string) stripeevents.Subscription {
		return stripeevents.Subscription{ID: s, Customer: "cus_" + s, Status: st, PriceID: "price_basic",
			CurrentPeriodStart: base, CurrentPeriodEnd: base.AddDate(0, 1, 0)}
	}
	inv := func(id, sub, st string, attempts int) stripeevents.Invoice {
		return stripeevents.Invoice{ID: id, Customer: "cus_" + sub, Subscription: sub, Status: st, AttemptCount: attempts,
			AmountDue: 2000, Currency: "usd", HostedInvoiceURL: "https://invoice.example/" + id}
	}
	canceled := period("sub_a", "canceled")
	canceled.CanceledAt, canceled.EndedAt = at(40), at(40)
	trial := period("sub_b", "trialing")
	trial.TrialStart, trial.TrialEnd = base, base.AddDate(0, 0, 14)
	return [][]byte{
		stripeevents.SubscriptionEvent("evt_a1", evCreated, at(0), false, period("sub_a", "incomplete")),
		stripeevents.Event("evt_a2", evUpdated, at(10), false, mustObject(period("sub_a", "active")), map[string]any{"status": "incomplete"}),
		stripeevents.InvoiceEvent("evt_a3", evPayFailed, at(20), false, inv("in_a1", "sub_a", "open", 1)),
		stripeevents.InvoiceEvent("evt_a4", evPaySucceeded, at(30), false, inv("in_a1", "sub_a", "paid", 2)),
		stripeevents.SubscriptionEvent("evt_a5", evDeleted, at(40), false, canceled),
		stripeevents.SubscriptionEvent("evt_b1", evCreated, at(0), false, trial),
		stripeevents.SubscriptionEvent("evt_b2", evTrialWillEnd, at(5), false, trial),
		stripeevents.SubscriptionEvent("evt_c1", evCreated, at(0), false, period("sub_c", "active")),
		stripeevents.InvoiceEvent("evt_c2", evPayFailed, at(15), false, inv("in_c1", "sub_c", "open", 1)),
		stripeevents.Event("evt_d1", "customer.deleted", at(25), false, map[string]any{"id": "cus_d", "object": "customer"}, nil),
		stripeevents.Event("evt_p1", "payment_intent.succeeded", at(35), false, map[string]any{
			"id": "pi_order1", "object": "payment_intent", "status": "succeeded", "customer": "cus_d",
			"metadata": map[string]any{"order_id": "order1"}}, nil),
	}
}

const (
	evCreated      = "customer.subscription.created"
	evUpdated      = "customer.subscription.updated"
	evDeleted      = "customer.subscription.deleted"
	evTrialWillEnd = "customer.subscription.trial_will_end"
	evPayFailed    = "invoice.payment_failed"
	evPaySucceeded = "invoice.payment_succeeded"
)

// mustObject is the data.object of a subscription event.
func mustObject(s stripeevents.Subscription) map[string]any {
	var ev struct {
		Data struct {
			Object map[string]any `json:"object"`
		} `json:"data"`
	}
	if err := json.Unmarshal(stripeevents.SubscriptionEvent("x", evUpdated, time.Now(), false, s), &ev); err != nil {
		panic(err)
	}
	return ev.Data.Object
}

// verifyService is a service on its own database with the log of verifyLog delivered shuffled
// (with duplicates), the API's own rows (a customer link, a charge that POST answered pending
// authentication) made first, as the API would make them.
func verifyService(t *testing.T) (*gorm.DB, func(args ...string) (int, string)) {
	t.Helper()
	log := verifyLog(time.Now().UTC().Add(-time.Hour).Truncate(time.Second))
	log = append(log, log[1], log[3], log[8]) // Stripe's retries
	rand.Shuffle(len(log), func(i, j int) { log[i], log[j] = log[j], log[i] })
	return verifyServiceWith(t, log)
}

// verifyServiceWith is verifyService with the deliveries given, in their order.
func verifyServiceWith(t *testing.T, log [][]byte) (*gorm.DB, func(args ...string) (int, string)) {
	t.Helper()
	url := testenv.DatabaseURL(t)
	for k, v := range map[string]string{
		"BILLING_CONFIG":                      "",
		"BILLING_DATABASE_URL":                url,
		"BILLING_STRIPE_MODE":                 "test",
		"BILLING_STRIPE_SECRET_KEY":           "sk_test_verify",
		"BILLING_STRIPE_API_URL":              testenv.StripeMockURL(t),
		"BILLING_STRIPE_WEBHOOK_SECRETS_TEST": verifySecret,
		"BILLING_LOG_LEVEL":                   "error",
	} {
		t.Setenv(k, v)
	}
	cfg, err := config.Load("")
	if err != nil {
		t.Fatal(err)
	}
	db, err := database.Open(context.Background(), url, apitest.Logger(t, slog.LevelWarn))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = database.SQL(db).Close() })
	a, err := newApp(appOptions{Config: cfg, DB: db, Logger: apitest.Logger(t, slog.LevelWarn)})
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`INSERT INTO customers (user_id, stripe_customer_id, email, livemode) VALUES ('u_d', 'cus_d', 'd@example.com', false)`,
		`INSERT INTO charges (order_id, user_id, stripe_customer_id, amount, currency, request_hash, idempotency_key, livemode,
		   state, status, payment_intent_id, answer, attempts, completed_at)
		 VALUES ('order1', 'u_d', 'cus_d', 500, 'usd', 'h', 'charge-order1', false, 'completed', 'requires_action', 'pi_order1',
		   '{"body": {"order_id": "order1", "status": "requires_action", "payment_intent_id": "pi_order1"}}', 1, now())`,
	} {
		if err := db.Exec(q).Error; err != nil {
			t.Fatal(err)
		}
	}
	for _, payload := range log {
		rec := apitest.DeliverWebhook(t, a.Echo, verifySecret, payload)
		if rec.Code != http.StatusOK {
			t.Fatalf("deliver: %d %s", rec.Code, rec.Body)
		}
	}
	var pending int64
	if err := db.Raw(`SELECT count(*) FROM webhook_events WHERE status <> 'processed' AND livemode = false`).Scan(&pending).Error; err != nil {
		t.Fatal(err)
	}
	if pending != 0 {
		t.Fatalf("%d events not processed inline", pending)
	}
	return db, func(args ...string) (int, string) {
		t.Helper()
		var out, errOut bytes.Buffer
		code := runVerifyCommand(context.Background(), args, &out, &errOut)
		t.Logf("billing verify %s: exit %d\nstdout: %sstderr: %s", strings.Join(args, " "), code, out.String(), errOut.String())
		return code, out.String()
	}
}

// The when-it-began columns follow the order in which events were applied, not their own: an
// older event of another status that arrives last does not split the stint it falls in. Verify
// replays the log in that order, so a rebuild agrees with what was applied (a replay in the
// events' own order would start the stint at the newest event).
func TestVerifyReplaysTheLogInItsOrder(t *testing.T) {
	base := time.Now().UTC().Add(-time.Hour).Truncate(time.Second)
	sub := func(id string, at time.Duration, status string) []byte {
		return stripeevents.SubscriptionEvent(id, "customer.subscription.updated", base.Add(at), false, stripeevents.Subscription{
			ID: "sub_order", Customer: "cus_order", Status: status, PriceID: "price_pro",
			CurrentPeriodStart: base, CurrentPeriodEnd: base.AddDate(0, 1, 0)})
	}
	// Applied in this order: active at 10 s, active at 30 s, then past_due at 20 s, late.
	db, run := verifyServiceWith(t, [][]byte{sub("evt_o1", 10*time.Second, "active"), sub("evt_o3", 30*time.Second, "active"),
		sub("evt_o2", 20*time.Second, "past_due")})
	var since time.Time
	if err := db.Raw(`SELECT status_since FROM subscriptions WHERE subscription_id = 'sub_order' AND livemode = false`).Scan(&since).Error; err != nil {
		t.Fatal(err)
	}
	if !since.Equal(base.Add(10 * time.Second)) {
		t.Fatalf("live status_since %s, want the first event's %s: the scenario needs the late event not to split the stint", since, base.Add(10*time.Second))
	}
	if code, out := run(); code != 0 || !strings.Contains(out, " differences=0 history=0 ") {
		t.Errorf("verify after a late older event: exit %d, stdout %q", code, out)
	}
}

// billing verify finds the live tables equal to the log's replay after a shuffled delivery and
// a read of Stripe, and names each field edited by hand afterwards.
func TestVerifyCommand(t *testing.T) {
	db, run := verifyService(t)
	if code, out := run(); code != 0 || !strings.Contains(out, "differences=0 history=0 unverifiable=0 replay_errors=0 ") ||
		!strings.HasPrefix(out, "verify: events=11 reads=0 ") || !strings.HasSuffix(out, " untold=0 untold_due=0 sequence_gaps=0\n") {
		t.Fatalf("after the deliveries: exit %d, stdout %q", code, out)
	}
	// What the log's replay made is what was applied: the state is the lifecycle's.
	var status, hold string
	if err := db.Raw(`SELECT status || '/' || payment_hold::text FROM subscriptions WHERE subscription_id = 'sub_a' AND livemode = false`).Scan(&status).Error; err != nil || status != "canceled/false" {
		t.Fatalf("sub_a: %q %v", status, err)
	}
	if err := db.Raw(`SELECT payment_hold::text FROM subscriptions WHERE subscription_id = 'sub_c' AND livemode = false`).Scan(&hold).Error; err != nil || hold != "true" {
		t.Fatalf("sub_c hold: %q %v", hold, err)
	}

	// A read of Stripe applied as a snapshot (reconcile's repair) is kept and replayed too.
	subs := billing.New(billing.Deps{DB: db})
	subs.SetTeller(entitlements.New(entitlements.Deps{DB: db, Billing: subs, AppEvents: appevents.NewTeller(nil)}))
	obj, _ := json.Marshal(mustObject(stripeevents.Subscription{ID: "sub_c", Customer: "cus_sub_c", Status: "past_due", PriceID: "price_pro",
		CurrentPeriodStart: time.Now().Add(-time.Hour), CurrentPeriodEnd: time.Now().AddDate(0, 1, 0)}))
	err := db.Transaction(func(tx *gorm.DB) error {
		_, err := subs.ApplySnapshot(context.Background(), tx, billing.Snapshot{Subscription: obj, FetchedAt: time.Now(), Source: "reconcile:run_verify"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if code, out := run(); code != 0 || !strings.Contains(out, "reads=1 ") || !strings.Contains(out, "differences=0 ") {
		t.Fatalf("after a read: exit %d, stdout %q", code, out)
	}

	// Hand edits: a field of each group, a settled charge, a lost invoice row.
	for _, q := range []string{
		`UPDATE subscriptions SET status = 'active' WHERE subscription_id = 'sub_a' AND livemode = false`,
		`UPDATE subscriptions SET payment_hold = false WHERE subscription_id = 'sub_c' AND livemode = false`,
		`UPDATE charges SET status = 'canceled' WHERE order_id = 'order1' AND livemode = false`,
		`UPDATE customers SET deleted_at = NULL WHERE user_id = 'u_d' AND livemode = false`,
		`DELETE FROM invoices WHERE invoice_id = 'in_a1' AND livemode = false`,
	} {
		if err := db.Exec(q).Error; err != nil {
			t.Fatal(err)
		}
	}
	code, out := run()
	for _, want := range []string{
		`subscriptions sub_a status: live="active" log="canceled"` + "\n",
		`subscriptions sub_c payment_hold: live="false" log="true"` + "\n",
		`charges order1 status: live="canceled" log="succeeded"` + "\n",
		`customers u_d deleted_at: live=NULL log="`,
		`invoices in_a1: only in the log's replay (no live row)` + "\n",
		"differences=5 ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q", want)
		}
	}
	if code != 1 {
		t.Errorf("exit %d with differences, want 1", code)
	}

	// A when-it-began column is defined by the log's order, which the replay follows: edited by
	// hand, it is a difference like any other.
	if err := db.Exec(`UPDATE subscriptions SET status_since = status_since - interval '1 day' WHERE subscription_id = 'sub_b' AND livemode = false`).Error; err != nil {
		t.Fatal(err)
	}
	if code, out := run(); code != 1 || !strings.Contains(out, "subscriptions sub_b status_since: live=") ||
		!strings.Contains(out, " differences=6 history=0 ") {
		t.Errorf("a status_since edited: exit %d, stdout %q", code, out)
	}

	// A change the app was not told of (the answer told is not the answer now), and a lost event.
	var told int
	if err := db.Raw(`SELECT count(*) FROM app_events WHERE livemode = false`).Scan(&told).Error; err != nil || told == 0 {
		t.Fatalf("%d app events after the deliveries (%v)", told, err)
	}
	for _, q := range []string{
		`INSERT INTO app_event_answers (user_id, livemode, subject, answer) VALUES ('u_d', false, 'entitlement', '{"user_id": "u_d", "entitled": true}')
		 ON CONFLICT (user_id, livemode, subject) DO UPDATE SET answer = EXCLUDED.answer`,
		`DELETE FROM app_events WHERE livemode = false AND sequence = 1`,
	} {
		if err := db.Exec(q).Error; err != nil {
			t.Fatal(err)
		}
	}
	if code, out := run(); code != 1 || !strings.Contains(out, "entitlement changed with no event: told=") ||
		!strings.Contains(out, "the sequences have a gap") || !strings.Contains(out, " untold=1 untold_due=0 sequence_gaps=1") {
		t.Errorf("an untold change and a lost event: exit %d, stdout %q", code, out)
	}

	// The other mode has nothing of this mode's state.
	if code, out := run("--mode", "live"); code != 0 || !strings.HasPrefix(out, "verify: events=0 reads=0 rows=0 differences=0") {
		t.Errorf("--mode live: exit %d, stdout %q", code, out)
	}
	if code, _ := run("--mode", "staging"); code != 2 {
		t.Errorf("--mode staging: exit %d, want 2", code)
	}
}

// A row whose last writer is no longer in the log (retention pruned its event) is counted as
// unverifiable, not reported as a difference.
func TestVerifyUnverifiableAfterPruning(t *testing.T) {
	db, run := verifyService(t)
	if err := db.Exec(`DELETE FROM webhook_events WHERE event_id IN ('evt_c1', 'evt_c2') AND livemode = false`).Error; err != nil {
		t.Fatal(err)
	}
	code, out := run()
	if code != 0 || !strings.Contains(out, "differences=0 history=0 unverifiable=2 ") {
		t.Fatalf("exit %d, stdout %q", code, out)
	}
}
