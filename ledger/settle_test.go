package ledger

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v79"
	"gorm.io/gorm"

	"billing/internal/stripeemu"
	"billing/webhooks"
)

// eventBase is an arbitrary instant (2024-06-01T00:00:00Z) that event times count from.
const eventBase int64 = 1717200000

// stripeEvent is an event of type typ about obj, in the given mode, created at eventBase+created.
func stripeEvent(id, typ string, created int64, live bool, obj map[string]any) webhooks.Event {
	obj["livemode"] = live
	raw, _ := json.Marshal(obj)
	payload, _ := json.Marshal(map[string]any{"id": id, "object": "event", "type": typ, "api_version": webhooks.PinnedAPIVersion,
		"created": eventBase + created, "livemode": live, "data": map[string]any{"object": json.RawMessage(raw)}})
	return webhooks.Event{ID: id, Type: typ, Livemode: live, APIVersion: webhooks.PinnedAPIVersion,
		Created: time.Unix(eventBase+created, 0).UTC(), Payload: payload, Object: raw}
}

// piEvent is a payment_intent.* event; the PaymentIntent carries the order id like ours do.
func piEvent(id, typ string, created int64, piID, status, orderID, customer string) webhooks.Event {
	obj := map[string]any{"id": piID, "object": "payment_intent", "status": status, "customer": customer,
		"metadata": map[string]any{"order_id": orderID}}
	if typ == EventPaymentIntentPaymentFailed {
		obj["last_payment_error"] = map[string]any{"type": "card_error", "code": "card_declined", "decline_code": "insufficient_funds"}
	}
	return stripeEvent(id, typ, created, false, obj)
}

func refundEvent(id, typ string, created int64, reID, status, orderID, refundID string) webhooks.Event {
	return stripeEvent(id, typ, created, false, map[string]any{"id": reID, "object": "refund", "status": status,
		"metadata": map[string]any{"order_id": orderID, "refund_id": refundID}})
}

// handle runs an event's registered handler in its own transaction, as the inbox's worker does.
func (v *env) handle(ev webhooks.Event) error {
	v.t.Helper()
	reg := webhooks.NewRegistry()
	v.svc.Register(reg)
	h, ok := reg.Lookup(ev.Type)
	if !ok {
		v.t.Fatalf("no handler for %s", ev.Type)
	}
	return v.db.Transaction(func(tx *gorm.DB) error { return h.HandleEvent(context.Background(), tx, ev) })
}

func (v *env) mustHandle(evs ...webhooks.Event) {
	v.t.Helper()
	for _, ev := range evs {
		if err := v.handle(ev); err != nil {
			v.t.Fatalf("handle %s %s: %v", ev.Type, ev.ID, err)
		}
	}
}

// getCharge answers GET /v1/charges/{order_id}.
func (v *env) getCharge(orderID string) map[string]any {
	v.t.Helper()
	rec := v.do(http.MethodGet, "/v1/charges/"+orderID, nil)
	expectStatus(v.t, rec, http.StatusOK)
	return decode(v.t, rec)
}

func (v *env) chargeStatus(orderID string) string {
	v.t.Helper()
	s, _ := v.getCharge(orderID)["status"].(string)
	return s
}

// rowJSON is everything stored in a table's row, for before/after checks.
func (v *env) rowJSON(table, where string, args ...any) string {
	v.t.Helper()
	var rows []string
	if err := v.db.Raw(`SELECT (to_jsonb(x) - 'updated_at')::text FROM `+table+` x WHERE `+where, args...).Scan(&rows).Error; err != nil {
		v.t.Fatal(err)
	}
	return strings.Join(rows, "\n")
}

// authCharge makes a charge that Stripe leaves requiring authentication (402), and returns its
// PaymentIntent id.
func (v *env) authCharge(orderID, userID string) string {
	v.t.Helper()
	v.proxy.CardError(piPath, "authentication_required", "", 1)
	body := expectError(v.t, v.charge(orderID, userID, 500, "usd"), http.StatusPaymentRequired, "authentication_required")
	piID, _ := body["payment_intent_id"].(string)
	if piID == "" {
		v.t.Fatalf("no payment intent in %v", body)
	}
	return piID
}

