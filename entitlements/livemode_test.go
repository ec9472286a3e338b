package entitlements

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"billing/billing"
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

// modeRow is everything an event could change about a subscription of one world, for
// before/after checks.
func (e *env) modeRow(t *testing.T, id string, live bool) string {
	t.Helper()
	var row []map[string]any
	if err := e.db.Raw(`SELECT to_jsonb(s) - 'updated_at' AS r FROM subscriptions s WHERE subscription_id = $1 AND livemode = $2`, id, live).
		Scan(&row).Error; err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(row)
	return string(b)
}

// entitlementIn is the user's entitlement answer as a deployment of the given mode reads it.
func (e *env) entitlementIn(t *testing.T, userID string, live bool) string {
	t.Helper()
	svc := New(Deps{DB: e.db, Billing: e.subs, Livemode: live, Now: e.clock.Now, Policy: Policy{PastDueEntitled: true, PausedCollectionEntitled: true}})
	ent, err := svc.Entitlement(context.Background(), userID)
	if err != nil && !errors.Is(err, ErrNoCustomer) {
		t.Fatalf("entitlement of %s: %v", userID, err)
	}
	b, _ := json.Marshal(ent)
	return string(b)
}

// Every handled type, signed in the other mode and naming the very ids of this world's
// subscription, invoice and customer, is applied to the other world only: this world's rows,
// entitlement and notices are as they were.
func TestEventOfTheOtherModeChangesNothing(t *testing.T) {
	t.Parallel()
	sub := subObj{ID: "sub_m", Customer: "cus_m", Status: billing.StatusTrialing, Price: "price_m", TrialStart: 1, TrialEnd: 9 * 86400, PeriodEnd: 9 * 86400}
	inv := invObj{ID: "in_m", Customer: "cus_m", Subscription: "sub_m", AttemptCount: 1, AmountDue: 900, Currency: "usd", URL: "https://invoice.example/in_m", NextAttempt: 86400}
	// Every handled type, each a little newer than the state it meets, so that only the mode
	// can stop it.
	attacks := []webhooks.Event{
		created("x_created", 100, sub.With(billing.StatusActive)),
		updated("x_updated", 100, sub.With(billing.StatusCanceled)),
		deleted("x_deleted", 100, sub.With(billing.StatusCanceled)),
		trialEv("x_trial", 100, sub),
		failed("x_failed", 100, inv),
		succeeded("x_succeeded", 100, inv),
		subEv("x_paused", billing.EventSubscriptionPaused, 100, sub.With(billing.StatusPaused)),
		subEv("x_resumed", billing.EventSubscriptionResumed, 100, sub.With(billing.StatusActive)),
		invEv("x_paid", billing.EventInvoicePaid, 100, inv),
		invEv("x_action", billing.EventInvoicePaymentActionRequired, 100, inv),
		invEv("x_voided", billing.EventInvoiceVoided, 100, inv),
		invEv("x_finalized", billing.EventInvoiceFinalized, 100, inv),
		invEv("x_inv_updated", billing.EventInvoiceUpdated, 100, inv),
		invEv("x_uncollectible", billing.EventInvoiceMarkedUncollectible, 100, inv),
		summaryEv("x_features", 100, "cus_m", true, "feat_m"),
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
				before := e.modeRow(t, "sub_m", storedLive)
				invBefore := e.invoiceRowIn(t, "in_m", storedLive)
				entBefore := e.entitlementIn(t, "u_m", storedLive)

				if err := e.handle(t, inMode(attack, !storedLive)); err != nil {
					t.Fatalf("the other mode's event is not applied to its own world: %v", err)
				}

				if after := e.modeRow(t, "sub_m", storedLive); after != before {
					t.Errorf("row changed:\nbefore %s\nafter  %s", before, after)
				}
				if after := e.invoiceRowIn(t, "in_m", storedLive); after != invBefore {
					t.Errorf("invoice changed:\nbefore %s\nafter  %s", invBefore, after)
				}
				if entAfter := e.entitlementIn(t, "u_m", storedLive); entAfter != entBefore {
					t.Errorf("entitlement changed: %s → %s", entBefore, entAfter)
				}
				var features int64
				if err := e.db.Raw(`SELECT count(*) FROM customer_features WHERE livemode = $1`, storedLive).Scan(&features).Error; err != nil || features != 0 {
					t.Errorf("features of this world: %d rows (%v); want none", features, err)
				}
				var mine int64
				if err := e.db.Raw(`SELECT count(*) FROM notices WHERE livemode = $1`, storedLive).Scan(&mine).Error; err != nil || mine != 1 {
					t.Errorf("notices of this world: %d (%v); want only the own failure's", mine, err)
				}
			})
		}
	}
}

