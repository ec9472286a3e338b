package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"reflect"
	"testing"
	"time"

	"gorm.io/gorm"

	"billing/appevents"
	"billing/internal/apitest"
	"billing/internal/stripeclient"
	"billing/internal/stripeemu"
	"billing/internal/testenv"
	"billing/webhooks"
)

// newTellingEnv is newEnv with a teller of app events (not pushed), as main wires it.
func newTellingEnv(t *testing.T) *env {
	t.Helper()
	logger := apitest.Logger(t, slog.LevelWarn)
	db := testenv.DB(t)
	proxy := stripeemu.New(t, testenv.StripeMockURL(t))
	svc := New(Deps{
		DB:        db,
		Stripe:    stripeclient.New(proxy.URL, "sk_test_ledger", logger),
		Logger:    logger,
		Now:       time.Now,
		AppEvents: appevents.NewTeller(nil),
	})
	return &env{t: t, db: db, proxy: proxy, e: apitest.Server(logger, svc.Mount), svc: svc}
}

// appEvent is a row of app_events.
type appEvent struct {
	ID       string
	UserID   string
	Livemode bool
	Sequence int64
	Type     string
	Subject  string
	Data     string
	Status   string
}

// appEvents lists the app events of a user, in sequence order.
func (v *env) appEvents(userID string) []appEvent {
	v.t.Helper()
	var out []appEvent
	if err := v.db.Raw(`SELECT id, user_id, livemode, sequence, type, subject, data::text AS data, status
		FROM app_events WHERE user_id = $1 ORDER BY sequence`, userID).Scan(&out).Error; err != nil {
		v.t.Fatalf("list app events: %v", err)
	}
	return out
}

// expectChargeEvents checks that the user's app events are n charge.updated events about the
// order, numbered 1…n, and that the last one's data is what GET /v1/charges/{order_id} answers
// now. It returns the events' data.
func (v *env) expectChargeEvents(userID, orderID string, n int) []map[string]any {
	v.t.Helper()
	evs := v.appEvents(userID)
	if len(evs) != n {
		v.t.Fatalf("%d app events of %s, want %d: %+v", len(evs), userID, n, evs)
	}
	var data []map[string]any
	for i, ev := range evs {
		if ev.Type != appevents.TypeChargeUpdated || ev.UserID != userID || ev.Livemode || ev.Sequence != int64(i+1) ||
			ev.Subject != appevents.ChargeSubject(orderID) || ev.Status != "pending" {
			v.t.Errorf("event %d: %+v, want charge.updated of %s about %s, sequence %d", i, ev, userID, orderID, i+1)
		}
		var d map[string]any
		if err := json.Unmarshal([]byte(ev.Data), &d); err != nil {
			v.t.Fatalf("event %d data %s: %v", i, ev.Data, err)
		}
		data = append(data, d)
	}
	if n > 0 {
		if got, want := data[n-1], v.getCharge(orderID); !reflect.DeepEqual(got, want) {
			v.t.Errorf("last event's data\n  %v\nGET answers\n  %v", got, want)
		}
	}
	return data
}

