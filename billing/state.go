package billing

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"billing/internal/database"
)

// The reads of subscription state that need no entitlement policy: the rows themselves, the
// failed invoice of a hold, the holds the admin lists. The entitlements package reads the same
// rows and decides access from them.

// FailedInvoice is the failed invoice of a payment hold in force, every field null otherwise.
// Its fields appear inline in the JSON of the views that embed it.
type FailedInvoice struct {
	AttemptCount       *int64     `json:"attempt_count"`
	NextPaymentAttempt *time.Time `json:"next_payment_attempt"`
	AmountDue          *int64     `json:"amount_due"`
	Currency           *string    `json:"currency"`
	HostedInvoiceURL   *string    `json:"hosted_invoice_url"`
}

// FailedInvoice is the failed invoice of the subscription's payment hold, when one is in force.
func (s *Subscription) FailedInvoice() FailedInvoice {
	if !s.paymentHoldInForce() {
		return FailedInvoice{}
	}
	return FailedInvoice{
		AttemptCount:       s.AttemptCount,
		NextPaymentAttempt: UTC(s.NextPaymentAttempt),
		AmountDue:          s.AmountDue,
		Currency:           s.Currency,
		HostedInvoiceURL:   s.HostedInvoiceURL,
	}
}

// HoldView is one entry of GET /admin/holds.
type HoldView struct {
	SubscriptionID   string     `json:"subscription_id"`
	StripeCustomerID string     `json:"stripe_customer_id"`
	UserID           *string    `json:"user_id"`
	Status           string     `json:"status"`
	HoldReason       string     `json:"hold_reason"`
	OnHoldSince      *time.Time `json:"on_hold_since"`
	FailedInvoice
	Livemode bool `json:"livemode"`
}

// subscriptionRowColumns are the columns a Subscription is read from, named as its fields' column
// tags (database.ScanAll matches them by name), the customer's user id excepted. The NOT NULL
// columns are coalesced so that the LEFT JOIN of a customer without subscriptions scans too (its
// subscription_id is then "").
const subscriptionRowColumns = `coalesce(s.subscription_id, '') AS subscription_id,
	coalesce(s.stripe_customer_id, '') AS stripe_customer_id, coalesce(s.livemode, false) AS livemode,
	coalesce(s.status, '') AS status, s.price_id, s.current_period_start, s.current_period_end,
	coalesce(s.cancel_at_period_end, false) AS cancel_at_period_end, s.cancel_at, s.canceled_at, s.ended_at,
	s.trial_start, s.trial_end, s.status_since, s.sub_event_id, s.sub_event_created, s.trial_will_end_at,
	coalesce(s.payment_hold, false) AS payment_hold, s.payment_hold_since, s.latest_invoice_id, s.attempt_count,
	s.next_payment_attempt, s.amount_due, s.currency, s.hosted_invoice_url, s.inv_event_created,
	s.payment_hold_billing_reason, s.payment_hold_kind, s.pause_collection_behavior, s.pause_collection_resumes_at,
	s.quantity`

// subscriptionColumns are subscriptionRowColumns and the user id of the customer joined as c.
const subscriptionColumns = subscriptionRowColumns + `, c.user_id`

// customerSubscriptionRow is one row of a customer joined to its subscriptions.
type customerSubscriptionRow struct {
	CustomerStripeID *string `gorm:"column:customer_stripe_id"`
	CustomerLivemode bool    `gorm:"column:customer_livemode"`
	Subscription
}

// queryCustomerSubscriptions runs query (which selects the customer's stripe_customer_id AS
// customer_stripe_id, its livemode AS customer_livemode, and subscriptionColumns) on the
// handle's own connection, without gorm's callbacks: the reads of the app's hot paths skip gorm's
// per-statement reflection, which was an eighth of their CPU.
func (s *Service) queryCustomerSubscriptions(ctx context.Context, query string, args ...any) ([]customerSubscriptionRow, error) {
	rows, err := s.db.Statement.ConnPool.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return database.ScanAll[customerSubscriptionRow](rows)
}

