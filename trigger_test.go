package main

import (
	"encoding/json"
	"net/http"
	"slices"
	"testing"

	"billing/internal/apitest"
	"billing/internal/stripeevents"
)

// Every event type the service handles has a sample (billing trigger's) of that type, and the
// running service processes each one: a handler registered without a sample fails here, and so
// does a sample its handler refuses.
func TestTriggerHasASampleOfEveryHandledType(t *testing.T) {
	t.Parallel()
	types := handledEventTypes()
	if len(types) < 20 {
		t.Fatalf("only %d handled types: is the registry wired?", len(types))
	}
	for _, typ := range types {
		payload, err := stripeevents.SampleWith(typ, stripeevents.SampleOptions{Suffix: "s"})
		if err != nil {
			t.Errorf("%s: %v", typ, err)
			continue
		}
		var ev struct {
			Type string `json:"type"`
			Data struct {
				Object map[string]any `json:"object"`
			} `json:"data"`
		}
		if err := json.Unmarshal(payload, &ev); err != nil {
			t.Errorf("%s: the sample is not JSON: %v", typ, err)
			continue
		}
		if ev.Type != typ {
			t.Errorf("the sample of %s has type %q", typ, ev.Type)
		}
		if _, ok := ev.Data.Object["object"].(string); !ok {
			t.Errorf("the sample of %s carries no Stripe object: %v", typ, ev.Data.Object)
		}
	}
	if t.Failed() {
		return
	}

	// One linked user with a charge and a refund, so that the samples name objects the handlers
	// find and apply to, not only ones they acknowledge as not the service's.
	d := newDevService(t)
	app := apitest.AppToken
	status, link := d.do(app, http.MethodPut, "/v1/customers/u_samples", map[string]any{"email": "samples@example.com"})
	cus, _ := link["stripe_customer_id"].(string)
	if status != http.StatusCreated || cus == "" {
		t.Fatalf("PUT customer: %d %v", status, link)
	}
	status, charge := d.do(app, http.MethodPost, "/v1/charges", map[string]any{"order_id": "o_samples", "user_id": "u_samples", "amount": 2000, "currency": "usd"})
	pi, _ := charge["payment_intent_id"].(string)
	if status != http.StatusCreated || pi == "" {
		t.Fatalf("POST charge: %d %v", status, charge)
	}
	status, refund := d.do(app, http.MethodPost, "/v1/charges/o_samples/refunds", map[string]any{"refund_id": "r_samples", "amount": 500})
	re, _ := refund["stripe_refund_id"].(string)
	if status != http.StatusCreated || re == "" {
		t.Fatalf("POST refund: %d %v", status, refund)
	}
	d.start(t)
	wait := eventWaiter{db: d.app.DB}
	o := stripeevents.SampleOptions{Suffix: "samples", Customer: cus, UserID: "u_samples", OrderID: "o_samples",
		PaymentIntent: pi, RefundID: "r_samples", Refund: re, Amount: 2000, AmountRefunded: 500}
	// customer.deleted ends the link the others apply to: last.
	slices.SortStableFunc(types, func(a, b string) int {
		return boolInt(a == "customer.deleted") - boolInt(b == "customer.deleted")
	})
	for _, typ := range types {
		id, _ := d.webhook(typ, o)
		wait.processed(t, id)
	}
	// The charge sample carries what its handler reads: the refunded amount.
	if _, got := d.do(app, http.MethodGet, "/v1/charges/o_samples", nil); got["amount_refunded"] != float64(500) {
		t.Errorf("after charge.refunded: %v", got)
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
