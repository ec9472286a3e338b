// Package customers links the app's users to their Stripe customers and serves
// PUT /v1/customers/{user_id}.
package customers

import (
	"context"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"
)

// ErrNotFound means no customer is linked to the user (or Stripe customer) asked for.
var ErrNotFound = errors.New("customer not found")

// Customer is one row of the customers table. Get and ByStripeID return only linked rows, whose
// StripeCustomerID is never nil: a row without one is a link still being made (written before the
// Stripe call so that a crash cannot lose it) and counts as no customer.
type Customer struct {
	UserID           string    `gorm:"column:user_id;primaryKey" json:"user_id"`
	StripeCustomerID *string   `gorm:"column:stripe_customer_id" json:"stripe_customer_id"`
	Email            string    `gorm:"column:email" json:"-"`
	Name             string    `gorm:"column:name" json:"-"`
	Livemode         bool      `gorm:"column:livemode" json:"livemode"`
	CreatedAt        time.Time `gorm:"column:created_at" json:"-"`
	UpdatedAt        time.Time `gorm:"column:updated_at" json:"-"`
}

func (Customer) TableName() string { return "customers" }

// Get returns the linked customer of a user in the given mode, or ErrNotFound. Each mode is a
// world of its own: a link of the other mode (made by that mode's deployment, or by an event
// signed with that mode's secret) is not this mode's customer, and neither answers for nor
// blocks it.
func Get(ctx context.Context, db *gorm.DB, userID string, livemode bool) (*Customer, error) {
	// A customer deleted at Stripe (customer.deleted) is no link to charge or open a portal for.
	c, err := one(ctx, db, `SELECT * FROM customers
		WHERE user_id = $1 AND livemode = $2 AND stripe_customer_id IS NOT NULL AND deleted_at IS NULL`, userID, livemode)
	if err != nil {
		return nil, fmt.Errorf("load customer of user %q: %w", userID, err)
	}
	if c == nil {
		return nil, ErrNotFound
	}
	return c, nil
}

// one runs a query for at most one customer row; nil when there is none.
func one(ctx context.Context, db *gorm.DB, query string, args ...any) (*Customer, error) {
	var rows []Customer
	if err := db.WithContext(ctx).Raw(query, args...).Scan(&rows).Error; err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		return nil, nil
	}
	return &rows[0], nil
}

// StripeID is the Stripe customer id of a linked customer ("" for a link still being made).
func (c *Customer) StripeID() string {
	if c.StripeCustomerID == nil {
		return ""
	}
	return *c.StripeCustomerID
}

// ByStripeID returns the customer linked to a Stripe customer id of the given mode, or ErrNotFound.
func ByStripeID(ctx context.Context, db *gorm.DB, stripeCustomerID string, livemode bool) (*Customer, error) {
	c, err := one(ctx, db, `SELECT * FROM customers WHERE stripe_customer_id = $1 AND livemode = $2`, stripeCustomerID, livemode)
	if err != nil {
		return nil, fmt.Errorf("load customer %q: %w", stripeCustomerID, err)
	}
	if c == nil {
		return nil, ErrNotFound
	}
	return c, nil
}

// LinkFound links userID to the Stripe customer customerID in tx, as found at Stripe, and
// reports whether it did. A link is never overwritten: a user linked to another customer keeps
// its link, and so does a customer linked to another user (the caller looks that up first: the
// insert would fail on it). takePending: a user row still waiting for its customer (written
// before PUT's Stripe call) takes this one — Checkout's session names the user the service
// opened it for; else such a row is left to its PUT (reconcile). The caller tells the app when
// it linked.
func LinkFound(ctx context.Context, tx *gorm.DB, userID, customerID, email, name string, livemode, takePending bool, now time.Time) (bool, error) {
	conflict := `ON CONFLICT DO NOTHING`
	if takePending {
		conflict = `ON CONFLICT (user_id, livemode) DO UPDATE SET stripe_customer_id = EXCLUDED.stripe_customer_id, updated_at = EXCLUDED.updated_at
		WHERE c.stripe_customer_id IS NULL`
	}
	res := tx.WithContext(ctx).Exec(`
		INSERT INTO customers AS c (user_id, stripe_customer_id, email, name, livemode, created_at, updated_at)
		VALUES ($1, $2, $3, $4, $5, $6, $6)
		`+conflict, userID, customerID, email, name, livemode, now.UTC())
	if res.Error != nil {
		return false, fmt.Errorf("link user %s to customer %s: %w", userID, customerID, res.Error)
	}
	return res.RowsAffected == 1, nil
}
