package ledger

import (
	"context"
	"net/http"
	"testing"
)

// The console lists a customer's ledger rows, newest first, with what was refunded of each.
func TestCustomerChargesListsTheLedgerWithRefunds(t *testing.T) {
	t.Parallel()
	v := newEnv(t)
	cus := v.addCustomer("u1")
	other := v.addCustomer("u2")
	v.mustCharge("o1", "u1", 1000)
	v.mustCharge("o2", "u1", 500)
	v.mustCharge("o3", "u2", 700)
	expectStatus(t, v.refund("o1", map[string]any{"refund_id": "r1", "amount": 300}), http.StatusCreated)
	v.exec(`UPDATE charges SET created_at = created_at - interval '1 hour' WHERE order_id = 'o1'`)

	svc := New(Deps{DB: v.db})
	rows, err := svc.CustomerCharges(context.Background(), cus, false, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || rows[0].OrderID != "o2" || rows[1].OrderID != "o1" || rows[1].Refunded != 300 || rows[0].Refunded != 0 ||
		rows[1].Amount != 1000 || rows[1].State != "completed" || rows[1].UserID != "u1" {
		t.Fatalf("charges of %s: %+v", cus, rows)
	}
	if rows, err := svc.CustomerCharges(context.Background(), other, true, 10); err != nil || len(rows) != 0 {
		t.Errorf("live charges of a test customer: %+v %v", rows, err)
	}
}
