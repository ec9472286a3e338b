package entitlements

import (
	"billing/billing"
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
		{billing.StatusTrialing, true, true},
		{billing.StatusActive, true, true},
		{billing.StatusPastDue, true, true},
		{billing.StatusPastDue, false, false},
		{billing.StatusActive, false, true},
		{billing.StatusTrialing, false, true},
		{billing.StatusUnpaid, true, false},
		{billing.StatusCanceled, true, false},
		{billing.StatusIncomplete, true, false},
		{billing.StatusIncompleteExpired, true, false},
		{billing.StatusPaused, true, false},
		{"some_future_status", true, false},
		{"", true, false},
	}
	for _, tc := range tests {
		p := Policy{PastDueEntitled: tc.pastDueEntitled}
		s := &billing.Subscription{Status: tc.status, CurrentPeriodEnd: tp(at(5000))}
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
		{"before period end", billing.StatusActive, at(4999), &end, true},
		{"at period end", billing.StatusActive, at(5000), &end, false},
		{"after period end", billing.StatusActive, at(9000), &end, false},
		{"trialing before end", billing.StatusTrialing, at(10), &end, true},
		{"past_due after end", billing.StatusPastDue, at(9000), &end, false},
		{"no period end known", billing.StatusActive, at(9000), nil, true},
	}
	// Every "now" lies within the grace, which TestPolicyPeriodGrace covers.
	p := Policy{PastDueEntitled: true, PeriodGrace: 2 * time.Hour}
	for _, tc := range tests {
		s := &billing.Subscription{Status: tc.status, CancelAtPeriodEnd: true, CurrentPeriodEnd: tc.end}
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
	sub := func(id, status string, periodEnd int64) billing.Subscription {
		return billing.Subscription{SubscriptionID: id, Status: status, CurrentPeriodEnd: tp(at(periodEnd))}
	}
	tests := []struct {
		name            string
		subs            []billing.Subscription
		pastDueEntitled bool
		want            string
	}{
		{"none", nil, true, ""},
		{"entitled beats a better-looking status", []billing.Subscription{sub("a", billing.StatusCanceled, 9000), sub("b", billing.StatusPastDue, 2000)}, true, "b"},
		{"active beats trialing", []billing.Subscription{sub("a", billing.StatusTrialing, 9000), sub("b", billing.StatusActive, 2000)}, true, "b"},
		{"later period end among equals", []billing.Subscription{sub("a", billing.StatusActive, 2000), sub("b", billing.StatusActive, 3000)}, true, "b"},
		{"id breaks full ties", []billing.Subscription{sub("b", billing.StatusActive, 2000), sub("a", billing.StatusActive, 2000)}, true, "a"},
		{"past_due not entitled: unpaid vs canceled picks unpaid", []billing.Subscription{sub("a", billing.StatusCanceled, 2000), sub("b", billing.StatusUnpaid, 2000)}, false, "b"},
		{"past_due not entitled: active wins", []billing.Subscription{sub("a", billing.StatusPastDue, 9000), sub("b", billing.StatusActive, 2000)}, false, "b"},
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
		s         billing.Subscription
		want      string
		wantSince *time.Time
	}{
		{"active, nothing", billing.Subscription{Status: billing.StatusActive}, "", nil},
		{"past_due", billing.Subscription{Status: billing.StatusPastDue, StatusSince: &t2}, billing.HoldPastDue, &t2},
		{"unpaid", billing.Subscription{Status: billing.StatusUnpaid, StatusSince: &t2}, billing.HoldUnpaid, &t2},
		{"payment failed", billing.Subscription{Status: billing.StatusActive, PaymentHold: true, PaymentHoldSince: &t2, InvEventCreated: &t2, SubEventCreated: &t1}, billing.HoldPaymentFailed, &t2},
		{"payment failed and past_due: earliest since", billing.Subscription{Status: billing.StatusPastDue, StatusSince: &t3, PaymentHold: true, PaymentHoldSince: &t2, InvEventCreated: &t3, SubEventCreated: &t3}, billing.HoldPaymentFailed, &t2},
		{"unpaid outranks payment failed", billing.Subscription{Status: billing.StatusUnpaid, StatusSince: &t3, PaymentHold: true, PaymentHoldSince: &t2, InvEventCreated: &t2, SubEventCreated: &t3}, billing.HoldUnpaid, &t2},
		{"canceled is never on hold", billing.Subscription{Status: billing.StatusCanceled, PaymentHold: true, PaymentHoldSince: &t2, InvEventCreated: &t2}, "", nil},
		{"incomplete_expired is never on hold", billing.Subscription{Status: billing.StatusIncompleteExpired, PaymentHold: true, PaymentHoldSince: &t2, InvEventCreated: &t2}, "", nil},
		{"newer active snapshot lifts a payment hold", billing.Subscription{Status: billing.StatusActive, PaymentHold: true, PaymentHoldSince: &t1, InvEventCreated: &t1, SubEventCreated: &t2}, "", nil},
		{"newer trialing snapshot lifts a payment hold", billing.Subscription{Status: billing.StatusTrialing, PaymentHold: true, PaymentHoldSince: &t1, InvEventCreated: &t1, SubEventCreated: &t2}, "", nil},
		{"newer paused snapshot does not", billing.Subscription{Status: billing.StatusPaused, PaymentHold: true, PaymentHoldSince: &t1, InvEventCreated: &t1, SubEventCreated: &t2}, billing.HoldPaymentFailed, &t1},
		{"placeholder with a failure", billing.Subscription{Status: billing.StatusIncomplete, PaymentHold: true, PaymentHoldSince: &t1, InvEventCreated: &t1}, billing.HoldPaymentFailed, &t1},
		{"unknown status, no failure", billing.Subscription{Status: "future"}, "", nil},
	}
	for _, tc := range tests {
		reason, since, ok := tc.s.Hold()
		if reason != tc.want || ok != (tc.want != "") || ptrTime(since) != ptrTime(tc.wantSince) {
			t.Errorf("%s: Hold = %q since %s (%v), want %q since %s", tc.name, reason, ptrTime(since), ok, tc.want, ptrTime(tc.wantSince))
		}
	}
}
