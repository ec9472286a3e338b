package billing

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
)

// The app is told of every change of a user's entitlement answer (entitlement.updated), in the
// transaction of the change: whatever wrote a subscription, an invoice's hold, a customer's
// features or a user's link tells the user afterwards, and appevents writes an event when the
// answer differs from the one last told. Time alone changes the answer too (a period ends
// without a renewal, a grace or a trial ends): the moment is planned with each answer, and the
// app events sweeper tells it then (TellUser again, by the clock).

// tellCustomer tells the entitlement of the user linked to a Stripe customer, if any, when the
// customer is of the deployment's world (the other world has no app to tell).
func (s *Service) tellCustomer(ctx context.Context, tx *gorm.DB, customerID string, livemode bool) error {
	if s.teller == nil || livemode != s.livemode || customerID == "" {
		return nil
	}
	var users []string
	rows, err := tx.Statement.ConnPool.QueryContext(ctx,
		`SELECT user_id FROM customers WHERE stripe_customer_id = $1 AND livemode = $2`, customerID, livemode)
	if err != nil {
		return fmt.Errorf("tell customer %s: %w", customerID, err)
	}
	for rows.Next() {
		var u string
		if err := rows.Scan(&u); err != nil {
			rows.Close()
			return fmt.Errorf("tell customer %s: %w", customerID, err)
		}
		users = append(users, u)
	}
	if err := rows.Close(); err != nil {
		return fmt.Errorf("tell customer %s: %w", customerID, err)
	}
	for _, u := range users {
		if err := s.TellUser(ctx, tx, u); err != nil {
			return err
		}
	}
	return nil
}

// linkedUserReturning ends a subscription's UPDATE (whose $2 is the mode) with the user linked
// to the row's customer: the tell after an applied event needs no lookup of its own, one
// statement less on the path of every event. It is read under the row's lock, after the
// change, as the lookup after it would be.
const linkedUserReturning = `
		RETURNING (SELECT c.user_id FROM customers c WHERE c.stripe_customer_id = subscriptions.stripe_customer_id AND c.livemode = $2)`

// updateReturningUser runs an UPDATE of one subscription that ends with linkedUserReturning and
// returns the rows it changed and the linked user (nil: none, or nothing changed).
func updateReturningUser(ctx context.Context, tx *gorm.DB, query string, args ...any) (int64, *string, error) {
	rows, err := tx.Statement.ConnPool.QueryContext(ctx, query, args...)
	if err != nil {
		return 0, nil, err
	}
	defer rows.Close()
	var n int64
	var user *string
	for rows.Next() {
		n++
		if err := rows.Scan(&user); err != nil {
			return 0, nil, err
		}
	}
	return n, user, rows.Err()
}

// tellLinkedUser tells the entitlement of user (nil: no user is linked) when the change is of the
// deployment's world.
func (s *Service) tellLinkedUser(ctx context.Context, tx *gorm.DB, user *string, livemode bool) error {
	if s.teller == nil || livemode != s.livemode || user == nil {
		return nil
	}
	return s.TellUser(ctx, tx, *user)
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
	b, _ := json.Marshal(Entitlement{UserID: userID, Status: StatusNone, Features: noFeatures})
	return b
}

// nextChange is the first moment after now at which the answer of these subscriptions differs
// from e by the clock alone, or nil. The policy changes its mind only at the instants its rules
// compare the clock with (a period's or trial's end, with and without the grace; collection
// resuming), so the answer is computed at each of those instants, in order.
func (s *Service) nextChange(userID string, subs []Subscription, features []string, now time.Time, e Entitlement) *time.Time {
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
