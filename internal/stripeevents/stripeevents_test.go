package stripeevents

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// at reads a dotted path of a decoded payload ("data.object.metadata.order_id").
func at(v any, path string) any {
	for _, k := range strings.Split(path, ".") {
		m, _ := v.(map[string]any)
		v = m[k]
	}
	return v
}

// Every sample is an event of its type and the pinned version; the options name the ids and
// amounts the handlers read, where those handlers read them.
func TestSamplesCarryTheOptions(t *testing.T) {
	now := time.Unix(1717200000, 0)
	o := SampleOptions{Suffix: "x", EventID: "evt_given", Customer: "cus_given", Subscription: "sub_given",
		Invoice: "in_given", Session: "cs_test_given", PaymentIntent: "pi_given", Charge: "ch_given", Refund: "re_given",
		UserID: "u_given", OrderID: "o_given", RefundID: "r_given", Amount: 1250, AmountRefunded: 250,
		DeclineCode: "insufficient_funds", Now: now}
	want := map[string]map[string]any{
		"customer.subscription.paused":                    {"id": "sub_given", "customer": "cus_given", "status": "paused"},
		"customer.subscription.resumed":                   {"id": "sub_given", "status": "active"},
		"invoice.voided":                                  {"id": "in_given", "subscription": "sub_given", "status": "void"},
		"invoice.payment_action_required":                 {"id": "in_given", "status": "open", "attempt_count": float64(1)},
		"customer.deleted":                                {"id": "cus_given", "object": "customer"},
		"checkout.session.completed":                      {"id": "cs_test_given", "object": "checkout.session", "mode": "subscription", "status": "complete", "payment_status": "paid", "customer": "cus_given", "subscription": "sub_given", "client_reference_id": "u_given", "metadata.user_id": "u_given"},
		"checkout.session.expired":                        {"id": "cs_test_given", "status": "expired", "subscription": nil},
		"payment_intent.succeeded":                        {"id": "pi_given", "status": "succeeded", "customer": "cus_given", "amount": float64(1250), "metadata.order_id": "o_given", "metadata.user_id": "u_given"},
		"payment_intent.payment_failed":                   {"status": "requires_payment_method", "last_payment_error.decline_code": "insufficient_funds", "last_payment_error.code": "card_declined"},
		"charge.refunded":                                 {"id": "ch_given", "payment_intent": "pi_given", "amount": float64(1250), "amount_refunded": float64(250), "refunded": false},
		"refund.updated":                                  {"id": "re_given", "status": "succeeded", "metadata.order_id": "o_given", "metadata.refund_id": "r_given", "charge": "ch_given"},
		"entitlements.active_entitlement_summary.updated": {"customer": "cus_given"},
	}
	for _, typ := range SampleTypes() {
		b, err := SampleWith(typ, o)
		if err != nil {
			t.Fatalf("%s: %v", typ, err)
		}
		var ev map[string]any
		if err := json.Unmarshal(b, &ev); err != nil {
			t.Fatalf("%s: %v", typ, err)
		}
		if ev["type"] != typ || ev["id"] != "evt_given" || ev["api_version"] != APIVersion || ev["created"] != float64(now.Unix()) {
			t.Errorf("%s: envelope %v", typ, ev)
		}
		for path, w := range want[typ] {
			if got := at(ev, "data.object."+path); fmt.Sprint(got) != fmt.Sprint(w) {
				t.Errorf("%s: %s = %v, want %v", typ, path, got, w)
			}
		}
		delete(want, typ)
	}
	for typ := range want {
		t.Errorf("no sample of %s", typ)
	}
	if _, err := SampleWith("charge.nonsense", o); err == nil || !strings.Contains(err.Error(), "charge.refunded") {
		t.Errorf("an unknown type: %v, want an error listing the samples", err)
	}
}

// The status option replaces the type's usual one, and a failed refund says why.
func TestSampleStatusReplacesTheTypes(t *testing.T) {
	b, err := SampleWith("refund.updated", SampleOptions{Suffix: "x", Status: "failed"})
	if err != nil {
		t.Fatal(err)
	}
	var ev map[string]any
	if err := json.Unmarshal(b, &ev); err != nil {
		t.Fatal(err)
	}
	if at(ev, "data.object.status") != "failed" || at(ev, "data.object.failure_reason") == nil {
		t.Errorf("failed refund: %v", at(ev, "data.object"))
	}
	b, _ = SampleWith("checkout.session.completed", SampleOptions{Suffix: "x", Livemode: true})
	_ = json.Unmarshal(b, &ev)
	if at(ev, "data.object.id") != "cs_live_x" || at(ev, "livemode") != true {
		t.Errorf("live session: %v", ev)
	}
}