func TestLedgerEventTypesAreStripeGos(t *testing.T) {
	t.Parallel()
	reg := webhooks.NewRegistry()
	New(Deps{}).Register(reg)
	want := []stripe.EventType{stripe.EventTypeChargeRefundUpdated, stripe.EventTypeChargeRefunded,
		stripe.EventTypePaymentIntentCanceled, stripe.EventTypePaymentIntentPaymentFailed, stripe.EventTypePaymentIntentProcessing,
		stripe.EventTypePaymentIntentSucceeded, stripe.EventTypeRefundCreated, stripe.EventTypeRefundUpdated}
	var ws []string
	for _, w := range want {
		ws = append(ws, string(w))
	}
	if got := reg.Types(); strings.Join(got, " ") != strings.Join(ws, " ") {
		t.Errorf("types %v, want %v", got, ws)
	}
}

// A charge that needed authentication is settled by the PaymentIntent's events, in event order:
// GET /v1/charges/{order_id} shows the truth, while a repeat of the POST still answers as before.
func TestChargeIsSettledByPaymentIntentEvents(t *testing.T) {
	t.Parallel()
	v := newEnv(t)
	cus := v.addCustomer("u1")
	pi := v.authCharge("o1", "u1")
	if got := v.getCharge("o1"); got["status"] != "requires_action" || got["payment_intent_id"] != pi {
		t.Fatalf("before any event: %v", got)
	}
	// The customer authenticates but the bank declines; then a second try succeeds.
	v.mustHandle(piEvent("e10", EventPaymentIntentPaymentFailed, 10, pi, "requires_payment_method", "o1", cus))
	if got := v.getCharge("o1"); got["status"] != "declined" || got["decline_code"] != "insufficient_funds" {
		t.Errorf("after payment_failed: %v", got)
	}
	v.mustHandle(piEvent("e20", EventPaymentIntentSucceeded, 20, pi, "succeeded", "o1", cus))
	// Late deliveries of older news, and a newer non-final one, change nothing: succeeded is final.
	v.mustHandle(piEvent("e15", EventPaymentIntentProcessing, 15, pi, "processing", "o1", cus),
		piEvent("e10", EventPaymentIntentPaymentFailed, 10, pi, "requires_payment_method", "o1", cus),
		piEvent("e30", EventPaymentIntentPaymentFailed, 30, pi, "requires_payment_method", "o1", cus))
	if got := v.getCharge("o1"); got["status"] != "succeeded" || got["payment_intent_id"] != pi || got["amount"] != float64(500) ||
		got["currency"] != "usd" || got["idempotency_key"] != "charge-o1" || got["order_id"] != "o1" {
		t.Errorf("after succeeded: %v", got)
	}
	// POST's answer is the contract's "same body again".
	expectError(t, v.charge("o1", "u1", 500, "usd"), http.StatusPaymentRequired, "authentication_required")
	if n := len(v.proxy.Filter(http.MethodPost, piPath)); n != 1 {
		t.Errorf("%d PaymentIntent requests, want only the first", n)
	}
}

// processing → succeeded (a bank debit), delivered in reverse order.
func TestProcessingChargeSettlesInEventOrder(t *testing.T) {
	t.Parallel()
	v := newEnv(t)
	cus := v.addCustomer("u1")
	v.proxy.Mutate(http.MethodPost, piPath, 1, func(_ stripeemu.Request, obj map[string]any) { obj["status"] = "processing" })
	rec := v.charge("o1", "u1", 900, "usd")
	expectStatus(t, rec, http.StatusCreated)
	pi := decode(t, rec)["payment_intent_id"].(string)
	if s := v.chargeStatus("o1"); s != "processing" {
		t.Fatalf("status %s, want processing", s)
	}
	v.mustHandle(piEvent("e20", EventPaymentIntentSucceeded, 20, pi, "succeeded", "o1", cus),
		piEvent("e10", EventPaymentIntentProcessing, 10, pi, "processing", "o1", cus))
	if s := v.chargeStatus("o1"); s != "succeeded" {
		t.Errorf("status %s, want succeeded", s)
	}
	// In one second, the later stage wins whatever the order.
	v.proxy.Mutate(http.MethodPost, piPath, 1, func(_ stripeemu.Request, obj map[string]any) { obj["status"] = "processing" })
	expectStatus(t, v.charge("o2", "u1", 900, "usd"), http.StatusCreated)
	pi2 := v.chargeRow("o2").PaymentIntentID
	v.mustHandle(piEvent("f2", EventPaymentIntentCanceled, 40, *pi2, "canceled", "o2", cus),
		piEvent("f1", EventPaymentIntentProcessing, 40, *pi2, "processing", "o2", cus))
	if s := v.chargeStatus("o2"); s != "canceled" {
		t.Errorf("status %s, want canceled", s)
	}
}

