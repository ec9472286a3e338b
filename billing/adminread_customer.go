package billing

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"billing/internal/database"
)

// The reads of the admin console's customer page: one Stripe customer of one mode, with every
// subscription, the entitlement the API would answer and why, and its invoices and notices.

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
	rows, err := s.db.WithContext(ctx).Statement.ConnPool.QueryContext(ctx, `
		SELECT `+subscriptionColumns+`, s.sub_event_type, s.sub_event_rank, s.inv_event_id, s.inv_event_type, s.inv_event_rank
		FROM subscriptions s LEFT JOIN customers c ON c.stripe_customer_id = s.stripe_customer_id AND c.livemode = s.livemode
		WHERE s.stripe_customer_id = $1 AND s.livemode = $2
		ORDER BY s.created_at DESC, s.subscription_id`, stripeCustomerID, livemode)
	if err != nil {
		return nil, fmt.Errorf("load subscriptions of %s: %w", stripeCustomerID, err)
	}
	states, err := database.ScanAll[SubscriptionState](rows)
	if err != nil {
		return nil, fmt.Errorf("load subscriptions of %s: %w", stripeCustomerID, err)
	}
	features, err := s.CustomerFeatures(ctx, stripeCustomerID, livemode)
	if err != nil {
		return nil, err
	}
	now := s.now()
	a := &Account{Subscriptions: states, Features: features}
	subs := make([]Subscription, len(states))
	for i := range states {
		st := &states[i]
		st.Entitled = s.policy.Entitled(&st.Subscription, now)
		st.Reason = s.policy.EntitlementReason(&st.Subscription, now)
		if reason, since, ok := st.Hold(); ok {
			st.HoldReason, st.HoldSince = reason, utc(since)
		}
		st.Features, st.FeaturesGranted = features, s.policy.FeaturesGranted(&st.Subscription, now)
		subs[i] = st.Subscription
	}
	a.Entitlement = s.entitlementOf(userID, subs, features.LookupKeys, now)
	if best := s.policy.Best(subs, now); best != nil {
		a.Reason = s.policy.EntitlementReason(best, now)
	} else {
		a.Reason = "Not entitled: the customer has no subscription."
	}
	return a, nil
}

// PageCursor is a position in a list ordered newest first by (time, id).
type PageCursor struct {
	At time.Time
	ID string
}

// CustomerInvoices lists a Stripe customer's stored invoices of the mode, newest first, limit
// at most, those before the cursor when one is given.
func (s *Service) CustomerInvoices(ctx context.Context, stripeCustomerID string, livemode bool, before *PageCursor, limit int) ([]InvoiceRow, error) {
	out := []InvoiceRow{}
	// The order and the cursor compare ids byte-wise, as invoices_customer_created_idx sorts them.
	q := `SELECT invoice_id, subscription_id, number, status, amount_due, amount_paid, currency, hosted_invoice_url, created
		FROM invoices WHERE stripe_customer_id = $1 AND livemode = $2`
	args := []any{stripeCustomerID, livemode}
	if before != nil {
		q += ` AND (created, invoice_id COLLATE "C") < ($4, $5 COLLATE "C")`
		args = append(args, limit, before.At, before.ID)
	} else {
		args = append(args, limit)
	}
	q += ` ORDER BY created DESC, invoice_id COLLATE "C" DESC LIMIT $3`
	if err := s.db.WithContext(ctx).Raw(q, args...).Scan(&out).Error; err != nil {
		return nil, fmt.Errorf("list invoices of %s: %w", stripeCustomerID, err)
	}
	return out, nil
}

// CustomerNotices lists the notices sent to a Stripe customer of the mode, newest first.
func (s *Service) CustomerNotices(ctx context.Context, stripeCustomerID string, livemode bool, before *PageCursor, limit int) ([]NoticeRow, error) {
	out := []NoticeRow{}
	q := `SELECT id, event_id, kind, subscription_id, recipient, created_at, delivery, sent_at
		FROM notices WHERE stripe_customer_id = $1 AND livemode = $2`
	args := []any{stripeCustomerID, livemode, limit}
	if before != nil {
		id, err := strconv.ParseInt(before.ID, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("notice cursor %q: %w", before.ID, err)
		}
		q += ` AND (created_at, id) < ($4, $5)`
		args = append(args, before.At, id)
	}
	q += ` ORDER BY created_at DESC, id DESC LIMIT $3`
	if err := s.db.WithContext(ctx).Raw(q, args...).Scan(&out).Error; err != nil {
		return nil, fmt.Errorf("list notices of %s: %w", stripeCustomerID, err)
	}
	return out, nil
}
