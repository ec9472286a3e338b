package entitlements

import (
	"fmt"
	"time"

	"billing/billing"
)

// EntitlementReason says in words, for an operator, why a subscription does or does not grant
// access at now. Whether it does is Entitled's answer, never decided here: the words only explain
// it, so they cannot disagree with the policy.
func (p Policy) EntitlementReason(s *billing.Subscription, now time.Time) string {
	if p.Entitled(s, now) {
		return "Entitled: " + p.entitledBecause(s, now)
	}
	return "Not entitled: " + p.notEntitledBecause(s, now)
}

func (p Policy) entitledBecause(s *billing.Subscription, now time.Time) string {
	var why string
	switch s.Status {
	case billing.StatusTrialing:
		why = "the subscription is trialing, and a trial grants access"
		if s.TrialEnd != nil {
			why += " (the trial ends " + reasonTime(s.TrialEnd) + ")"
		}
	case billing.StatusActive:
		why = "the subscription is active"
	case billing.StatusPastDue:
		return "the last payment failed and Stripe is retrying it (past_due); policy.past_due_entitled keeps access meanwhile."
	default:
		why = "the subscription is " + s.Status
	}
	if s.CancelAtPeriodEnd && s.CurrentPeriodEnd != nil {
		return why + "; it is set to cancel at the end of the period, so access ends " + reasonTime(s.CurrentPeriodEnd) + "."
	}
	if due := s.RenewalDue(); due != nil && !now.Before(*due) {
		return why + "; its period ended " + reasonTime(due) + " and no renewal has reached the local state yet: access continues for the grace period (policy.period_grace) while Stripe is asked."
	}
	return why + "."
}

func (p Policy) notEntitledBecause(s *billing.Subscription, now time.Time) string {
	switch s.Status {
	case billing.StatusTrialing, billing.StatusActive:
		if s.CancelAtPeriodEnd && s.CurrentPeriodEnd != nil && !now.Before(*s.CurrentPeriodEnd) {
			return "it was set to cancel at the end of its period, which ended " + reasonTime(s.CurrentPeriodEnd) +
				"; access ends then even before Stripe's cancellation event arrives."
		}
		if due := s.RenewalDue(); due != nil && !now.Before(*due) {
			return "its " + periodWord(s) + " ended " + reasonTime(due) +
				" and no renewal from Stripe has reached the local state within the grace period (policy.period_grace)."
		}
		return "the subscription is " + s.Status + ", but the policy withholds access."
	case billing.StatusPastDue:
		return "the last payment failed and Stripe is retrying it (past_due), and policy.past_due_entitled is off."
	case billing.StatusUnpaid:
		return "Stripe stopped retrying the failed payment (unpaid); access returns when an invoice is paid."
	case billing.StatusCanceled:
		if s.EndedAt != nil {
			return "the subscription was canceled and ended " + reasonTime(s.EndedAt) + "; canceled is final."
		}
		return "the subscription is canceled; canceled is final."
	case billing.StatusIncomplete:
		if s.SubEventCreated == nil {
			return "no subscription event has arrived yet: this row was made by an invoice event and waits for the subscription's own."
		}
		return "the first payment has not succeeded yet (incomplete)."
	case billing.StatusIncompleteExpired:
		return "the first payment never succeeded and Stripe expired the subscription (incomplete_expired); that is final."
	case billing.StatusPaused:
		return "the subscription is paused (a trial ended without a payment method)."
	}
	return fmt.Sprintf("the status %q is unknown to this service, and an unknown status never grants access.", s.Status)
}

func periodWord(s *billing.Subscription) string {
	if s.Status == billing.StatusTrialing && s.TrialEnd != nil {
		return "trial"
	}
	return "period"
}

func reasonTime(t *time.Time) string {
	return t.UTC().Format("January 2, 2006 15:04 UTC")
}

// FeatureReason says in words why a feature is allowed or not: best is the subscription the
// entitlement reports (nil when the user has none), listed whether the feature is among the
// customer's active entitlements at Stripe. Whether it is allowed is FeatureAllowed's answer;
// the words only explain it.
func (p Policy) FeatureReason(best *billing.Subscription, feature string, listed bool, now time.Time) string {
	switch {
	case best == nil:
		return "Not allowed: the user has no subscription, and features come with one."
	case !p.Entitled(best, now):
		return "Not allowed: features follow access, and " + p.notEntitledBecause(best, now)
	case !p.FeaturesGranted(best, now):
		reason, _, _ := best.Hold()
		return "Not allowed: the subscription is on hold (" + reason + "); its features are withheld until the invoice is paid."
	case !listed:
		return "Not allowed: " + feature + " is not among the customer's active entitlements at Stripe."
	}
	return "Allowed: " + feature + " is among the customer's active entitlements at Stripe, and " + p.entitledBecause(best, now)
}

// FeatureAllowed reports whether a feature is allowed: listed among the customer's active
// entitlements, and granted by the policy (best is the subscription the entitlement reports).
func (p Policy) FeatureAllowed(best *billing.Subscription, listed bool, now time.Time) bool {
	return listed && best != nil && p.FeaturesGranted(best, now)
}