// An event that arrives while the row is still pending (its request, or the ledger's own
// finisher, has not recorded Stripe's answer yet) is kept, matched by the PaymentIntent's
// metadata and customer; the answer then recorded does not undo it unless it is final.
func TestPaymentIntentEventWhileTheChargeIsPending(t *testing.T) {
	t.Parallel()
	v := newEnv(t)
	cus := v.addCustomer("u1")
	v.exec(`INSERT INTO charges (order_id, user_id, stripe_customer_id, amount, currency, request_hash, idempotency_key, livemode, state)
		VALUES ('o1', 'u1', $1, 300, 'usd', $2, 'charge-o1', false, 'pending')`,
		cus, requestHash(chargeRequest{OrderID: "o1", UserID: "u1", Amount: 300, Currency: "usd"}))
	// Another customer's PaymentIntent naming the same order id is not this row's.
	v.mustHandle(piEvent("x1", EventPaymentIntentProcessing, 5, "pi_other", "processing", "o1", "cus_someone_else"))
	if s := v.chargeStatus("o1"); s != "pending" {
		t.Fatalf("status %s after another customer's event", s)
	}
	v.mustHandle(piEvent("e10", EventPaymentIntentProcessing, 10, "pi_evt", "processing", "o1", cus))
	if got := v.getCharge("o1"); got["status"] != "processing" || got["payment_intent_id"] != "pi_evt" {
		t.Errorf("pending row after the event: %v", got)
	}
	// stripe-mock answers the create with succeeded: final, so it is the truth.
	expectStatus(t, v.charge("o1", "u1", 300, "usd"), http.StatusCreated)
	if s := v.chargeStatus("o1"); s != "succeeded" {
		t.Errorf("status %s after the final answer", s)
	}
}

// Refunds are settled by refund.* and charge.refund.updated; a refund that fails releases its
// amount, so the charge can be refunded again.
func TestRefundIsSettledByEvents(t *testing.T) {
	t.Parallel()
	v := newEnv(t)
	v.addCustomer("u1")
	v.mustCharge("o1", "u1", 1000)
	v.proxy.Mutate(http.MethodPost, "/v1/refunds", 1, func(_ stripeemu.Request, obj map[string]any) { obj["status"] = "pending" })
	rec := v.refund("o1", map[string]any{"refund_id": "r1", "amount": 1000})
	expectStatus(t, rec, http.StatusCreated)
	re := decode(t, rec)["stripe_refund_id"].(string)
	if row := v.refundRow("o1", "r1"); deref(row.Status) != "pending" {
		t.Fatalf("refund status %s, want pending", deref(row.Status))
	}
	expectError(t, v.refund("o1", map[string]any{"refund_id": "r2", "amount": 1}), http.StatusUnprocessableEntity, "refund_exceeds_charge")

	v.mustHandle(refundEvent("e20", EventRefundUpdated, 20, re, "succeeded", "o1", "r1"),
		refundEvent("e10", EventRefundCreated, 10, re, "pending", "o1", "r1"))
	if row := v.refundRow("o1", "r1"); deref(row.Status) != "succeeded" {
		t.Errorf("status %s, want succeeded", deref(row.Status))
	}
	// The bank returns it: failed is final, and the amount is free again.
	v.mustHandle(refundEvent("e30", EventChargeRefundUpdated, 30, re, "failed", "o1", "r1"),
		refundEvent("e40", EventRefundUpdated, 40, re, "succeeded", "o1", "r1"))
	if row := v.refundRow("o1", "r1"); deref(row.Status) != "failed" {
		t.Errorf("status %s, want failed", deref(row.Status))
	}
	expectStatus(t, v.refund("o1", map[string]any{"refund_id": "r3", "amount": 1000}), http.StatusCreated)
}

