package ledger

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"billing/internal/stripeemu"
)

const refundsPath = "/v1/refunds"

func TestRefundsNeverExceedTheCharge(t *testing.T) {
	t.Parallel()
	v := newEnv(t)
	v.addCustomer("u1")
	piID := v.mustCharge("o1", "u1", 100)

	first := v.refund("o1", map[string]any{"refund_id": "r1", "amount": 60, "reason": "requested_by_customer"})
	expectStatus(t, first, http.StatusCreated)
	body := decode(t, first)
	for k, w := range map[string]any{
		"refund_id": "r1", "order_id": "o1", "status": "succeeded", "amount": float64(60),
		"idempotency_key": "refund-o1-r1",
	} {
		if body[k] != w {
			t.Errorf("%s = %v, want %v", k, body[k], w)
		}
	}
	if id, _ := body["stripe_refund_id"].(string); !strings.HasPrefix(id, "re_") {
		t.Errorf("stripe_refund_id %v", body["stripe_refund_id"])
	}
	create := v.expectKeys(http.MethodPost, refundsPath, "refund-o1-r1", 1)[0]
	for k, w := range map[string]string{
		"payment_intent": piID, "amount": "60", "reason": "requested_by_customer",
		"metadata[order_id]": "o1", "metadata[refund_id]": "r1",
	} {
		if got := create.Form.Get(k); got != w {
			t.Errorf("form %s = %q, want %q", k, got, w)
		}
	}

	steps := []struct {
		name   string
		body   map[string]any
		status int
		code   string
		amount float64
	}{
		{"repeat", map[string]any{"refund_id": "r1", "amount": 60, "reason": "requested_by_customer"}, http.StatusOK, "", 60},
		{"same refund id, other amount", map[string]any{"refund_id": "r1", "amount": 10}, http.StatusConflict, "idempotency_conflict", 0},
		{"more than the remaining 40", map[string]any{"refund_id": "r2", "amount": 41}, http.StatusUnprocessableEntity, "refund_exceeds_charge", 0},
		{"the remainder, amount omitted", map[string]any{"refund_id": "r3"}, http.StatusCreated, "", 40},
		{"repeat of the remainder", map[string]any{"refund_id": "r3"}, http.StatusOK, "", 40},
		{"nothing left", map[string]any{"refund_id": "r4"}, http.StatusUnprocessableEntity, "refund_exceeds_charge", 0},
		{"nothing left, explicit amount", map[string]any{"refund_id": "r5", "amount": 1}, http.StatusUnprocessableEntity, "refund_exceeds_charge", 0},
	}
	for _, st := range steps {
		calls := len(v.proxy.Filter(http.MethodPost, refundsPath))
		rec := v.refund("o1", st.body)
		if st.code != "" {
			e := expectError(t, rec, st.status, st.code)
			if st.code == "refund_exceeds_charge" && e["refundable_amount"] == nil {
				t.Errorf("%s: no refundable_amount in %s", st.name, rec.Body)
			}
		} else {
			expectStatus(t, rec, st.status)
			if got := decode(t, rec)["amount"]; got != st.amount {
				t.Errorf("%s: amount %v, want %v", st.name, got, st.amount)
			}
		}
		wantCalls := calls
		if st.status == http.StatusCreated {
			wantCalls++
		}
		if n := len(v.proxy.Filter(http.MethodPost, refundsPath)); n != wantCalls {
			t.Errorf("%s: %d refund calls to Stripe, want %d", st.name, n, wantCalls)
		}
	}
	if again := v.refund("o1", map[string]any{"refund_id": "r1", "amount": 60, "reason": "requested_by_customer"}); again.Body.String() != first.Body.String() {
		t.Errorf("repeat answered %s, first %s", again.Body, first.Body)
	}
	v.expectStripeHeaders()
}

