package ledger

import (
	"net/http"
	"testing"
)

// The service runs in test mode here (sk_test_ key, Livemode false): a user linked only in live
// mode is unknown to it (404, link the user in this world first), and an order id already used in
// live mode on this database is refused with 409 livemode_conflict, before any call to Stripe,
// and nothing is written.
func TestLedgerRefusesTheOtherMode(t *testing.T) {
	t.Parallel()
	v := newEnv(t)
	v.exec(`INSERT INTO customers (user_id, stripe_customer_id, email, livemode) VALUES ('u_live', 'cus_live', $1, true)`, "l@example.com")
	v.addCustomer("u_test")
	v.exec(`INSERT INTO charges (order_id, user_id, stripe_customer_id, amount, currency, request_hash, idempotency_key, livemode, state)
		VALUES ('o_live_pending', 'u_test', 'cus_u_test', 100, 'usd', $1, 'charge-o_live_pending', true, 'pending')`,
		requestHash(chargeRequest{OrderID: "o_live_pending", UserID: "u_test", Amount: 100, Currency: "usd"}))
	v.exec(`INSERT INTO charges (order_id, user_id, stripe_customer_id, amount, currency, request_hash, idempotency_key, livemode, state, status, payment_intent_id, answer)
		VALUES ('o_live_paid', 'u_test', 'cus_u_test', 100, 'usd', 'h', 'charge-o_live_paid', true, 'completed', 'succeeded', 'pi_live', '{"body":{}}')`)

	expectError(t, v.charge("o_new", "u_live", 100, "usd"), http.StatusNotFound, "customer_not_found")
	expectError(t, v.charge("o_live_pending", "u_test", 100, "usd"), http.StatusConflict, "livemode_conflict")
	expectError(t, v.refund("o_live_paid", map[string]any{"refund_id": "r1", "amount": 10}), http.StatusConflict, "livemode_conflict")

	if n := len(v.proxy.Requests()); n != 0 {
		t.Errorf("%d calls reached Stripe", n)
	}
	var charges, refunds int64
	v.db.Raw(`SELECT count(*) FROM charges WHERE order_id = 'o_new'`).Scan(&charges)
	v.db.Raw(`SELECT count(*) FROM refunds`).Scan(&refunds)
	if charges != 0 || refunds != 0 {
		t.Errorf("written: %d charges, %d refunds; want none", charges, refunds)
	}
	if row := v.chargeRow("o_live_pending"); row.State != statePending || row.Attempts != 0 {
		t.Errorf("the live pending charge was touched: %+v", row)
	}
}

// The database itself refuses a refund whose mode differs from its charge's.
func TestRefundModeMustMatchItsCharge(t *testing.T) {
	t.Parallel()
	v := newEnv(t)
	v.addCustomer("u1")
	v.mustCharge("o1", "u1", 100)
	err := v.db.Exec(`INSERT INTO refunds (order_id, refund_id, amount, request_hash, idempotency_key, livemode, state)
		VALUES ('o1', 'r_x', 10, 'h', 'refund-o1-r_x', true, 'pending')`).Error
	if err == nil {
		t.Fatal("a live refund of a test charge was stored")
	}
	rec := v.refund("o1", map[string]any{"refund_id": "r1", "amount": 10})
	expectStatus(t, rec, http.StatusCreated)
	if row := v.refundRow("o1", "r1"); row.Livemode {
		t.Errorf("refund of a test charge stored as live: %+v", row)
	}
}