// charge.refunded records the amount Stripe refunded (refunds made elsewhere too) and settles the
// refunds its payload lists.
func TestChargeRefundedEvent(t *testing.T) {
	t.Parallel()
	v := newEnv(t)
	v.addCustomer("u1")
	pi := v.mustCharge("o1", "u1", 1000)
	v.proxy.Mutate(http.MethodPost, "/v1/refunds", 1, func(_ stripeemu.Request, obj map[string]any) { obj["status"] = "pending" })
	rec := v.refund("o1", map[string]any{"refund_id": "r1", "amount": 400})
	expectStatus(t, rec, http.StatusCreated)
	re := decode(t, rec)["stripe_refund_id"].(string)
	charge := func(id string, at, refunded int64, refunds ...map[string]any) webhooks.Event {
		obj := map[string]any{"id": "ch_1", "object": "charge", "payment_intent": pi, "amount_refunded": refunded}
		if refunds != nil {
			obj["refunds"] = map[string]any{"object": "list", "data": refunds}
		}
		return stripeEvent(id, EventChargeRefunded, at, false, obj)
	}
	v.mustHandle(charge("c20", 20, 700, map[string]any{"id": re, "object": "refund", "status": "succeeded",
		"metadata": map[string]any{"order_id": "o1", "refund_id": "r1"}}), charge("c10", 10, 400))
	if got := v.getCharge("o1"); got["amount_refunded"] != float64(700) {
		t.Errorf("amount_refunded %v, want 700", got["amount_refunded"])
	}
	if row := v.refundRow("o1", "r1"); deref(row.Status) != "succeeded" {
		t.Errorf("refund status %s, want succeeded", deref(row.Status))
	}

	// 300 of the 700 were refunded elsewhere: 300 remain, and more is refused without asking
	// Stripe.
	calls := len(v.proxy.Filter(http.MethodPost, "/v1/refunds"))
	e := expectError(t, v.refund("o1", map[string]any{"refund_id": "r2", "amount": 301}), http.StatusUnprocessableEntity, "refund_exceeds_charge")
	if e["refundable_amount"] != float64(300) {
		t.Errorf("refundable_amount %v, want 300", e["refundable_amount"])
	}
	if n := len(v.proxy.Filter(http.MethodPost, "/v1/refunds")); n != calls {
		t.Errorf("%d refund calls to Stripe after the refused one, want %d", n, calls)
	}
	expectStatus(t, v.refund("o1", map[string]any{"refund_id": "r3", "amount": 300}), http.StatusCreated)
}

// Events about objects that are not the ledger's are acknowledged and change nothing.
func TestEventsOfOtherPaymentsAreIgnored(t *testing.T) {
	t.Parallel()
	v := newEnv(t)
	v.addCustomer("u1")
	v.mustCharge("o1", "u1", 1000)
	before := v.rowJSON("charges", "true")
	v.mustHandle(piEvent("i1", EventPaymentIntentSucceeded, 10, "pi_invoice", "succeeded", "", "cus_u1"),
		refundEvent("i2", EventRefundUpdated, 10, "re_dashboard", "succeeded", "", ""),
		stripeEvent("i3", EventChargeRefunded, 10, false, map[string]any{"id": "ch_x", "payment_intent": "pi_invoice", "amount_refunded": 5}))
	if after := v.rowJSON("charges", "true"); after != before {
		t.Errorf("charges changed:\nbefore %s\nafter  %s", before, after)
	}
}

// inMode returns ev as an event of the given mode.
func inMode(ev webhooks.Event, live bool) webhooks.Event {
	var obj map[string]any
	if err := json.Unmarshal(ev.Object, &obj); err != nil {
		panic(err)
	}
	return stripeEvent(ev.ID, ev.Type, ev.Created.Unix()-eventBase, live, obj)
}

