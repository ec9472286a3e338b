package billing

import (
	"encoding/json"
	"testing"
)

func TestDecodeLenient(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, obj                    string
		customer, price, periodEnd   string
		trialEnd                     string
		cancelAtPeriodEnd, wantError bool
	}{
		{name: "expanded customer, items with price",
			obj:      `{"id":"sub_1","status":"active","customer":{"id":"cus_x","object":"customer"},"items":{"data":[{"price":{"id":"price_1"}}]},"current_period_end":1700000000}`,
			customer: "cus_x", price: "price_1", periodEnd: "2023-11-14T22:13:20Z", trialEnd: "<nil>"},
		{name: "legacy plan, string timestamps, null cancel flag",
			obj:      `{"id":"sub_1","status":"active","customer":"cus_x","plan":{"id":"gold"},"current_period_end":"1700000000","trial_end":null,"cancel_at_period_end":null}`,
			customer: "cus_x", price: "gold", periodEnd: "2023-11-14T22:13:20Z", trialEnd: "<nil>"},
		{name: "period only on items (API 2025+)",
			obj:      `{"id":"sub_1","status":"trialing","customer":"cus_x","items":{"data":[{"price":"price_2","current_period_end":1700000000}]},"trial_end":1700000000.0,"cancel_at_period_end":true}`,
			customer: "cus_x", price: "price_2", periodEnd: "2023-11-14T22:13:20Z", trialEnd: "2023-11-14T22:13:20Z", cancelAtPeriodEnd: true},
		{name: "nothing optional", obj: `{"id":"sub_1","status":"active","customer":"cus_x"}`,
			customer: "cus_x", price: "", periodEnd: "<nil>", trialEnd: "<nil>"},
		{name: "customer of the wrong type", obj: `{"id":"sub_1","status":"active","customer":42}`, wantError: true},
		{name: "array", obj: `[]`, wantError: true},
	}
	for _, tc := range tests {
		s, err := decodeSubscription(json.RawMessage(tc.obj))
		if tc.wantError {
			if err == nil {
				t.Errorf("%s: no error", tc.name)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		_, end := s.Period()
		cape := s.CancelAtPeriodEnd != nil && *s.CancelAtPeriodEnd
		if string(s.Customer) != tc.customer || s.PriceID() != tc.price || ptrTime(end.Ptr()) != tc.periodEnd ||
			ptrTime(s.TrialEnd.Ptr()) != tc.trialEnd || cape != tc.cancelAtPeriodEnd {
			t.Errorf("%s: customer %s price %s period end %s trial end %s cancel %v", tc.name, s.Customer, s.PriceID(),
				ptrTime(end.Ptr()), ptrTime(s.TrialEnd.Ptr()), cape)
		}
	}

	inv, err := decodeInvoice(json.RawMessage(`{"id":"in_1","customer":"cus_1","parent":{"subscription_details":{"subscription":"sub_9"}}}`))
	if err != nil || inv.SubscriptionID() != "sub_9" {
		t.Errorf("invoice with parent.subscription_details: %v %v", inv, err)
	}
	inv, err = decodeInvoice(json.RawMessage(`{"id":"in_1","customer":"cus_1","subscription":{"id":"sub_8","object":"subscription"}}`))
	if err != nil || inv.SubscriptionID() != "sub_8" {
		t.Errorf("invoice with expanded subscription: %v %v", inv, err)
	}
}

// Only the licensed item's quantity is the seats: a metered item has none.
func TestQuantityIsTheLicensedItems(t *testing.T) {
	t.Parallel()
	raw := json.RawMessage(`{"id":"sub_m","customer":"cus_1","status":"active","items":{"data":[
		{"id":"si_1","price":{"id":"price_usage","recurring":{"usage_type":"metered"}}},
		{"id":"si_2","price":{"id":"price_seat","recurring":{"usage_type":"licensed"}},"quantity":7}]}}`)
	obj, err := decodeSubscription(raw)
	if err != nil {
		t.Fatal(err)
	}
	if q := ptrInt(obj.Quantity()); q != "7" || obj.PriceID() != "price_usage" {
		t.Errorf("quantity %s price %s", q, obj.PriceID())
	}
	only, _ := decodeSubscription(json.RawMessage(`{"id":"sub_m","customer":"cus_1","status":"active","items":{"data":[
		{"id":"si_1","price":{"id":"price_usage","recurring":{"usage_type":"metered"}}}]}}`))
	if q := only.Quantity(); q != nil {
		t.Errorf("metered only: quantity %d, want none", *q)
	}
}
