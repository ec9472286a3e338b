package entitlements

import (
	"cmp"
	"slices"
	"time"

	"billing/billing"
)

// Policy is the entitlement policy: the one place that says who gets access.
type Policy struct {
	// PastDueEntitled keeps access while Stripe retries a failed payment (policy.past_due_entitled).
	PastDueEntitled bool
	// PausedCollectionEntitled keeps access while collection is paused (pause_collection on an
	// active, trialing or past_due subscription; policy.paused_collection_entitled).
	PausedCollectionEntitled bool
	// PeriodGrace is how long past its renewal is due (RenewalDue) an active or trialing
	// subscription stays entitled when no renewal has reached the local state
	// (policy.period_grace). Zero means none: access ends when the period does.
	PeriodGrace time.Duration
}

// Entitled reports whether one subscription grants access at now:
//   - trialing and active: yes, until RenewalDue + PeriodGrace (see Unconfirmed);
//   - past_due: yes unless PastDueEntitled is off;
//   - unpaid, canceled, incomplete, incomplete_expired, paused, and any unknown status: no;
//   - cancel_at_period_end: as above until the current period ends, then no, even if the
//     cancellation event has not arrived yet.
func (p Policy) Entitled(s *billing.Subscription, now time.Time) bool {
	ok, _ := p.decide(s, now)
	return ok
}

// FeaturesGranted reports whether the subscription grants the customer's features (Stripe's
// active entitlements) at now: while it is entitled and not on hold. A hold may keep access
// (policy.past_due_entitled lets the customer in to pay), but what the plan adds waits for the
// payment; a renewal not confirmed withdraws access, and the features with it.
func (p Policy) FeaturesGranted(s *billing.Subscription, now time.Time) bool {
	if !p.Entitled(s, now) {
		return false
	}
	_, _, held := s.Hold()
	return !held
}

// Unconfirmed returns the renewal that withdraws access at now because nothing from Stripe says
// it happened: the subscription is active or trialing, would be entitled, but is more than
// PeriodGrace past RenewalDue. Nil otherwise, including when access ends for another reason.
func (p Policy) Unconfirmed(s *billing.Subscription, now time.Time) *time.Time {
	_, since := p.decide(s, now)
	return since
}

func (p Policy) decide(s *billing.Subscription, now time.Time) (ok bool, unconfirmed *time.Time) {
	switch s.Status {
	case billing.StatusTrialing, billing.StatusActive:
		ok = true
	case billing.StatusPastDue:
		ok = p.PastDueEntitled
	}
	if ok && s.CollectionPaused(now) && !p.PausedCollectionEntitled {
		ok = false
	}
	if ok && s.CancelAtPeriodEnd && s.CurrentPeriodEnd != nil && !now.Before(*s.CurrentPeriodEnd) {
		ok = false
	}
	// Stripe renews (or ends) a subscription when its period or trial ends and tells us by an
	// event; a lost event must not leave access open forever. The re-read job scheduled for
	// that moment normally moves the period on before the grace runs out.
	if due := s.RenewalDue(); ok && due != nil && !now.Before(due.Add(p.PeriodGrace)) {
		return false, due
	}
	return ok, nil
}

// statusPreference orders statuses for picking the subscription to report when none (or
// several) are entitled: the one in the best standing first.
func statusPreference(status string) int {
	switch status {
	case billing.StatusActive:
		return 0
	case billing.StatusTrialing:
		return 1
	case billing.StatusPastDue:
		return 2
	case billing.StatusPaused:
		return 3
	case billing.StatusUnpaid:
		return 4
	case billing.StatusIncomplete:
		return 5
	case billing.StatusCanceled:
		return 6
	case billing.StatusIncompleteExpired:
		return 7
	}
	return 8
}

// Best returns the subscription an entitlement reports: entitled ones first, then by status
// preference, then the latest current period end, then the latest status change, then by id
// (so the answer is deterministic). Nil when subs is empty.
func (p Policy) Best(subs []billing.Subscription, now time.Time) *billing.Subscription {
	if len(subs) == 0 {
		return nil
	}
	sorted := slices.Clone(subs)
	slices.SortStableFunc(sorted, func(a, b billing.Subscription) int {
		ea, eb := p.Entitled(&a, now), p.Entitled(&b, now)
		if ea != eb {
			if ea {
				return -1
			}
			return 1
		}
		if c := cmp.Compare(statusPreference(a.Status), statusPreference(b.Status)); c != 0 {
			return c
		}
		if c := billing.CompareTime(a.CurrentPeriodEnd, b.CurrentPeriodEnd, true); c != 0 {
			return c
		}
		if c := billing.CompareTime(a.StatusSince, b.StatusSince, true); c != 0 {
			return c
		}
		return cmp.Compare(a.SubscriptionID, b.SubscriptionID)
	})
	return &sorted[0]
}