// An event of the other mode that names a ledger row's ids is of the other world, where the
// ledger has no rows: acknowledged, and nothing changes.
func TestLedgerEventsOfTheOtherMode(t *testing.T) {
	t.Parallel()
	for _, rowsLive := range []bool{false, true} {
		v := newEnv(t)
		// A charge and a refund the ledger recorded earlier, and a charge still pending.
		v.exec(`INSERT INTO customers (user_id, stripe_customer_id, email, livemode) VALUES ('u_m', 'cus_m', $1, $2)`, "m@example.com", rowsLive)
		v.exec(`INSERT INTO charges (order_id, user_id, stripe_customer_id, amount, currency, request_hash, idempotency_key, livemode, state, status, payment_intent_id, answer)
			VALUES ('o_m', 'u_m', 'cus_m', 1000, 'usd', 'h', 'charge-o_m', $1, 'completed', 'requires_action', 'pi_m', '{"body":{}}'),
			       ('o_m_pending', 'u_m', 'cus_m', 1000, 'usd', 'h', 'charge-o_m_pending', $2, 'pending', NULL, NULL, NULL)`, rowsLive, rowsLive)
		v.exec(`INSERT INTO refunds (order_id, refund_id, amount, request_hash, idempotency_key, livemode, state, status, stripe_refund_id, answer)
			VALUES ('o_m', 'r1', 100, 'h', 'refund-o_m-r1', $1, 'completed', 'pending', 're_m', '{"body":{}}'),
			       ('o_m', 'r2', 100, 'h', 'refund-o_m-r2', $2, 'pending', NULL, NULL, NULL)`, rowsLive, rowsLive)
		attacks := []webhooks.Event{
			piEvent("x1", EventPaymentIntentSucceeded, 10, "pi_m", "succeeded", "o_m", "cus_m"),
			piEvent("x2", EventPaymentIntentPaymentFailed, 10, "pi_m", "requires_payment_method", "o_m", "cus_m"),
			piEvent("x3", EventPaymentIntentCanceled, 10, "pi_m", "canceled", "o_m", "cus_m"),
			piEvent("x4", EventPaymentIntentProcessing, 10, "pi_new", "processing", "o_m_pending", "cus_m"),
			refundEvent("x5", EventRefundCreated, 10, "re_new", "pending", "o_m", "r2"),
			refundEvent("x6", EventRefundUpdated, 10, "re_m", "failed", "o_m", "r1"),
			refundEvent("x7", EventChargeRefundUpdated, 10, "re_m", "failed", "o_m", "r1"),
			stripeEvent("x8", EventChargeRefunded, 10, false, map[string]any{"id": "ch_m", "payment_intent": "pi_m", "amount_refunded": 100}),
		}
		reg := webhooks.NewRegistry()
		v.svc.Register(reg)
		if len(attacks) != len(reg.Types()) {
			t.Fatalf("the table covers %d events, the ledger handles %d types", len(attacks), len(reg.Types()))
		}
		charges, refunds := v.rowJSON("charges", "true"), v.rowJSON("refunds", "true")
		for _, ev := range attacks {
			// Of the other world, where the ledger has no rows: nothing of ours, acknowledged.
			if err := v.handle(inMode(ev, !rowsLive)); err != nil {
				t.Errorf("rows live=%v, %s: %v, want it acknowledged", rowsLive, ev.Type, err)
			}
		}
		if after := v.rowJSON("charges", "true"); after != charges {
			t.Errorf("rows live=%v: charges changed:\nbefore %s\nafter  %s", rowsLive, charges, after)
		}
		if after := v.rowJSON("refunds", "true"); after != refunds {
			t.Errorf("rows live=%v: refunds changed:\nbefore %s\nafter  %s", rowsLive, refunds, after)
		}
		// The same events in the rows' own mode apply.
		v.mustHandle(inMode(attacks[0], rowsLive))
		if s := v.rowJSON("charges", "order_id = 'o_m'"); !strings.Contains(s, `"status": "succeeded"`) {
			t.Errorf("rows live=%v: own-mode event not applied: %s", rowsLive, s)
		}
	}
}

