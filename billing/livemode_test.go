package billing

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"billing/internal/stripeevents"
	"billing/webhooks"
)

// Test and live are separate worlds: an event of one mode never reads or changes state of the
// other, and reads never show the other mode's rows.

// inMode returns ev as an event of the given mode (envelope and object).
func inMode(ev webhooks.Event, live bool) webhooks.Event {
	var obj map[string]any
	if err := json.Unmarshal(ev.Object, &obj); err != nil {
		panic(err)
	}
	obj["livemode"] = live
	ev.Object, _ = json.Marshal(obj)
	var env map[string]any
	if err := json.Unmarshal(ev.Payload, &env); err != nil {
		panic(err)
	}
	env["livemode"] = live
	env["data"] = map[string]any{"object": json.RawMessage(ev.Object)}
	ev.Payload, _ = json.Marshal(env)
	ev.Livemode = live
	return ev
}

// modeRow is everything an event could change about a subscription, for before/after checks.
func (e *env) modeRow(t *testing.T, id string) string {
	t.Helper()
	var row []map[string]any
	if err := e.db.Raw(`SELECT to_jsonb(s) - 'updated_at' AS r FROM subscriptions s WHERE subscription_id = $1`, id).Scan(&row).Error; err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(row)
	return string(b)
}

func assertMismatch(t *testing.T, err error, what string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: applied, want a livemode_mismatch failure", what)
	}
	if !webhooks.IsPermanent(err) {
		t.Fatalf("%s: %v is not permanent (it would be retried instead of dead-lettered)", what, err)
	}
	if !strings.Contains(err.Error(), "mode") {
		t.Fatalf("%s: %v does not say what is wrong", what, err)
	}
}

func TestEventOfTheOtherModeChangesNothing(t *testing.T) {
	t.Parallel()
	sub := subObj{ID: "sub_m", Customer: "cus_m", Status: StatusTrialing, Price: "price_m", TrialStart: 1, TrialEnd: 9 * 86400, PeriodEnd: 9 * 86400}
	inv := invObj{ID: "in_m", Customer: "cus_m", Subscription: "sub_m", AttemptCount: 1, AmountDue: 900, Currency: "usd", URL: "https://invoice.example/in_m", NextAttempt: 86400}
	// Every handled type, each a little newer than the state it meets, so that only the mode
	// can stop it.
	attacks := []webhooks.Event{
		created("x_created", 100, sub.with(StatusActive)),
		updated("x_updated", 100, sub.with(StatusCanceled)),
		deleted("x_deleted", 100, sub.with(StatusCanceled)),
		trialEv("x_trial", 100, sub),
		failed("x_failed", 100, inv),
		succeeded("x_succeeded", 100, inv),
		subEv("x_paused", EventSubscriptionPaused, 100, sub.with(StatusPaused)),
		subEv("x_resumed", EventSubscriptionResumed, 100, sub.with(StatusActive)),
		invEv("x_paid", EventInvoicePaid, 100, inv),
		invEv("x_action", EventInvoicePaymentActionRequired, 100, inv),
		invEv("x_voided", EventInvoiceVoided, 100, inv),
		invEv("x_finalized", EventInvoiceFinalized, 100, inv),
		invEv("x_inv_updated", EventInvoiceUpdated, 100, inv),
		invEv("x_uncollectible", EventInvoiceMarkedUncollectible, 100, inv),
	}
	if got, want := len(attacks), len(newRegistryTypes(t)); got != want {
		t.Fatalf("the table covers %d event types, the service handles %d", got, want)
	}
	for _, storedLive := range []bool{false, true} {
		for _, attack := range attacks {
			name := "test_row_live_event"
			if storedLive {
				name = "live_row_test_event"
			}
			t.Run(name+"/"+attack.Type, func(t *testing.T) {
				t.Parallel()
				e := newEnv(t)
				if err := e.db.Exec(`INSERT INTO customers (user_id, stripe_customer_id, email, livemode) VALUES ($1, $2, $3, $4)`, "u_m", "cus_m", "m@example.com", storedLive).Error; err != nil {
					t.Fatal(err)
				}
				e.mustHandle(t, inMode(created("own_created", 1, sub), storedLive), inMode(failed("own_failed", 2, inv), storedLive))
				before := e.modeRow(t, "sub_m")
				invBefore := e.invoiceRow(t, "in_m")
				entBefore := e.entitlement(t, "u_m")

				assertMismatch(t, e.handle(t, inMode(attack, !storedLive)), attack.Type)

				if after := e.modeRow(t, "sub_m"); after != before {
					t.Errorf("row changed:\nbefore %s\nafter  %s", before, after)
				}
				if after := e.invoiceRow(t, "in_m"); after != invBefore {
					t.Errorf("invoice changed:\nbefore %s\nafter  %s", invBefore, after)
				}
				if entAfter := e.entitlement(t, "u_m"); entAfter != entBefore {
					t.Errorf("entitlement changed: %s → %s", entBefore, entAfter)
				}
				if rows, jobs := e.totalNotices(t); rows != 1 || jobs != 1 {
					t.Errorf("notices: %d rows, %d jobs; want only the own failure's", rows, jobs)
				}
			})
		}
	}
}

