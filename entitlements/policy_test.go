package entitlements

import (
	"net/http"
	"testing"
	"time"

	"billing/billing"
	"billing/billing/billingtest"
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

// TestPolicyPeriodGrace: an active or trialing subscription is entitled until its renewal is due
// plus the grace, not a second longer, and the answer says which renewal is unconfirmed.
func TestPolicyPeriodGrace(t *testing.T) {
	t.Parallel()
	end, trialEnd := at(5000), at(3000)
	p := Policy{PastDueEntitled: true, PeriodGrace: grace}
	tests := []struct {
		name string
		s    billing.Subscription
		now  time.Time
		want bool
		// unconfirmed is the renewal Unconfirmed names, nil for none.
		unconfirmed *time.Time
	}{
		{"active at its period end", billing.Subscription{Status: billing.StatusActive, CurrentPeriodEnd: &end}, end, true, nil},
		{"active a second before the grace runs out", billing.Subscription{Status: billing.StatusActive, CurrentPeriodEnd: &end}, end.Add(grace - time.Second), true, nil},
		{"active when the grace runs out", billing.Subscription{Status: billing.StatusActive, CurrentPeriodEnd: &end}, end.Add(grace), false, &end},
		{"active long after", billing.Subscription{Status: billing.StatusActive, CurrentPeriodEnd: &end}, end.AddDate(1, 0, 0), false, &end},
		{"trialing: the trial's end counts", billing.Subscription{Status: billing.StatusTrialing, TrialEnd: &trialEnd, CurrentPeriodEnd: &end}, trialEnd.Add(grace), false, &trialEnd},
		{"trialing within the grace", billing.Subscription{Status: billing.StatusTrialing, TrialEnd: &trialEnd, CurrentPeriodEnd: &end}, trialEnd.Add(grace - time.Second), true, nil},
		{"trialing without trial_end: the period's end", billing.Subscription{Status: billing.StatusTrialing, CurrentPeriodEnd: &end}, end.Add(grace), false, &end},
		{"no period known", billing.Subscription{Status: billing.StatusActive}, end.Add(grace), true, nil},
		{"past_due waits on Stripe's retries", billing.Subscription{Status: billing.StatusPastDue, CurrentPeriodEnd: &end}, end.Add(grace), true, nil},
		{"canceling at period end: over, and not for want of a renewal", billing.Subscription{Status: billing.StatusActive, CurrentPeriodEnd: &end, CancelAtPeriodEnd: true}, end.Add(grace), false, nil},
		{"canceled", billing.Subscription{Status: billing.StatusCanceled, CurrentPeriodEnd: &end}, end.Add(grace), false, nil},
	}
	for _, tc := range tests {
		if got := p.Entitled(&tc.s, tc.now); got != tc.want {
			t.Errorf("%s: Entitled = %v, want %v", tc.name, got, tc.want)
		}
		if got := p.Unconfirmed(&tc.s, tc.now); ptrTime(got) != ptrTime(tc.unconfirmed) {
			t.Errorf("%s: Unconfirmed = %s, want %s", tc.name, ptrTime(got), ptrTime(tc.unconfirmed))
		}
	}

	// The service decides with its injected clock, and the answer carries the unconfirmed renewal.
	e := newEnv(t)
	e.link(t, "u_g", "cus_g", "g@example.com")
	e.mustHandle(t, created("evt_g", 10, subObj{ID: "sub_g", Customer: "cus_g", Status: billing.StatusActive, Price: "p", PeriodStart: 10, PeriodEnd: 5000}))
	e.clock.Set(at(5000).Add(billing.DefaultPeriodGrace - time.Second))
	var ent map[string]any
	if code, body := e.get(t, "/v1/customers/u_g/entitlement", &ent); code != http.StatusOK || ent["entitled"] != true || ent["unconfirmed_since"] != nil {
		t.Errorf("within the default grace: %d %s", code, body)
	}
	e.clock.Set(at(5000).Add(billing.DefaultPeriodGrace))
	if code, body := e.get(t, "/v1/customers/u_g/entitlement", &ent); code != http.StatusOK || ent["entitled"] != false ||
		ent["status"] != billing.StatusActive || ent["unconfirmed_since"] != "2024-06-01T01:23:20Z" {
		t.Errorf("past the default grace: %d %s", code, body)
	}
	if v := e.customerView(t, "u_g"); len(v.Subscriptions) != 1 || v.Subscriptions[0].Entitled || ptrTime(v.Subscriptions[0].UnconfirmedSince) != "2024-06-01T01:23:20Z" {
		t.Errorf("customer view past the grace: %+v", v.Subscriptions)
	}
}

// The access each case of the state machine grants, by the policy over the row the events leave
// (billing's TestSubscriptionTransitions checks the row itself).
func TestPolicyOverTheTransitions(t *testing.T) {
	t.Parallel()
	for _, tc := range billingtest.Transitions() {
		t.Run(tc.Name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.mustHandle(t, tc.Events...)
			if got := e.svc.policy.Entitled(e.sub(t, "sub_1"), e.clock.Now()); got != tc.Entitled {
				t.Errorf("entitled = %v, want %v", got, tc.Entitled)
			}
		})
	}
}