func TestConcurrentRefundsCannotOverRefund(t *testing.T) {
	t.Parallel()
	v := newEnv(t)
	v.addCustomer("u1")
	v.mustCharge("o1", "u1", 100)

	recs := concurrently(5, func(i int) *httptest.ResponseRecorder {
		return v.refund("o1", map[string]any{"refund_id": fmt.Sprintf("r%d", i), "amount": 40})
	})
	ok, refused := 0, 0
	for _, rec := range recs {
		switch rec.Code {
		case http.StatusCreated:
			ok++
		case http.StatusUnprocessableEntity:
			expectError(t, rec, http.StatusUnprocessableEntity, "refund_exceeds_charge")
			refused++
		default:
			t.Fatalf("status %d: %s", rec.Code, rec.Body)
		}
	}
	if ok != 2 || refused != 3 {
		t.Errorf("%d refunds made, %d refused; want 2 and 3", ok, refused)
	}
	if n := v.proxy.Executed(http.MethodPost, refundsPath); n != 2 {
		t.Errorf("%d refunds on Stripe, want 2", n)
	}
	var sum int64
	v.db.Raw(`SELECT COALESCE(SUM(amount), 0) FROM refunds WHERE order_id = 'o1'`).Scan(&sum)
	if sum != 80 {
		t.Errorf("ledger refunds sum to %d, want 80", sum)
	}
}

func TestConcurrentIdenticalRefundsMakeOne(t *testing.T) {
	t.Parallel()
	v := newEnv(t)
	v.addCustomer("u1")
	v.mustCharge("o1", "u1", 100)
	recs := concurrently(6, func(int) *httptest.ResponseRecorder {
		return v.refund("o1", map[string]any{"refund_id": "r1"})
	})
	created := 0
	for _, rec := range recs {
		if rec.Code == http.StatusCreated {
			created++
		} else {
			expectStatus(t, rec, http.StatusOK)
		}
		if rec.Body.String() != recs[0].Body.String() {
			t.Errorf("answers differ: %s vs %s", rec.Body, recs[0].Body)
		}
	}
	if created != 1 || v.proxy.Executed(http.MethodPost, refundsPath) != 1 {
		t.Errorf("%d answers 201, %d refunds on Stripe; want 1 and 1", created, v.proxy.Executed(http.MethodPost, refundsPath))
	}
}

func TestRefundOutageKeepsTheReservation(t *testing.T) {
	t.Parallel()
	v := newEnv(t)
	v.addCustomer("u1")
	v.mustCharge("o1", "u1", 100)
	for _, f := range []stripeemu.Fault{stripeemu.FaultDropAfter, stripeemu.Fault500, stripeemu.FaultDrop} {
		v.proxy.InjectFault(http.MethodPost, refundsPath, f, 1)
	}
	expectError(t, v.refund("o1", map[string]any{"refund_id": "r1", "amount": 70}), http.StatusServiceUnavailable, "stripe_unavailable")
	if row := v.refundRow("o1", "r1"); row.State != statePending {
		t.Fatalf("row %+v, want pending", row)
	}
	// Stripe may have refunded the 70: it stays reserved while pending.
	expectError(t, v.refund("o1", map[string]any{"refund_id": "r2", "amount": 31}), http.StatusUnprocessableEntity, "refund_exceeds_charge")

	rec := v.refund("o1", map[string]any{"refund_id": "r1", "amount": 70})
	expectStatus(t, rec, http.StatusCreated)
	made := v.proxy.Objects(refundsPath)
	if len(made) != 1 || decode(t, rec)["stripe_refund_id"] != made[0]["id"] {
		t.Errorf("answered %s; Stripe made %v", rec.Body, made)
	}
	v.expectKeys(http.MethodPost, refundsPath, "refund-o1-r1", 4)
}

func TestPendingRefundBeyondTheKeyWindowIsFoundOnStripe(t *testing.T) {
	t.Parallel()
	v := newEnv(t)
	v.addCustomer("u1")
	piID := v.mustCharge("o1", "u1", 100)
	for range 3 {
		v.proxy.InjectFault(http.MethodPost, refundsPath, stripeemu.FaultDropAfter, 1)
	}
	expectError(t, v.refund("o1", map[string]any{"refund_id": "r1"}), http.StatusServiceUnavailable, "stripe_unavailable")
	v.exec(`UPDATE refunds SET created_at = now() - interval '30 hours'`)
	v.proxy.ForgetKeys()

	rec := v.refund("o1", map[string]any{"refund_id": "r1"})
	expectStatus(t, rec, http.StatusCreated)
	made := v.proxy.Objects(refundsPath)
	if v.proxy.Executed(http.MethodPost, refundsPath) != 1 || len(made) != 1 || decode(t, rec)["stripe_refund_id"] != made[0]["id"] {
		t.Fatalf("answered %s; Stripe made %v", rec.Body, made)
	}
	lists := v.proxy.Filter(http.MethodGet, refundsPath)
	if len(lists) != 1 || lists[0].Query.Get("payment_intent") != piID {
		t.Errorf("refund lookups %+v", lists)
	}
}