// GET /v1/charges/{order_id}: the ledger row as POST answered it, with its current status.
func TestGetCharge(t *testing.T) {
	t.Parallel()
	v := newEnv(t)
	v.addCustomer("u1")
	rec := v.charge("o1", "u1", 1234, "eur")
	expectStatus(t, rec, http.StatusCreated)
	posted := decode(t, rec)
	got := v.getCharge("o1")
	for k, want := range posted {
		if got[k] != want {
			t.Errorf("%s: GET %v, POST %v", k, got[k], want)
		}
	}
	// A row a crash left pending reads pending, with no PaymentIntent yet.
	v.exec(`INSERT INTO charges (order_id, user_id, stripe_customer_id, amount, currency, request_hash, idempotency_key, livemode, state)
		VALUES ('o_pending', 'u1', 'cus_u1', 10, 'usd', 'h', 'charge-o_pending', false, 'pending')`)
	if got := v.getCharge("o_pending"); got["status"] != "pending" || got["payment_intent_id"] != nil || got["idempotency_key"] != "charge-o_pending" {
		t.Errorf("pending: %v", got)
	}
	// A declined charge reads declined with its decline code (POST answered 402).
	v.proxy.CardError(piPath, "card_declined", "insufficient_funds", 1)
	expectError(t, v.charge("o_declined", "u1", 10, "usd"), http.StatusPaymentRequired, "card_declined")
	if got := v.getCharge("o_declined"); got["status"] != "declined" || got["decline_code"] != "insufficient_funds" {
		t.Errorf("declined: %v", got)
	}
	// Refunds the service made count at once, before (or without) Stripe's charge.refunded; a
	// refused one does not; Stripe's larger figure (a Dashboard refund) wins when it comes.
	v.mustCharge("o_refunded", "u1", 1250)
	expectStatus(t, v.refund("o_refunded", map[string]any{"refund_id": "r1", "amount": 250}), http.StatusCreated)
	if got := v.getCharge("o_refunded"); got["amount_refunded"] != float64(250) {
		t.Errorf("after a refund of 250: amount_refunded %v", got["amount_refunded"])
	}
	v.proxy.Respond(http.MethodPost, refundsPath, 1, func(stripeemu.Request) stripeemu.Answer {
		return stripeemu.Answer{Status: 400, Body: map[string]any{"error": map[string]any{
			"type": "invalid_request_error", "code": "charge_disputed", "message": "This charge is disputed.",
		}}}
	})
	expectError(t, v.refund("o_refunded", map[string]any{"refund_id": "r_refused", "amount": 100}), http.StatusUnprocessableEntity, "refund_failed")
	expectStatus(t, v.refund("o_refunded", map[string]any{"refund_id": "r2", "amount": 1000}), http.StatusCreated)
	if got := v.getCharge("o_refunded"); got["amount_refunded"] != float64(1250) {
		t.Errorf("after refunds of 250 and 1000 (and a refused 100): amount_refunded %v, want 1250", got["amount_refunded"])
	}
	v.exec(`UPDATE charges SET amount_refunded = 1000 WHERE order_id = 'o_refunded'`)
	if got := v.getCharge("o_refunded"); got["amount_refunded"] != float64(1250) {
		t.Errorf("Stripe's smaller, older figure: amount_refunded %v, want the local 1250", got["amount_refunded"])
	}
	v.mustCharge("o_dashboard", "u1", 500)
	v.exec(`UPDATE charges SET amount_refunded = 300 WHERE order_id = 'o_dashboard'`)
	if got := v.getCharge("o_dashboard"); got["amount_refunded"] != float64(300) {
		t.Errorf("a refund made in the Dashboard: amount_refunded %v, want Stripe's 300", got["amount_refunded"])
	}

	v.exec(`INSERT INTO charges (order_id, user_id, stripe_customer_id, amount, currency, request_hash, idempotency_key, livemode, state)
		VALUES ('o_live', 'u1', 'cus_u1', 10, 'usd', 'h', 'charge-o_live', true, 'pending')`)
	expectError(t, v.do(http.MethodGet, "/v1/charges/o_live", nil), http.StatusConflict, "livemode_conflict")
	expectError(t, v.do(http.MethodGet, "/v1/charges/o_missing", nil), http.StatusNotFound, "not_found")
	expectError(t, v.do(http.MethodGet, "/v1/charges/bad%20id", nil), http.StatusBadRequest, "invalid_order_id")
	expectStatus(t, v.doAs("", http.MethodGet, "/v1/charges/o1", nil), http.StatusUnauthorized)
	expectStatus(t, v.doAs(adminToken, http.MethodGet, "/v1/charges/o1", nil), http.StatusForbidden)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
