package billingtest

import (
	"github.com/stripe/stripe-go/v79"

	"billing/webhooks"
)

// Transition is a case of the subscription state machine: the events, in their order of delivery,
// and what they leave: the status, the hold ("" for none), and whether the policy grants access.
// Billing checks the state, entitlements the access, over the one table.
type Transition struct {
	Name     string
	Events   []webhooks.Event
	Status   string
	Hold     string
	Entitled bool
}

// Transitions are the state machine's cases, on subscription sub_1 of customer cus_1.
func Transitions() []Transition {
	s1 := Sub{ID: "sub_1", Customer: "cus_1", Status: "active", Price: "price_pro", PeriodStart: 0, PeriodEnd: 30 * 86400}
	inv := Invoice{ID: "in_1", Customer: "cus_1", Subscription: "sub_1", Currency: "usd", AmountDue: 2000, AttemptCount: 1, URL: "https://invoice.stripe.com/i/1", NextAttempt: 3 * 86400}
	return []Transition{
		{"created trialing", []webhooks.Event{Created("e1", 1, s1.With("trialing"))}, "trialing", "", true},
		{"created active", []webhooks.Event{Created("e1", 1, s1)}, "active", "", true},
		{"created incomplete", []webhooks.Event{Created("e1", 1, s1.With("incomplete"))}, "incomplete", "", false},
		{"incomplete to active", []webhooks.Event{Created("e1", 1, s1.With("incomplete")), Updated("e2", 2, s1)}, "active", "", true},
		{"incomplete to incomplete_expired", []webhooks.Event{Created("e1", 1, s1.With("incomplete")), Updated("e2", 2, s1.With("incomplete_expired"))}, "incomplete_expired", "", false},
		{"trialing to active", []webhooks.Event{Created("e1", 1, s1.With("trialing")), Updated("e2", 2, s1)}, "active", "", true},
		{"trialing to paused", []webhooks.Event{Created("e1", 1, s1.With("trialing")), Updated("e2", 2, s1.With("paused"))}, "paused", "", false},
		{"paused to active", []webhooks.Event{Created("e1", 1, s1.With("paused")), Updated("e2", 2, s1)}, "active", "", true},
		{"active to past_due is a hold", []webhooks.Event{Created("e1", 1, s1), Updated("e2", 2, s1.With("past_due"))}, "past_due", "past_due", true},
		{"past_due back to active lifts it", []webhooks.Event{Created("e1", 1, s1), Updated("e2", 2, s1.With("past_due")), Updated("e3", 3, s1)}, "active", "", true},
		{"past_due to unpaid", []webhooks.Event{Created("e1", 1, s1), Updated("e2", 2, s1.With("past_due")), Updated("e3", 3, s1.With("unpaid"))}, "unpaid", "unpaid", false},
		{"unpaid to active", []webhooks.Event{Updated("e2", 2, s1.With("unpaid")), Updated("e3", 3, s1)}, "active", "", true},
		{"active to canceled by deleted", []webhooks.Event{Created("e1", 1, s1), Deleted("e2", 2, s1.With("canceled"))}, "canceled", "", false},
		{"deleted with a non-terminal snapshot still cancels", []webhooks.Event{Created("e1", 1, s1), Deleted("e2", 2, s1)}, "canceled", "", false},
		{"past_due canceled: no hold on a terminal subscription", []webhooks.Event{Updated("e1", 1, s1.With("past_due")), Failed("f1", 1, inv), Deleted("e2", 2, s1.With("canceled"))}, "canceled", "", false},
		{"unknown future status kept", []webhooks.Event{Created("e1", 1, s1), Updated("e2", 2, s1.With("suspended_for_audit"))}, "suspended_for_audit", "", false},
		{"unknown status can move on", []webhooks.Event{Updated("e1", 1, s1.With("suspended_for_audit")), Updated("e2", 2, s1)}, "active", "", true},
		{"payment_failed puts an active customer on hold", []webhooks.Event{Created("e1", 1, s1), Failed("f1", 2, inv)}, "active", "payment_failed", true},
		{"payment_failed then past_due", []webhooks.Event{Created("e1", 1, s1), Failed("f1", 2, inv), Updated("e2", 2, s1.With("past_due"))}, "past_due", "payment_failed", true},
		{"unpaid outranks payment_failed", []webhooks.Event{Created("e1", 1, s1), Failed("f1", 2, inv), Updated("e2", 3, s1.With("unpaid"))}, "unpaid", "unpaid", false},
		{"payment_succeeded lifts the payment hold", []webhooks.Event{Created("e1", 1, s1), Failed("f1", 2, inv), Succeeded("p1", 3, inv)}, "active", "", true},
		{"payment_succeeded does not lift a past_due status hold", []webhooks.Event{Updated("e1", 2, s1.With("past_due")), Failed("f1", 2, inv), Succeeded("p1", 3, inv)}, "past_due", "past_due", true},
		{"newer active snapshot supersedes the payment hold", []webhooks.Event{Created("e1", 1, s1), Failed("f1", 2, inv), Updated("e2", 2, s1.With("past_due")), Updated("e3", 5, s1)}, "active", "", true},
		{"active snapshot of the same second does not lift a failure", []webhooks.Event{Failed("f1", 2, inv), Updated("e2", 2, s1)}, "active", "payment_failed", true},
		{"trial_will_end snapshot applies", []webhooks.Event{SubEvent("t1", string(stripe.EventTypeCustomerSubscriptionTrialWillEnd), 1, s1.With("trialing"))}, "trialing", "", true},
	}
}