func TestRefundRefusedByStripeReleasesTheAmount(t *testing.T) {
	t.Parallel()
	v := newEnv(t)
	v.addCustomer("u1")
	v.mustCharge("o1", "u1", 100)
	v.proxy.Respond(http.MethodPost, refundsPath, 1, func(stripeemu.Request) stripeemu.Answer {
		return stripeemu.Answer{Status: 400, Body: map[string]any{"error": map[string]any{
			"type": "invalid_request_error", "code": "charge_disputed", "message": "This charge is disputed.",
		}}}
	})
	first := v.refund("o1", map[string]any{"refund_id": "r1"})
	e := expectError(t, first, http.StatusUnprocessableEntity, "refund_failed")
	if e["stripe_code"] != "charge_disputed" {
		t.Errorf("stripe_code %v", e["stripe_code"])
	}
	again := v.refund("o1", map[string]any{"refund_id": "r1"})
	if again.Code != first.Code || again.Body.String() != first.Body.String() {
		t.Errorf("repeat answered %d %s", again.Code, again.Body)
	}
	// The refused 100 does not count: the whole charge can still be refunded.
	rec := v.refund("o1", map[string]any{"refund_id": "r2"})
	expectStatus(t, rec, http.StatusCreated)
	if decode(t, rec)["amount"] != float64(100) {
		t.Errorf("refund after a refused one: %s", rec.Body)
	}
}

func TestRefundErrors(t *testing.T) {
	t.Parallel()
	v := newEnv(t)
	v.addCustomer("u1")
	v.mustCharge("o1", "u1", 100)
	v.mustCharge("a-b", "u1", 100)
	v.mustCharge("a", "u1", 100)
	v.exec(`INSERT INTO charges (order_id, user_id, stripe_customer_id, amount, currency, request_hash, idempotency_key, livemode, state)
		VALUES ('pending1', 'u1', 'cus_u1', 100, 'usd', 'h', 'charge-pending1', false, 'pending')`)
	expectStatus(t, v.refund("a-b", map[string]any{"refund_id": "c"}), http.StatusCreated)
	calls := len(v.proxy.Requests())

	for _, tc := range []struct {
		name   string
		order  string
		body   string
		status int
		code   string
	}{
		{"unknown order", "nope", `{"refund_id":"r1"}`, http.StatusNotFound, "not_found"},
		{"charge still pending", "pending1", `{"refund_id":"r1"}`, http.StatusConflict, "charge_not_refundable"},
		{"key of another refund", "a", `{"refund_id":"b-c"}`, http.StatusConflict, "idempotency_conflict"},
		{"bad order id", "o%201", `{"refund_id":"r1"}`, http.StatusBadRequest, "invalid_order_id"},
		{"missing refund_id", "o1", `{"amount":10}`, http.StatusBadRequest, "invalid_refund_id"},
		{"bad refund_id", "o1", `{"refund_id":"r.1"}`, http.StatusBadRequest, "invalid_refund_id"},
		{"float amount", "o1", `{"refund_id":"r1","amount":1.5}`, http.StatusBadRequest, "invalid_amount"},
		{"string amount", "o1", `{"refund_id":"r1","amount":"10"}`, http.StatusBadRequest, "invalid_amount"},
		{"zero amount", "o1", `{"refund_id":"r1","amount":0}`, http.StatusBadRequest, "invalid_amount"},
		{"negative amount", "o1", `{"refund_id":"r1","amount":-1}`, http.StatusBadRequest, "invalid_amount"},
		{"unknown reason", "o1", `{"refund_id":"r1","reason":"because"}`, http.StatusBadRequest, "invalid_refund_reason"},
		{"unknown field", "o1", `{"refund_id":"r1","amont":1}`, http.StatusBadRequest, "invalid_json"},
		{"empty body", "o1", ``, http.StatusBadRequest, "invalid_json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			expectError(t, v.do(http.MethodPost, "/v1/charges/"+tc.order+"/refunds", tc.body), tc.status, tc.code)
		})
	}
	if n := len(v.proxy.Requests()); n != calls {
		t.Errorf("refused requests called Stripe %d times", n-calls)
	}
}