// A charge is told when its row is written (pending) and when Stripe's answer completes it, and
// a refund when it counts; a repeat of a request changes nothing and tells nothing.
func TestChargeUpdatedIsToldByTheRequests(t *testing.T) {
	t.Parallel()
	v := newTellingEnv(t)
	v.addCustomer("u1")
	pi := v.mustCharge("o1", "u1", 1000)
	data := v.expectChargeEvents("u1", "o1", 2)
	if data[0]["status"] != "pending" || data[0]["payment_intent_id"] != nil || data[0]["amount"] != float64(1000) {
		t.Errorf("first event: %v, want the pending row", data[0])
	}
	if data[1]["status"] != "succeeded" || data[1]["payment_intent_id"] != pi {
		t.Errorf("second event: %v, want succeeded with %s", data[1], pi)
	}

	// The same request again is answered from the ledger: no event.
	expectStatus(t, v.charge("o1", "u1", 1000, "usd"), http.StatusOK)
	v.expectChargeEvents("u1", "o1", 2)

	// A refund counts once Stripe accepted it; its reservation alone changes nothing.
	expectStatus(t, v.refund("o1", map[string]any{"refund_id": "r1", "amount": 400}), http.StatusCreated)
	if data := v.expectChargeEvents("u1", "o1", 3); data[2]["amount_refunded"] != float64(400) {
		t.Errorf("after the refund: %v, want amount_refunded 400", data[2])
	}
	expectStatus(t, v.refund("o1", map[string]any{"refund_id": "r1", "amount": 400}), http.StatusOK)
	// One that Stripe refuses never counted.
	v.proxy.Respond(http.MethodPost, refundsPath, 1, func(stripeemu.Request) stripeemu.Answer {
		return stripeemu.Answer{Status: 400, Body: map[string]any{"error": map[string]any{
			"type": "invalid_request_error", "code": "charge_disputed", "message": "This charge is disputed.",
		}}}
	})
	expectError(t, v.refund("o1", map[string]any{"refund_id": "r2", "amount": 100}), http.StatusUnprocessableEntity, "refund_failed")
	v.expectChargeEvents("u1", "o1", 3)

	// A decline is told with its decline code.
	v.proxy.CardError(piPath, "card_declined", "insufficient_funds", 1)
	expectError(t, v.charge("o2", "u1", 10, "usd"), http.StatusPaymentRequired, "card_declined")
	evs := v.appEvents("u1")
	if len(evs) != 5 || evs[4].Subject != appevents.ChargeSubject("o2") || evs[4].Sequence != 5 {
		t.Fatalf("events after a declined charge: %+v, want 5, the last about o2", evs)
	}
	var d map[string]any
	if err := json.Unmarshal([]byte(evs[4].Data), &d); err != nil {
		t.Fatal(err)
	}
	if want := v.getCharge("o2"); !reflect.DeepEqual(d, want) || d["decline_code"] != "insufficient_funds" {
		t.Errorf("declined: event %v, GET %v", d, want)
	}
}

// Stripe's events that change a charge's answer are told in their transaction, once: the same
// event again, or another that brings nothing new, tells nothing.
func TestChargeUpdatedIsToldByEventsOnce(t *testing.T) {
	t.Parallel()
	v := newTellingEnv(t)
	cus := v.addCustomer("u1")
	pi := v.authCharge("o1", "u1")
	v.expectChargeEvents("u1", "o1", 2) // pending, requires_action

	ok := piEvent("e1", EventPaymentIntentSucceeded, 10, pi, "succeeded", "o1", cus)
	v.mustHandle(ok)
	if data := v.expectChargeEvents("u1", "o1", 3); data[2]["status"] != "succeeded" {
		t.Errorf("after payment_intent.succeeded: %v", data[2])
	}
	v.mustHandle(ok, piEvent("e2", EventPaymentIntentSucceeded, 20, pi, "succeeded", "o1", cus))
	v.expectChargeEvents("u1", "o1", 3)

	// Refunds settled by events: a refund pending at Stripe counts from its answer; its failure
	// releases it; Stripe's charge.refunded figure (a Dashboard refund) raises it.
	v.proxy.Mutate(http.MethodPost, refundsPath, 1, func(_ stripeemu.Request, obj map[string]any) { obj["status"] = "pending" })
	rec := v.refund("o1", map[string]any{"refund_id": "r1", "amount": 200})
	expectStatus(t, rec, http.StatusCreated)
	re := decode(t, rec)["stripe_refund_id"].(string)
	v.expectChargeEvents("u1", "o1", 4)
	v.mustHandle(refundEvent("e3", EventRefundUpdated, 30, re, "succeeded", "o1", "r1")) // no change of the answer
	v.expectChargeEvents("u1", "o1", 4)
	failed := refundEvent("e4", EventChargeRefundUpdated, 40, re, "failed", "o1", "r1")
	v.mustHandle(failed, failed)
	if data := v.expectChargeEvents("u1", "o1", 5); data[4]["amount_refunded"] != float64(0) {
		t.Errorf("after the refund failed: %v, want amount_refunded 0", data[4])
	}
	refunded := stripeEvent("e5", EventChargeRefunded, 50, false, map[string]any{"id": "ch_1", "object": "charge",
		"payment_intent": pi, "amount_refunded": 300})
	v.mustHandle(refunded, refunded)
	if data := v.expectChargeEvents("u1", "o1", 6); data[5]["amount_refunded"] != float64(300) {
		t.Errorf("after charge.refunded: %v, want amount_refunded 300", data[5])
	}
}

