package entitlements

import (
	"context"
	"time"

	"billing/billing"
)

// The admin console's reads of the policy: a subscription's state (billing's) with the policy's
// answer and words, and a Stripe customer's subscriptions of one mode with the entitlement the API
// would answer and why. Their invoices and notices are billing's reads.

// SubscriptionState is one subscription as the console shows it: billing's state, and the
// policy's answer on it.
type SubscriptionState struct {
	billing.SubscriptionState
	// Entitled and Reason are the policy's answer at the time of the read, and why.
	Entitled bool
	Reason   string
	// Features are the customer's active entitlements as stored; FeaturesGranted whether the
	// policy grants them through this subscription now.
	Features        CustomerFeatures
	FeaturesGranted bool
}

// SubscriptionState returns a subscription with its customer's user and the policy's answer, or
// nil when unknown. The console sees both worlds: of an id in both, the live one.
func (s *Service) SubscriptionState(ctx context.Context, subscriptionID string) (*SubscriptionState, error) {
	raw, err := s.billing.SubscriptionState(ctx, subscriptionID)
	if err != nil || raw == nil {
		return nil, err
	}
	features, err := s.CustomerFeatures(ctx, raw.StripeCustomerID, raw.Livemode)
	if err != nil {
		return nil, err
	}
	st := s.stateOf(*raw, features, s.now())
	return &st, nil
}

func (s *Service) stateOf(raw billing.SubscriptionState, features CustomerFeatures, now time.Time) SubscriptionState {
	return SubscriptionState{
		SubscriptionState: raw,
		Entitled:          s.policy.Entitled(&raw.Subscription, now),
		Reason:            s.policy.EntitlementReason(&raw.Subscription, now),
		Features:          features,
		FeaturesGranted:   s.policy.FeaturesGranted(&raw.Subscription, now),
	}
}

// Account is a Stripe customer's subscriptions and entitlement in one mode.
type Account struct {
	// Subscriptions, newest first, each with the policy's answer and words (SubscriptionState).
	Subscriptions []SubscriptionState
	// Entitlement is what GET /v1/customers/{user_id}/entitlement answers for the customer's user
	// in this mode.
	Entitlement Entitlement
	// Reason is the policy's words about the subscription the entitlement reports, or says that
	// there is none.
	Reason string
	// Features are the customer's active entitlements as stored (the entitlement grants them
	// only as the policy says).
	Features CustomerFeatures
}

// CustomerAccount returns the subscriptions and entitlement of a Stripe customer of the mode.
func (s *Service) CustomerAccount(ctx context.Context, userID, stripeCustomerID string, livemode bool) (*Account, error) {
	raws, err := s.billing.CustomerStates(ctx, stripeCustomerID, livemode)
	if err != nil {
		return nil, err
	}
	features, err := s.CustomerFeatures(ctx, stripeCustomerID, livemode)
	if err != nil {
		return nil, err
	}
	now := s.now()
	a := &Account{Subscriptions: make([]SubscriptionState, len(raws)), Features: features}
	subs := make([]billing.Subscription, len(raws))
	for i := range raws {
		a.Subscriptions[i] = s.stateOf(raws[i], features, now)
		subs[i] = raws[i].Subscription
	}
	a.Entitlement = s.entitlementOf(userID, subs, features.LookupKeys, now)
	if best := s.policy.Best(subs, now); best != nil {
		a.Reason = s.policy.EntitlementReason(best, now)
	} else {
		a.Reason = "Not entitled: the customer has no subscription."
	}
	return a, nil
}
