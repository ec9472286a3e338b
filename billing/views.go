package billing

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"billing/customers"
)

// SubscriptionView is one subscription in GET /v1/customers/{user_id}.
type SubscriptionView struct {
	SubscriptionID     string     `json:"subscription_id"`
	StripeCustomerID   string     `json:"stripe_customer_id"`
	Livemode           bool       `json:"livemode"`
	Status             string     `json:"status"`
	Entitled           bool       `json:"entitled"`
	PriceID            *string    `json:"price_id"`
	CurrentPeriodStart *time.Time `json:"current_period_start"`
	CurrentPeriodEnd   *time.Time `json:"current_period_end"`
	CancelAtPeriodEnd  bool       `json:"cancel_at_period_end"`
	CancelAt           *time.Time `json:"cancel_at"`
	CanceledAt         *time.Time `json:"canceled_at"`
	EndedAt            *time.Time `json:"ended_at"`
	TrialStart         *time.Time `json:"trial_start"`
	TrialEnd           *time.Time `json:"trial_end"`
	OnHold             bool       `json:"on_hold"`
	HoldReason         *string    `json:"hold_reason"`
	OnHoldSince        *time.Time `json:"on_hold_since"`
	FailedInvoice
}

// FailedInvoice is the failed invoice of a payment hold in force, every field null otherwise.
// Its fields appear inline in the JSON of the views that embed it.
type FailedInvoice struct {
	AttemptCount       *int64     `json:"attempt_count"`
	NextPaymentAttempt *time.Time `json:"next_payment_attempt"`
	AmountDue          *int64     `json:"amount_due"`
	Currency           *string    `json:"currency"`
	HostedInvoiceURL   *string    `json:"hosted_invoice_url"`
}

func (s *Subscription) failedInvoice() FailedInvoice {
	if !s.paymentHoldInForce() {
		return FailedInvoice{}
	}
	return FailedInvoice{
		AttemptCount:       s.AttemptCount,
		NextPaymentAttempt: utc(s.NextPaymentAttempt),
		AmountDue:          s.AmountDue,
		Currency:           s.Currency,
		HostedInvoiceURL:   s.HostedInvoiceURL,
	}
}

// Entitlement is GET /v1/customers/{user_id}/entitlement: whether the user gets access now, and
// the subscription that decides it (see Policy.Best). on_hold is about the customer: true when
// any of their subscriptions is on hold; hold_reason is that of the first held subscription in
// the Best order.
type Entitlement struct {
	UserID            string     `json:"user_id"`
	Entitled          bool       `json:"entitled"`
	Status            string     `json:"status"`
	OnHold            bool       `json:"on_hold"`
	HoldReason        *string    `json:"hold_reason"`
	SubscriptionID    *string    `json:"subscription_id"`
	PriceID           *string    `json:"price_id"`
	CurrentPeriodEnd  *time.Time `json:"current_period_end"`
	CancelAtPeriodEnd bool       `json:"cancel_at_period_end"`
	TrialEnd          *time.Time `json:"trial_end"`
}