// A new subscription of the other mode naming a linked customer is refused too: it would attach
// to that customer's user.
func TestNewSubscriptionNamingACustomerOfTheOtherMode(t *testing.T) {
	t.Parallel()
	for _, customerLive := range []bool{false, true} {
		e := newEnv(t)
		if err := e.db.Exec(`INSERT INTO customers (user_id, stripe_customer_id, email, livemode) VALUES ($1, $2, $3, $4)`, "u_c", "cus_c", "c@example.com", customerLive).Error; err != nil {
			t.Fatal(err)
		}
		ent := e.entitlement(t, "u_c")
		s := subObj{ID: "sub_new", Customer: "cus_c", Status: StatusActive, Price: "price_x", PeriodEnd: 30 * 86400}
		assertMismatch(t, e.handle(t, inMode(created("evt_new", 1, s), !customerLive)), "created")
		assertMismatch(t, e.handle(t, inMode(failed("evt_inv", 2, invObj{ID: "in_x", Customer: "cus_c", Subscription: "sub_other"}), !customerLive)), "payment_failed")
		if n := e.countSubs(t); n != 0 {
			t.Errorf("customer live=%v: %d subscription rows made by the other mode", customerLive, n)
		}
		if got := e.entitlement(t, "u_c"); got != ent {
			t.Errorf("customer live=%v: entitlement changed: %s → %s", customerLive, ent, got)
		}
	}
}

// Rows of the other mode that share a customer id (written before the checks existed, or by
// hand) never reach the entitlement, the customer view or the holds' user.
func TestReadsShowOnlyTheCustomersOwnMode(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.link(t, "u_r", "cus_r", "r@example.com") // a test-mode customer
	err := e.db.Exec(`INSERT INTO subscriptions (subscription_id, stripe_customer_id, livemode, status, price_id, payment_hold, payment_hold_since, inv_event_created)
		VALUES ('sub_live', 'cus_r', true, 'past_due', 'price_live', true, now(), now())`).Error
	if err != nil {
		t.Fatal(err)
	}
	if got := e.entitlement(t, "u_r"); !strings.Contains(got, `"entitled":false`) || !strings.Contains(got, `"status":"none"`) || strings.Contains(got, "sub_live") {
		t.Errorf("entitlement shows the live row: %s", got)
	}
	if view, err := e.svc.Customer(context.Background(), "u_r"); err != nil || len(view.Subscriptions) != 0 {
		t.Errorf("customer view: %+v, %v", view, err)
	}
	holds, err := e.svc.Holds(context.Background())
	if err != nil || len(holds) != 1 {
		t.Fatalf("holds: %+v %v", holds, err)
	}
	if h := holds[0]; h.UserID != nil || !h.Livemode {
		t.Errorf("the live hold is attributed to the test user: %+v", h)
	}
}