// The event is written in the transaction of the change: rolled back with it, it was never
// told, and the next change is told with the next sequence number, without a gap.
func TestChargeUpdatedRollsBackWithItsChange(t *testing.T) {
	t.Parallel()
	v := newTellingEnv(t)
	cus := v.addCustomer("u1")
	pi := v.authCharge("o1", "u1")
	v.expectChargeEvents("u1", "o1", 2)

	ev := piEvent("e1", EventPaymentIntentSucceeded, 10, pi, "succeeded", "o1", cus)
	reg := webhooks.NewRegistry()
	v.svc.Register(reg)
	h, _ := reg.Lookup(ev.Type)
	errRollback := errors.New("roll back")
	err := v.db.Transaction(func(tx *gorm.DB) error {
		if err := h.HandleEvent(context.Background(), tx, ev); err != nil {
			return err
		}
		var n int64
		if err := tx.Raw(`SELECT count(*) FROM app_events WHERE user_id = 'u1'`).Scan(&n).Error; err != nil || n != 3 {
			t.Errorf("in the transaction: %d events (%v), want 3", n, err)
		}
		return errRollback
	})
	if !errors.Is(err, errRollback) {
		t.Fatalf("transaction: %v", err)
	}
	v.expectChargeEvents("u1", "o1", 2)
	if s := v.chargeStatus("o1"); s != "requires_action" {
		t.Fatalf("status %s after the rollback", s)
	}
	v.mustHandle(ev)
	if data := v.expectChargeEvents("u1", "o1", 3); data[2]["status"] != "succeeded" {
		t.Errorf("applied after the rollback: %v", data[2])
	}

	// A write whose transaction fails at commit leaves neither the row nor its event.
	v.exec(`CREATE FUNCTION fail_commit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'commit refused'; END $$`)
	v.exec(`CREATE CONSTRAINT TRIGGER fail_commit AFTER INSERT ON app_events DEFERRABLE INITIALLY DEFERRED
		FOR EACH ROW EXECUTE FUNCTION fail_commit()`)
	expectError(t, v.charge("o2", "u1", 10, "usd"), http.StatusInternalServerError, "internal_error")
	var n int64
	v.db.Raw(`SELECT count(*) FROM charges WHERE order_id = 'o2'`).Scan(&n)
	if n != 0 {
		t.Errorf("the charge row of the failed insert is there")
	}
	v.expectChargeEvents("u1", "o1", 3)
}

// Only the deployment's own mode is told: an event applied to a row of the other mode's world
// writes no app event.
func TestChargeOfTheOtherModeIsNotTold(t *testing.T) {
	t.Parallel()
	v := newTellingEnv(t)
	v.exec(`INSERT INTO charges (order_id, user_id, stripe_customer_id, amount, currency, request_hash, idempotency_key, livemode, state, status, payment_intent_id, answer)
		VALUES ('o_m', 'u_m', 'cus_m', 1000, 'usd', 'h', 'charge-o_m', true, 'completed', 'requires_action', 'pi_m', '{"body":{}}')`)
	v.mustHandle(inMode(piEvent("x1", EventPaymentIntentSucceeded, 10, "pi_m", "succeeded", "o_m", "cus_m"), true))
	if row := v.chargeRow("o_m"); deref(row.Status) != "succeeded" {
		t.Fatalf("the live row was not settled: %+v", row)
	}
	var n int64
	v.db.Raw(`SELECT count(*) FROM app_events`).Scan(&n)
	if n != 0 {
		t.Errorf("%d app events for a live row in a test-mode service", n)
	}
}