// CustomerView is GET /v1/customers/{user_id}.
type CustomerView struct {
	UserID           string             `json:"user_id"`
	StripeCustomerID *string            `json:"stripe_customer_id"`
	Livemode         bool               `json:"livemode"`
	Subscriptions    []SubscriptionView `json:"subscriptions"`
	Entitlement      Entitlement        `json:"entitlement"`
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

const subscriptionColumns = `s.*, c.user_id`

// customerRow is a linked customer joined with one of its subscriptions (all NULL when it has
// none).
type customerRow struct {
	CUserID           string  `gorm:"column:c_user_id"`
	CStripeCustomerID string  `gorm:"column:c_stripe_customer_id"`
	CLivemode         bool    `gorm:"column:c_livemode"`
	SubID             *string `gorm:"column:sub_id"`
	Subscription      `gorm:"embedded"`
}

// customerWithSubscriptions loads a user's linked customer and its subscriptions in one
// statement: the entitlement read is the app's hottest path, one round trip instead of two.
func (s *Service) customerWithSubscriptions(ctx context.Context, userID string) (*customers.Customer, []Subscription, error) {
	var rows []customerRow
	err := s.db.WithContext(ctx).Raw(`
		SELECT c.user_id AS c_user_id, c.stripe_customer_id AS c_stripe_customer_id, c.livemode AS c_livemode,
		       s.subscription_id AS sub_id, `+subscriptionColumns+`
		FROM customers c LEFT JOIN subscriptions s ON s.stripe_customer_id = c.stripe_customer_id
		WHERE c.user_id = ? AND c.stripe_customer_id IS NOT NULL
		ORDER BY s.created_at, s.subscription_id`, userID).Scan(&rows).Error
	if err != nil {
		return nil, nil, fmt.Errorf("load customer of user %q: %w", userID, err)
	}
	if len(rows) == 0 {
		return nil, nil, customers.ErrNotFound
	}
	stripeID := rows[0].CStripeCustomerID
	c := &customers.Customer{UserID: rows[0].CUserID, StripeCustomerID: &stripeID, Livemode: rows[0].CLivemode}
	subs := make([]Subscription, 0, len(rows))
	for _, r := range rows {
		if r.SubID != nil {
			subs = append(subs, r.Subscription)
		}
	}
	return c, subs, nil
}

// Customer returns the customer view of a user, or customers.ErrNotFound when the user has no
// linked Stripe customer. Local state only: Stripe is never called.
func (s *Service) Customer(ctx context.Context, userID string) (*CustomerView, error) {
	c, subs, err := s.customerWithSubscriptions(ctx, userID)
	if err != nil {
		return nil, err
	}
	now := s.now()
	v := &CustomerView{
		UserID:           c.UserID,
		StripeCustomerID: c.StripeCustomerID,
		Livemode:         c.Livemode,
		Subscriptions:    make([]SubscriptionView, 0, len(subs)),
		Entitlement:      s.entitlementOf(c.UserID, subs, now),
	}
	for i := range subs {
		v.Subscriptions = append(v.Subscriptions, s.subscriptionView(&subs[i], now))
	}
	return v, nil
}

// Entitlement answers whether a user is entitled now, or customers.ErrNotFound for an unknown
// user. Local state only: Stripe is never called.
func (s *Service) Entitlement(ctx context.Context, userID string) (*Entitlement, error) {
	v, err := s.Customer(ctx, userID)
	if err != nil {
		return nil, err
	}
	return &v.Entitlement, nil
}

func (s *Service) entitlementOf(userID string, subs []Subscription, now time.Time) Entitlement {
	e := Entitlement{UserID: userID, Status: StatusNone}
	best := s.policy.Best(subs, now)
	if best == nil {
		return e
	}
	e.Entitled = s.policy.Entitled(best, now)
	e.Status = best.Status
	e.SubscriptionID = &best.SubscriptionID
	e.PriceID = best.PriceID
	e.CurrentPeriodEnd = utc(best.CurrentPeriodEnd)
	e.CancelAtPeriodEnd = best.CancelAtPeriodEnd
	e.TrialEnd = utc(best.TrialEnd)
	// The best one's own hold first, then any other's.
	held := slices.Clone(subs)
	slices.SortStableFunc(held, func(a, b Subscription) int {
		return cmp.Compare(boolRank(a.SubscriptionID != best.SubscriptionID), boolRank(b.SubscriptionID != best.SubscriptionID))
	})
	for i := range held {
		if reason, _, ok := held[i].Hold(); ok {
			e.OnHold = true
			e.HoldReason = &reason
			break
		}
	}
	return e
}

func boolRank(b bool) int {
	if b {
		return 1
	}
	return 0
}

func (s *Service) subscriptionView(sub *Subscription, now time.Time) SubscriptionView {
	v := SubscriptionView{
		SubscriptionID:     sub.SubscriptionID,
		StripeCustomerID:   sub.StripeCustomerID,
		Livemode:           sub.Livemode,
		Status:             sub.Status,
		Entitled:           s.policy.Entitled(sub, now),
		PriceID:            sub.PriceID,
		CurrentPeriodStart: utc(sub.CurrentPeriodStart),
		CurrentPeriodEnd:   utc(sub.CurrentPeriodEnd),
		CancelAtPeriodEnd:  sub.CancelAtPeriodEnd,
		CancelAt:           utc(sub.CancelAt),
		CanceledAt:         utc(sub.CanceledAt),
		EndedAt:            utc(sub.EndedAt),
		TrialStart:         utc(sub.TrialStart),
		TrialEnd:           utc(sub.TrialEnd),
		FailedInvoice:      sub.failedInvoice(),
	}
	if reason, since, ok := sub.Hold(); ok {
		v.OnHold = true
		v.HoldReason = &reason
		v.OnHoldSince = utc(since)
	}
	return v
}

// Holds lists every subscription on hold now, the longest-held first. Customers not linked to a
// user are included with a nil UserID.
func (s *Service) Holds(ctx context.Context) ([]HoldView, error) {
	var subs []Subscription
	// The WHERE clause is a cheap superset (it matches the partial index); Hold() decides.
	err := s.db.WithContext(ctx).Raw(`
		SELECT ` + subscriptionColumns + `
		FROM subscriptions s LEFT JOIN customers c ON c.stripe_customer_id = s.stripe_customer_id
		WHERE s.status NOT IN ('canceled', 'incomplete_expired')
		  AND (s.payment_hold OR s.status IN ('past_due', 'unpaid'))`).Scan(&subs).Error
	if err != nil {
		return nil, fmt.Errorf("load holds: %w", err)
	}
	holds := make([]HoldView, 0, len(subs))
	for i := range subs {
		sub := &subs[i]
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
			OnHoldSince:      utc(since),
			FailedInvoice:    sub.failedInvoice(),
			Livemode:         sub.Livemode,
		})
	}
	slices.SortFunc(holds, func(a, b HoldView) int {
		if c := compareTime(a.OnHoldSince, b.OnHoldSince, false); c != 0 {
			return c
		}
		return cmp.Compare(a.SubscriptionID, b.SubscriptionID)
	})
	return holds, nil
}

func utc(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}
