package billing

import (
	"context"
	"fmt"

	"gorm.io/gorm"
)

// The app is told of every change of a user's entitlement answer, in the transaction of the
// change (docs/app-events.md). The answer is the entitlements package's; billing only says whose
// answer a change may have moved, through Teller, after every write of a subscription or its hold.

// Teller tells, in tx, a user's entitlement answer if it changed: entitlements.Service, set by
// main (SetTeller). The entitlements package builds on billing, so billing names only this.
type Teller interface {
	TellUser(ctx context.Context, tx *gorm.DB, userID string) error
}

// SetTeller sets who tells the app after a change; nil tells nothing (`billing verify`'s replay).
// It is set after New because the teller (entitlements.Service) is built on this service.
func (s *Service) SetTeller(t Teller) { s.teller = t }

// tellCustomer tells the entitlement of the user linked to a Stripe customer, if any, when the
// customer is of the deployment's world (the other world has no app to tell).
func (s *Service) tellCustomer(ctx context.Context, tx *gorm.DB, customerID string, livemode bool) error {
	if s.teller == nil || livemode != s.livemode || customerID == "" {
		return nil
	}
	users, err := LinkedUsers(ctx, tx, customerID, livemode)
	if err != nil {
		return fmt.Errorf("tell customer %s: %w", customerID, err)
	}
	for _, u := range users {
		if err := s.teller.TellUser(ctx, tx, u); err != nil {
			return err
		}
	}
	return nil
}

// LinkedUsers are the users linked to a Stripe customer of a mode, read in tx (which sees its own
// writes).
func LinkedUsers(ctx context.Context, tx *gorm.DB, customerID string, livemode bool) ([]string, error) {
	var users []string
	rows, err := tx.Statement.ConnPool.QueryContext(ctx,
		`SELECT user_id FROM customers WHERE stripe_customer_id = $1 AND livemode = $2`, customerID, livemode)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var u string
		if err := rows.Scan(&u); err != nil {
			rows.Close()
			return nil, err
		}
		users = append(users, u)
	}
	if err := rows.Close(); err != nil {
		return nil, err
	}
	return users, nil
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
	return s.teller.TellUser(ctx, tx, *user)
}
