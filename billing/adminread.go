package billing

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"billing/internal/database"
)

// The reads of the admin console's subscription and customer pages: one subscription (or a
// customer's) with the keys of the events that set its two column groups, the subscriptions an id
// leads to, their notices and their invoices. The policy's answers and words on them are the
// entitlements package's (entitlements.SubscriptionState).

// SubscriptionState is one subscription as the console shows it.
type SubscriptionState struct {
	Subscription
	// The event (or read from Stripe: "reconcile:…", "reread:…") whose key each column group
	// holds, with its type and rank; nil while the group has never been written.
	SubEventType *string `gorm:"column:sub_event_type"`
	SubEventRank *int    `gorm:"column:sub_event_rank"`
	InvEventID   *string `gorm:"column:inv_event_id"`
	InvEventType *string `gorm:"column:inv_event_type"`
	InvEventRank *int    `gorm:"column:inv_event_rank"`

	// HoldReason and HoldSince are set when the subscription is on hold.
	HoldReason string     `gorm:"-"`
	HoldSince  *time.Time `gorm:"-"`
}

// stateColumns are what a SubscriptionState is read from (s the subscription, c its customer).
const stateColumns = subscriptionColumns + `, s.sub_event_type, s.sub_event_rank, s.inv_event_id, s.inv_event_type, s.inv_event_rank`

func (st *SubscriptionState) setHold() {
	if reason, since, ok := st.Hold(); ok {
		st.HoldReason, st.HoldSince = reason, UTC(since)
	}
}

// SubscriptionState returns a subscription with its customer's user, or nil when unknown. The
// console sees both worlds: of an id in both, the live one.
func (s *Service) SubscriptionState(ctx context.Context, subscriptionID string) (*SubscriptionState, error) {
	rows, err := s.db.WithContext(ctx).Statement.ConnPool.QueryContext(ctx, `/* all modes */
		SELECT `+stateColumns+`
		FROM subscriptions s LEFT JOIN customers c ON c.stripe_customer_id = s.stripe_customer_id AND c.livemode = s.livemode
		WHERE s.subscription_id = $1
		ORDER BY s.livemode DESC`, subscriptionID)
	if err != nil {
		return nil, fmt.Errorf("load subscription %s: %w", subscriptionID, err)
	}
	subs, err := database.ScanAll[SubscriptionState](rows)
	if err != nil {
		return nil, fmt.Errorf("load subscription %s: %w", subscriptionID, err)
	}
	if len(subs) == 0 {
		return nil, nil
	}
	st := &subs[0]
	st.setHold()
	return st, nil
}

// CustomerStates returns the subscriptions of a Stripe customer of the mode, newest first.
func (s *Service) CustomerStates(ctx context.Context, stripeCustomerID string, livemode bool) ([]SubscriptionState, error) {
	rows, err := s.db.WithContext(ctx).Statement.ConnPool.QueryContext(ctx, `
		SELECT `+stateColumns+`
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
	for i := range states {
		states[i].setHold()
	}
	return states, nil
}

// SubscriptionRef is a subscription an id leads to.
type SubscriptionRef struct {
	SubscriptionID   string  `gorm:"column:subscription_id"`
	StripeCustomerID string  `gorm:"column:stripe_customer_id"`
	UserID           *string `gorm:"column:user_id"`
	Livemode         bool    `gorm:"column:livemode"`
	Status           string  `gorm:"column:status"`
}

// FindSubscriptions returns the subscriptions that id names: the subscription itself, or those
// of a Stripe customer or of a user (through the customer linked in the same mode), newest first.
// The user's customers are an array, not an IN subquery: the planner can then OR the three index
// lookups, where the subquery made it read every subscription.
func (s *Service) FindSubscriptions(ctx context.Context, id string, limit int) ([]SubscriptionRef, error) {
	out := []SubscriptionRef{}
	err := s.db.WithContext(ctx).Raw(`/* all modes: the console's find, each result with its mode */
		SELECT s.subscription_id, s.stripe_customer_id, c.user_id, s.livemode, s.status
		FROM subscriptions s LEFT JOIN customers c ON c.stripe_customer_id = s.stripe_customer_id AND c.livemode = s.livemode
		WHERE s.subscription_id = $1 OR s.stripe_customer_id = $1
		   OR s.stripe_customer_id = ANY (ARRAY(SELECT stripe_customer_id FROM customers WHERE user_id = $1))
		ORDER BY s.created_at DESC, s.subscription_id
		LIMIT $2`, id, limit).Scan(&out).Error
	if err != nil {
		return nil, fmt.Errorf("find subscriptions of %s: %w", id, err)
	}
	return out, nil
}

// NoticeRow is one customer notice of a subscription.
type NoticeRow struct {
	ID      int64  `gorm:"column:id"`
	EventID string `gorm:"column:event_id"`
	Kind    string `gorm:"column:kind"`
	// SubscriptionID is set on the customer page's list (the subscription page's are its own).
	SubscriptionID *string    `gorm:"column:subscription_id"`
	Recipient      string     `gorm:"column:recipient"`
	CreatedAt      time.Time  `gorm:"column:created_at"`
	Delivery       *string    `gorm:"column:delivery"`
	SentAt         *time.Time `gorm:"column:sent_at"`
}

// SubscriptionNotices lists the notices of a subscription, newest first.
func (s *Service) SubscriptionNotices(ctx context.Context, subscriptionID string, livemode bool, limit int) ([]NoticeRow, error) {
	out := []NoticeRow{}
	err := s.db.WithContext(ctx).Raw(`
		SELECT id, event_id, kind, recipient, created_at, delivery, sent_at
		FROM notices WHERE subscription_id = $1 AND livemode = $2
		ORDER BY created_at DESC, id DESC LIMIT $3`, subscriptionID, livemode, limit).Scan(&out).Error
	if err != nil {
		return nil, fmt.Errorf("list notices of %s: %w", subscriptionID, err)
	}
	return out, nil
}

// InvoiceRow is one invoice of a subscription as stored from the invoice events.
type InvoiceRow struct {
	InvoiceID        string     `gorm:"column:invoice_id"`
	SubscriptionID   *string    `gorm:"column:subscription_id"`
	Number           *string    `gorm:"column:number"`
	Status           *string    `gorm:"column:status"`
	AmountDue        *int64     `gorm:"column:amount_due"`
	AmountPaid       *int64     `gorm:"column:amount_paid"`
	Currency         *string    `gorm:"column:currency"`
	HostedInvoiceURL *string    `gorm:"column:hosted_invoice_url"`
	Created          *time.Time `gorm:"column:created"`
}

// SubscriptionInvoices lists the stored invoices of a subscription, newest first.
func (s *Service) SubscriptionInvoices(ctx context.Context, subscriptionID string, livemode bool, limit int) ([]InvoiceRow, error) {
	out := []InvoiceRow{}
	err := s.db.WithContext(ctx).Raw(`
		SELECT invoice_id, number, status, amount_due, amount_paid, currency, hosted_invoice_url, created
		FROM invoices WHERE subscription_id = $1 AND livemode = $2
		ORDER BY created DESC, invoice_id DESC LIMIT $3`, subscriptionID, livemode, limit).Scan(&out).Error
	if err != nil {
		return nil, fmt.Errorf("list invoices of %s: %w", subscriptionID, err)
	}
	return out, nil
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