// Through the real inbox: the other mode's event is acknowledged, then dead-lettered with the
// reason livemode_mismatch, and the state is untouched.
func TestOtherModeEventIsDeadLetteredThroughTheInbox(t *testing.T) {
	t.Parallel()
	p := newWebhookPath(t)
	if err := p.db.Exec(`INSERT INTO customers (user_id, stripe_customer_id, email, livemode) VALUES ('u_l', 'cus_l', 'l@example.com', true)`).Error; err != nil {
		t.Fatal(err)
	}
	t0 := time.Now().UTC().Truncate(time.Second).Add(-time.Hour)
	sub := stripeevents.Subscription{ID: "sub_l", Customer: "cus_l", Status: StatusActive, PriceID: "price_l",
		CurrentPeriodStart: t0, CurrentPeriodEnd: t0.AddDate(0, 1, 0)}
	if got := p.deliverMode(stripeevents.SubscriptionEvent("evt_l1", EventSubscriptionCreated, t0, true, sub), true); got != "received" {
		t.Fatalf("live delivery: %q", got)
	}
	p.processed("evt_l1")
	var before Entitlement
	p.get("/v1/customers/u_l/entitlement", &before)
	if !before.Entitled {
		t.Fatalf("the live subscription does not entitle its user: %+v", before)
	}

	sub.Status = StatusCanceled
	if got := p.deliverMode(stripeevents.SubscriptionEvent("evt_t1", EventSubscriptionDeleted, t0.Add(time.Minute), false, sub), false); got != "received" {
		t.Fatalf("test delivery: %q", got)
	}
	p.waitFor("dead letter", `SELECT count(*) FROM webhook_dead_letters WHERE event_id = 'evt_t1'`, 1)
	var reason string
	if err := p.db.Raw(`SELECT failure_reason FROM webhook_events WHERE event_id = 'evt_t1' AND status = 'failed'`).Scan(&reason).Error; err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(reason, webhooks.FailureLivemodeMismatch+": ") {
		t.Errorf("failure_reason %q, want it to start with %s", reason, webhooks.FailureLivemodeMismatch)
	}
	var after Entitlement
	p.get("/v1/customers/u_l/entitlement", &after)
	if !after.Entitled || after.Status != StatusActive {
		t.Errorf("a test-mode event took the live entitlement away: %+v", after)
	}
}

// deliverMode posts payload signed with the secret of its mode.
func (p *webhookPath) deliverMode(payload []byte, live bool) string {
	p.t.Helper()
	secret := pathSecret
	if live {
		secret = pathLiveSecret
	}
	req := httptest.NewRequest(http.MethodPost, "/webhooks/stripe", strings.NewReader(string(payload)))
	req.Header.Set("Stripe-Signature", stripeevents.SignatureHeader(payload, secret, time.Now()))
	rec := httptest.NewRecorder()
	p.e.ServeHTTP(rec, req)
	var b struct{ Status string }
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &b) != nil {
		p.t.Fatalf("delivery answered %d %s", rec.Code, rec.Body)
	}
	return b.Status
}

// entitlement is the user's entitlement answer as JSON text (comparable).
func (e *env) entitlement(t *testing.T, userID string) string {
	t.Helper()
	ent, err := e.svc.Entitlement(context.Background(), userID)
	if err != nil && !errors.Is(err, ErrNoCustomer) {
		t.Fatalf("entitlement of %s: %v", userID, err)
	}
	b, _ := json.Marshal(ent)
	return string(b)
}

func newRegistryTypes(t *testing.T) []string {
	t.Helper()
	reg := webhooks.NewRegistry()
	(&Service{}).Register(reg)
	return reg.Types()
}
