package billing

import (
	"context"

	"gorm.io/gorm"

	"billing/webhooks"
)

// holdInForce is Subscription.paymentHoldInForce of the row as it was, in SQL, for the UPDATE
// that applies an invoice event (its expressions see the row before the change): a failure
// keeps the start of a hold still in force (a retry failing again), and the first failure, or
// one after the hold was lifted, starts a new one. TestHoldInForceIsPaymentHoldInForce holds the
// two equal over every case they tell apart.
const holdInForce = `payment_hold
		    AND NOT coalesce(payment_hold_billing_reason = 'subscription_create' AND status IN ('incomplete', 'incomplete_expired'), false)
		    AND NOT coalesce(status IN ('active', 'trialing') AND sub_event_created > inv_event_created, false)`

// invoiceSet is what an invoice event ($1 to $19, applyInvoiceEvent's arguments) writes to the
// payment columns of its subscription.
const invoiceSet = `
		  payment_hold = $3,
		  payment_hold_since = CASE WHEN NOT $3 THEN NULL
		    WHEN ` + holdInForce + ` AND payment_hold_since IS NOT NULL THEN payment_hold_since
		    ELSE CAST($4 AS timestamptz) END,
		  latest_invoice_id = $5,
		  attempt_count = $6,
		  next_payment_attempt = $7,
		  amount_due = $8,
		  currency = $9,
		  hosted_invoice_url = $10,
		  inv_event_id = $11,
		  inv_event_type = $12,
		  inv_event_created = $13,
		  inv_event_rank = $14,
		  updated_at = $15,
		  payment_hold_invoice_created = CASE WHEN NOT $3 THEN payment_hold_invoice_created
		    WHEN payment_hold THEN GREATEST(payment_hold_invoice_created, CAST($16 AS timestamptz))
		    ELSE CAST($16 AS timestamptz) END,
		  payment_hold_billing_reason = CASE WHEN $3 THEN CAST($17 AS text) ELSE payment_hold_billing_reason END,
		  payment_hold_kind = CASE WHEN $3 THEN CAST($18 AS text) ELSE payment_hold_kind END,
		  inv_invoice_created = CAST($16 AS timestamptz)`

// invoiceGuard applies the event to a subscription of its customer only ($19), under the
// invoice ordering: the newest invoice wins, and within one invoice the newest event.
var invoiceGuard = `subscription_id = $1 AND livemode = $2 AND stripe_customer_id = $19
		  AND CASE WHEN inv_invoice_created IS NOT NULL AND CAST($16 AS timestamptz) IS NOT NULL
		             AND CAST($16 AS timestamptz) <> inv_invoice_created
		        THEN CAST($16 AS timestamptz) > inv_invoice_created
		        ELSE ` + newerThanStored("inv", 13, 14, 11) + ` END
		  AND ($3 OR NOT payment_hold OR payment_hold_invoice_created IS NULL OR CAST($16 AS timestamptz) IS NULL
		       OR CAST($16 AS timestamptz) >= payment_hold_invoice_created)`

// applyInvoiceStatement runs the statement that keeps the invoice (kept, its arguments after
// the UPDATE's) and applies the event to its subscription. It returns the rows applied (0 or 1),
// the user linked to the customer and the subscription's status (both only when applied). The
// row is locked by a subquery of the UPDATE with LockRows, as lockSubscription locks it: in a
// batch of group commit, a row locked elsewhere fails the batch at once instead of holding its
// lane.
func (s *Service) applyInvoiceStatement(ctx context.Context, tx *gorm.DB, kept string, args []any) (n int64, user *string, status string, err error) {
	var st *string
	err = tx.Statement.ConnPool.QueryRowContext(ctx, `
		WITH kept AS (`+kept+`), updated AS (
		  UPDATE subscriptions SET`+invoiceSet+`
		  FROM (SELECT 1 FROM subscriptions WHERE subscription_id = $1 AND livemode = $2 `+webhooks.LockRows(ctx)+`) locked
		  WHERE `+invoiceGuard+linkedUserReturning+` AS user_id, status)
		SELECT count(*), max(user_id), max(status) FROM updated`, args...).Scan(&n, &user, &st)
	if st != nil {
		status = *st
	}
	return n, user, status, err
}

// lockInvoiceSubscription locks the invoice's subscription, made as a placeholder when missing,
// and refuses an invoice of another customer than the subscription's.
func (s *Service) lockInvoiceSubscription(ctx context.Context, tx *gorm.DB, ev webhooks.Event, invoiceID, subscriptionID, customerID string) (*Subscription, error) {
	prior, err := s.lockSubscription(ctx, tx, subscriptionID, customerID, ev.Livemode)
	if err != nil {
		return nil, err
	}
	if prior.StripeCustomerID != customerID {
		return nil, permanent("%s %s: subscription %s belongs to customer %s, invoice %s names %s",
			ev.Type, ev.ID, subscriptionID, prior.StripeCustomerID, invoiceID, customerID)
	}
	return prior, nil
}
