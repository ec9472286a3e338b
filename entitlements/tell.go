package entitlements

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"time"

	"gorm.io/gorm"

	"billing/appevents"
	"billing/billing"
)

// The app is told of every change of a user's entitlement answer (entitlement.updated), in the
// transaction of the change: whatever wrote a subscription, an invoice's hold (billing, through
// billing.Teller), a customer's features or a user's link tells the user afterwards, and appevents writes an event when the
// answer differs from the one last told. Time alone changes the answer too (a period ends
// without a renewal, a grace or a trial ends): the moment is planned with each answer, and the
// app events sweeper tells it then (TellUser again, by the clock).

// tellCustomer tells the entitlement of the users linked to a Stripe customer, if any, when the
// customer is of the deployment's world (the other world has no app to tell): after a write of
// the customer's features.
func (s *Service) tellCustomer(ctx context.Context, tx *gorm.DB, customerID string, livemode bool) error {
	if s.teller == nil || livemode != s.livemode || customerID == "" {
		return nil
	}
	users, err := billing.LinkedUsers(ctx, tx, customerID, livemode)
	if err != nil {
		return fmt.Errorf("tell customer %s: %w", customerID, err)
	}
	for _, u := range users {
		if err := s.TellUser(ctx, tx, u); err != nil {
			return err
		}
	}
	return nil
}

// TellUser tells, in tx, the user's entitlement answer as GET …/entitlement would give it right
// after tx commits, if it differs from the last one told, and plans the next moment at which
// time alone changes it. Callers that change what the answer is made of (a link of the user to
// a customer) call it after their change; it is also the sweeper's call when that moment comes.
func (s *Service) TellUser(ctx context.Context, tx *gorm.DB, userID string) error {
	if s.teller == nil {
		return nil
	}
	l, err := s.teller.Lock(ctx, tx, userID, s.livemode, appevents.SubjectEntitlement)
	if err != nil {
		return err
	}
	rd, err := s.readEntitlementOn(ctx, tx.Statement.ConnPool, entitlementQuery, userID)
	if err != nil && !errors.Is(err, ErrNoCustomer) {
		return err
	}
	now := s.now()
	e := s.entitlementOf(userID, rd.subs, rd.features, now)
	_, err = s.teller.Tell(ctx, tx, l, appevents.Change{
		Type:         appevents.TypeEntitlementUpdated,
		Answer:       e,
		Baseline:     NoneAnswer(userID),
		WithPrevious: true,
		Plan:         true,
		NextChangeAt: s.nextChange(userID, rd.subs, rd.features, now, e),
	})
	return err
}

// NoneAnswer is the answer of a user with nothing (no customer, no subscription): what counts
// as told before the user's first event, so that a user linked without a subscription is no news.
func NoneAnswer(userID string) json.RawMessage {
	b, _ := json.Marshal(Entitlement{UserID: userID, Status: billing.StatusNone, Features: noFeatures})
	return b
}

// nextChange is the first moment after now at which the answer of these subscriptions differs
// from e by the clock alone, or nil. The policy changes its mind only at the instants its rules
// compare the clock with (a period's or trial's end, with and without the grace; collection
// resuming), so the answer is computed at each of those instants, in order.
func (s *Service) nextChange(userID string, subs []billing.Subscription, features []string, now time.Time, e Entitlement) *time.Time {
	var at []time.Time
	add := func(t *time.Time) {
		if t == nil {
			return
		}
		for _, c := range []time.Time{*t, t.Add(s.policy.PeriodGrace)} {
			if c.After(now) {
				at = append(at, c)
			}
		}
	}
	for i := range subs {
		sub := &subs[i]
		add(sub.CurrentPeriodEnd)
		add(sub.TrialEnd)
		add(sub.PauseCollectionResumesAt)
		add(sub.RenewalDue())
	}
	slices.SortFunc(at, func(a, b time.Time) int { return a.Compare(b) })
	for _, t := range slices.Compact(at) {
		if later := s.entitlementOf(userID, subs, features, t); !reflect.DeepEqual(later, e) {
			t = t.UTC()
			return &t
		}
	}
	return nil
}

// EntitlementAnswer is the user's entitlement answer now as JSON, the none answer for a user
// without a customer: what the app would read, for `billing verify`'s check of what was told.
func (s *Service) EntitlementAnswer(ctx context.Context, userID string) (json.RawMessage, error) {
	e, err := s.Entitlement(ctx, userID)
	if errors.Is(err, ErrNoCustomer) {
		return NoneAnswer(userID), nil
	}
	if err != nil {
		return nil, err
	}
	return json.Marshal(e)
}