// A new subscription of the other mode naming a linked customer's id attaches to nobody: the
// link is of this world, the subscription of the other, and no answer of either mode shows it
// as the user's.
func TestNewSubscriptionNamingACustomerOfTheOtherMode(t *testing.T) {
	t.Parallel()
	for _, customerLive := range []bool{false, true} {
		e := newEnv(t)
		if err := e.db.Exec(`INSERT INTO customers (user_id, stripe_customer_id, email, livemode) VALUES ($1, $2, $3, $4)`, "u_c", "cus_c", "c@example.com", customerLive).Error; err != nil {
			t.Fatal(err)
		}
		own, other := e.entitlementIn(t, "u_c", customerLive), e.entitlementIn(t, "u_c", !customerLive)
		s := subObj{ID: "sub_new", Customer: "cus_c", Status: billing.StatusActive, Price: "price_x", PeriodEnd: 30 * 86400}
		e.mustHandle(t, inMode(created("evt_new", 1, s), !customerLive),
			inMode(failed("evt_inv", 2, invObj{ID: "in_x", Customer: "cus_c", Subscription: "sub_other"}), !customerLive))
		var n int64
		if err := e.db.Raw(`SELECT count(*) FROM subscriptions WHERE livemode = $1`, customerLive).Scan(&n).Error; err != nil || n != 0 {
			t.Errorf("customer live=%v: %d subscription rows in the customer's world (%v)", customerLive, n, err)
		}
		if got := e.entitlementIn(t, "u_c", customerLive); got != own || !strings.Contains(got, `"entitled":false`) {
			t.Errorf("customer live=%v: entitlement changed: %s → %s", customerLive, own, got)
		}
		if got := e.entitlementIn(t, "u_c", !customerLive); got != other {
			t.Errorf("customer live=%v: the other world's answer changed: %s → %s", customerLive, other, got)
		}
	}
}

// Rows of the other mode that share a customer id never reach the entitlement, the customer
// view or the holds' user.
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
	// A live deployment does not know the test-mode link at all.
	if got := e.entitlementIn(t, "u_r", true); got != "null" {
		t.Errorf("a live deployment answers for a test-mode link: %s", got)
	}
	holds, err := e.subs.Holds(context.Background())
	if err != nil || len(holds) != 1 {
		t.Fatalf("holds: %+v %v", holds, err)
	}
	if h := holds[0]; h.UserID != nil || !h.Livemode {
		t.Errorf("the live hold is attributed to the test user: %+v", h)
	}
}

// Through the real inbox: the other mode's event, naming this world's subscription, is stored and
// applied to its own world, and this world's answer is untouched.
func TestOtherModeEventLeavesThisWorldAlone(t *testing.T) {
	t.Parallel()
	p := newWebhookPath(t)
	if err := p.db.Exec(`INSERT INTO customers (user_id, stripe_customer_id, email, livemode) VALUES ('u_l', 'cus_l', 'l@example.com', false)`).Error; err != nil {
		t.Fatal(err)
	}
	t0 := time.Now().UTC().Truncate(time.Second).Add(-time.Hour)
	sub := stripeevents.Subscription{ID: "sub_l", Customer: "cus_l", Status: billing.StatusActive, PriceID: "price_l",
		CurrentPeriodStart: t0, CurrentPeriodEnd: t0.AddDate(0, 1, 0)}
	if got := p.deliverMode(stripeevents.SubscriptionEvent("evt_l1", billing.EventSubscriptionCreated, t0, false, sub), false); got != "received" {
		t.Fatalf("test delivery: %q", got)
	}
	p.processed("evt_l1")
	var before Entitlement
	p.get("/v1/customers/u_l/entitlement", &before)
	if !before.Entitled {
		t.Fatalf("the subscription does not entitle its user: %+v", before)
	}

	sub.Status = billing.StatusCanceled
	if got := p.deliverMode(stripeevents.SubscriptionEvent("evt_t1", billing.EventSubscriptionDeleted, t0.Add(time.Minute), true, sub), true); got != "received" {
		t.Fatalf("live delivery: %q", got)
	}
	p.waitFor("the live event applied to the live world",
		`SELECT count(*) FROM subscriptions WHERE subscription_id = 'sub_l' AND livemode AND status = 'canceled'`, 1)
	var after Entitlement
	p.get("/v1/customers/u_l/entitlement", &after)
	if !after.Entitled || after.Status != billing.StatusActive {
		t.Errorf("an event of the other mode took the entitlement away: %+v", after)
	}
	var dead int64
	if err := p.db.Raw(`SELECT count(*) FROM webhook_dead_letters`).Scan(&dead).Error; err != nil || dead != 0 {
		t.Errorf("dead letters: %d (%v); the other world's event is no failure", dead, err)
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
	(&billing.Service{}).Register(reg)
	(&Service{}).Register(reg)
	return reg.Types()
}
