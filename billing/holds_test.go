package billing

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
)

// holds lists the holds the admin console shows, by subscription id.
func (e *env) holds(t *testing.T) map[string]HoldView {
	t.Helper()
	list, err := e.svc.Holds(context.Background())
	if err != nil {
		t.Fatalf("holds: %v", err)
	}
	out := map[string]HoldView{}
	for _, h := range list {
		out[h.SubscriptionID] = h
	}
	return out
}

func TestHoldsAppearAndVanish(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.link(t, "u1", "cus_1", "u1@example.com")
	inv := invObj{ID: "in_1", Customer: "cus_1", Subscription: "sub_1", Currency: "usd", AmountDue: 2500,
		AttemptCount: 1, NextAttempt: 86400, URL: "https://invoice.stripe.com/i/in_1"}
	e.mustHandle(t, created("e1", 1, s1))
	if h := e.holds(t); len(h) != 0 {
		t.Fatalf("holds before any failure: %v", h)
	}

	e.mustHandle(t, failed("f1", 100, inv))
	h, ok := e.holds(t)["sub_1"]
	if !ok {
		t.Fatal("payment failure not listed")
	}
	if ptrStr(h.UserID) != "u1" || h.StripeCustomerID != "cus_1" || h.Status != StatusActive || h.HoldReason != HoldPaymentFailed ||
		ptrTime(h.OnHoldSince) != "2024-06-01T00:01:40Z" || ptrInt(h.AttemptCount) != "1" || ptrTime(h.NextPaymentAttempt) != "2024-06-02T00:00:00Z" ||
		ptrInt(h.AmountDue) != "2500" || ptrStr(h.Currency) != "usd" || ptrStr(h.HostedInvoiceURL) != inv.URL || h.Livemode {
		t.Errorf("hold entry: %+v", h)
	}

	// An unlinked customer's hold is listed with user_id null; its JSON says so.
	e.mustHandle(t, updated("x1", 5, subObj{ID: "sub_x", Customer: "cus_unlinked", Status: StatusPastDue}))
	got := e.holds(t)
	if len(got) != 2 {
		t.Errorf("%d holds, want 2", len(got))
	}
	body, err := json.Marshal(got["sub_x"])
	if err != nil || !strings.Contains(string(body), `"subscription_id":"sub_x","stripe_customer_id":"cus_unlinked","user_id":null,"status":"past_due","hold_reason":"past_due"`) {
		t.Errorf("unlinked hold JSON: %s %v", body, err)
	}

	// Paid, and back to active: both vanish.
	e.mustHandle(t, succeeded("p1", 200, inv), updated("x2", 6, subObj{ID: "sub_x", Customer: "cus_unlinked", Status: StatusActive}))
	if got := e.holds(t); len(got) != 0 {
		t.Errorf("holds after recovery: %v", got)
	}

	// Canceled while past_due: not a hold.
	e.mustHandle(t, updated("x3", 7, subObj{ID: "sub_x", Customer: "cus_unlinked", Status: StatusUnpaid}))
	if _, ok := e.holds(t)["sub_x"]; !ok {
		t.Error("unpaid not listed")
	}
	e.mustHandle(t, deleted("x4", 8, subObj{ID: "sub_x", Customer: "cus_unlinked", Status: StatusCanceled}))
	if _, ok := e.holds(t)["sub_x"]; ok {
		t.Error("canceled subscription still listed")
	}
}