// ErrNoCustomer means the user has no linked Stripe customer.
var ErrNoCustomer = errors.New("no customer is linked to the user")

// LinkedCustomer is the customer side of a customer view.
type LinkedCustomer struct {
	UserID           string
	StripeCustomerID *string
	Livemode         bool
}

// CustomerSubscriptions loads a user's linked customer and its subscriptions in one statement,
// or ErrNoCustomer. Only the deployment's world answers: its link of the user, and its
// subscriptions of that customer; a row of the other mode never reaches the view.
func (s *Service) CustomerSubscriptions(ctx context.Context, userID string) (*LinkedCustomer, []Subscription, error) {
	rows, err := s.queryCustomerSubscriptions(ctx, `
		SELECT c.stripe_customer_id AS customer_stripe_id, c.livemode AS customer_livemode, `+subscriptionColumns+`
		FROM customers c LEFT JOIN subscriptions s ON s.stripe_customer_id = c.stripe_customer_id AND s.livemode = c.livemode
		WHERE c.user_id = $1 AND c.livemode = $2 AND c.stripe_customer_id IS NOT NULL
		ORDER BY s.created_at, s.subscription_id`, userID, s.livemode)
	if err != nil {
		return nil, nil, fmt.Errorf("load customer of user %q: %w", userID, err)
	}
	if len(rows) == 0 {
		return nil, nil, ErrNoCustomer
	}
	c := &LinkedCustomer{UserID: userID, StripeCustomerID: rows[0].CustomerStripeID, Livemode: rows[0].CustomerLivemode}
	subs := make([]Subscription, 0, len(rows))
	for _, r := range rows {
		if r.SubscriptionID != "" {
			subs = append(subs, r.Subscription)
		}
	}
	return c, subs, nil
}

// Holds lists every subscription on hold now, the longest-held first. Customers not linked to a
// user are included with a nil UserID.
func (s *Service) Holds(ctx context.Context) ([]HoldView, error) {
	// The WHERE clause is a cheap superset (it matches the partial index); Hold() decides.
	rows, err := s.queryCustomerSubscriptions(ctx, `/* all modes: the admin's holds, each with its mode */
		SELECT c.stripe_customer_id AS customer_stripe_id, coalesce(c.livemode, false) AS customer_livemode, `+subscriptionColumns+`
		FROM subscriptions s LEFT JOIN customers c ON c.stripe_customer_id = s.stripe_customer_id AND c.livemode = s.livemode
		WHERE s.status NOT IN ('canceled', 'incomplete_expired')
		  AND (s.payment_hold OR s.status IN ('past_due', 'unpaid'))`)
	if err != nil {
		return nil, fmt.Errorf("load holds: %w", err)
	}
	holds := make([]HoldView, 0, len(rows))
	for i := range rows {
		sub := &rows[i].Subscription
		reason, since, ok := sub.Hold()
		if !ok {
			continue
		}
		holds = append(holds, HoldView{
			SubscriptionID:   sub.SubscriptionID,
			StripeCustomerID: sub.StripeCustomerID,
			UserID:           sub.UserID,
			Status:           sub.Status,
			HoldReason:       reason,
			OnHoldSince:      UTC(since),
			FailedInvoice:    sub.FailedInvoice(),
			Livemode:         sub.Livemode,
		})
	}
	slices.SortFunc(holds, func(a, b HoldView) int {
		if c := CompareTime(a.OnHoldSince, b.OnHoldSince, false); c != 0 {
			return c
		}
		return cmp.Compare(a.SubscriptionID, b.SubscriptionID)
	})
	return holds, nil
}

// UTC is t in UTC, nil for nil: every time an answer shows is in UTC.
func UTC(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// CompareTime orders nil last, and otherwise earlier times first, or later ones first when desc.
func CompareTime(a, b *time.Time, desc bool) int {
	switch {
	case a == nil && b == nil:
		return 0
	case a == nil:
		return 1
	case b == nil:
		return -1
	case desc:
		return b.Compare(*a)
	}
	return a.Compare(*b)
}
