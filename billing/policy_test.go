package billing

import (
	"encoding/json"
	"testing"
	"time"
)

func tp(t time.Time) *time.Time { return &t }

func TestPolicyEntitled(t *testing.T) {
	t.Parallel()
	now := at(1000)
	tests := []struct {
		status          string
		pastDueEntitled bool
		want            bool
	}{
		{StatusTrialing, true, true},
		{StatusActive, true, true},
		{StatusPastDue, true, true},
		{StatusPastDue, false, false},
		{StatusActive, false, true},
		{StatusTrialing, false, true},
		{StatusUnpaid, true, false},
		{StatusCanceled, true, false},
		{StatusIncomplete, true, false},
		{StatusIncompleteExpired, true, false},
		{StatusPaused, true, false},
		{"some_future_status", true, false},
		{"", true, false},
	}
	for _, tc := range tests {
		p := Policy{PastDueEntitled: tc.pastDueEntitled}
		s := &Subscription{Status: tc.status, CurrentPeriodEnd: tp(at(5000))}
		if got := p.Entitled(s, now); got != tc.want {
			t.Errorf("Entitled(%q, past_due_entitled=%v) = %v, want %v", tc.status, tc.pastDueEntitled, got, tc.want)
		}
	}
}

func TestPolicyCancelAtPeriodEnd(t *testing.T) {
	t.Parallel()
	end := at(5000)
	tests := []struct {
		name   string
		status string
		now    time.Time
		end    *time.Time
		want   bool
	}{
		{"before period end", StatusActive, at(4999), &end, true},
		{"at period end", StatusActive, at(5000), &end, false},
		{"after period end", StatusActive, at(9000), &end, false},
		{"trialing before end", StatusTrialing, at(10), &end, true},
		{"past_due after end", StatusPastDue, at(9000), &end, false},
		{"no period end known", StatusActive, at(9000), nil, true},
	}
	// Every "now" lies within the grace, which TestPolicyPeriodGrace covers.
	p := Policy{PastDueEntitled: true, PeriodGrace: 2 * time.Hour}
	for _, tc := range tests {
		s := &Subscription{Status: tc.status, CancelAtPeriodEnd: true, CurrentPeriodEnd: tc.end}
		if got := p.Entitled(s, tc.now); got != tc.want {
			t.Errorf("%s: Entitled = %v, want %v", tc.name, got, tc.want)
		}
		// Without cancel_at_period_end the period end does not matter (Stripe renews).
		s.CancelAtPeriodEnd = false
		if got := p.Entitled(s, tc.now); got != (tc.status != "") {
			t.Errorf("%s without cancel_at_period_end: Entitled = %v", tc.name, got)
		}
	}
}

func TestPolicyBest(t *testing.T) {
	t.Parallel()
	now := at(1000)
	sub := func(id, status string, periodEnd int64) Subscription {
		return Subscription{SubscriptionID: id, Status: status, CurrentPeriodEnd: tp(at(periodEnd))}
	}
	tests := []struct {
		name            string
		subs            []Subscription
		pastDueEntitled bool
		want            string
	}{
		{"none", nil, true, ""},
		{"entitled beats a better-looking status", []Subscription{sub("a", StatusCanceled, 9000), sub("b", StatusPastDue, 2000)}, true, "b"},
		{"active beats trialing", []Subscription{sub("a", StatusTrialing, 9000), sub("b", StatusActive, 2000)}, true, "b"},
		{"later period end among equals", []Subscription{sub("a", StatusActive, 2000), sub("b", StatusActive, 3000)}, true, "b"},
		{"id breaks full ties", []Subscription{sub("b", StatusActive, 2000), sub("a", StatusActive, 2000)}, true, "a"},
		{"past_due not entitled: unpaid vs canceled picks unpaid", []Subscription{sub("a", StatusCanceled, 2000), sub("b", StatusUnpaid, 2000)}, false, "b"},
		{"past_due not entitled: active wins", []Subscription{sub("a", StatusPastDue, 9000), sub("b", StatusActive, 2000)}, false, "b"},
	}
	for _, tc := range tests {
		p := Policy{PastDueEntitled: tc.pastDueEntitled}
		got := p.Best(tc.subs, now)
		switch {
		case tc.want == "" && got != nil:
			t.Errorf("%s: Best = %s, want nil", tc.name, got.SubscriptionID)
		case tc.want != "" && (got == nil || got.SubscriptionID != tc.want):
			t.Errorf("%s: Best = %v, want %s", tc.name, got, tc.want)
		}
	}
}

func TestHoldRules(t *testing.T) {
	t.Parallel()
	t1, t2, t3 := at(10), at(20), at(30)
	tests := []struct {
		name      string
		s         Subscription
		want      string
		wantSince *time.Time
	}{
		{"active, nothing", Subscription{Status: StatusActive}, "", nil},
		{"past_due", Subscription{Status: StatusPastDue, StatusSince: &t2}, HoldPastDue, &t2},
		{"unpaid", Subscription{Status: StatusUnpaid, StatusSince: &t2}, HoldUnpaid, &t2},
		{"payment failed", Subscription{Status: StatusActive, PaymentHold: true, PaymentHoldSince: &t2, InvEventCreated: &t2, SubEventCreated: &t1}, HoldPaymentFailed, &t2},
		{"payment failed and past_due: earliest since", Subscription{Status: StatusPastDue, StatusSince: &t3, PaymentHold: true, PaymentHoldSince: &t2, InvEventCreated: &t3, SubEventCreated: &t3}, HoldPaymentFailed, &t2},
		{"unpaid outranks payment failed", Subscription{Status: StatusUnpaid, StatusSince: &t3, PaymentHold: true, PaymentHoldSince: &t2, InvEventCreated: &t2, SubEventCreated: &t3}, HoldUnpaid, &t2},
		{"canceled is never on hold", Subscription{Status: StatusCanceled, PaymentHold: true, PaymentHoldSince: &t2, InvEventCreated: &t2}, "", nil},
		{"incomplete_expired is never on hold", Subscription{Status: StatusIncompleteExpired, PaymentHold: true, PaymentHoldSince: &t2, InvEventCreated: &t2}, "", nil},
		{"newer active snapshot lifts a payment hold", Subscription{Status: StatusActive, PaymentHold: true, PaymentHoldSince: &t1, InvEventCreated: &t1, SubEventCreated: &t2}, "", nil},
		{"newer trialing snapshot lifts a payment hold", Subscription{Status: StatusTrialing, PaymentHold: true, PaymentHoldSince: &t1, InvEventCreated: &t1, SubEventCreated: &t2}, "", nil},
		{"newer paused snapshot does not", Subscription{Status: StatusPaused, PaymentHold: true, PaymentHoldSince: &t1, InvEventCreated: &t1, SubEventCreated: &t2}, HoldPaymentFailed, &t1},
		{"placeholder with a failure", Subscription{Status: StatusIncomplete, PaymentHold: true, PaymentHoldSince: &t1, InvEventCreated: &t1}, HoldPaymentFailed, &t1},
		{"unknown status, no failure", Subscription{Status: "future"}, "", nil},
	}
	for _, tc := range tests {
		reason, since, ok := tc.s.Hold()
		if reason != tc.want || ok != (tc.want != "") || ptrTime(since) != ptrTime(tc.wantSince) {
			t.Errorf("%s: Hold = %q since %s (%v), want %q since %s", tc.name, reason, ptrTime(since), ok, tc.want, ptrTime(tc.wantSince))
		}
	}
}

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
