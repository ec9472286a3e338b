package billing

import (
	"context"
	"fmt"

	"gorm.io/gorm"

	"billing/internal/database"
	"billing/webhooks"
)

// insertOrLockSubscription is lockSubscription for a subscription event, which carries the
// whole object: a subscription not seen yet is inserted whole, as the event's UPDATE would have
// made the placeholder, and made is the row written (with its linked user); one that exists is
// locked and returned as prior, for the event's UPDATE. A first event, and every event of a
// burst of new subscriptions, then costs one statement instead of an INSERT and an UPDATE that
// rewrites the row it has just written.
//
// args are the UPDATE's parameters $1 to $22 (applySubscriptionEvent). For a row made here,
// prior is the placeholder the row stands in for (what lockSubscription would have inserted).
// The race of two first events falls back as in lockSubscription.
func (s *Service) insertOrLockSubscription(ctx context.Context, tx *gorm.DB, args []any, obj *subscriptionObject, status string) (prior, made *Subscription, err error) {
	subscriptionID, livemode, customerID := args[0].(string), args[1].(bool), args[2].(string)
	placeholder := &Subscription{SubscriptionID: subscriptionID, StripeCustomerID: customerID, Livemode: livemode, Status: StatusIncomplete}
	_, renewal := s.renewalPlan(placeholder, obj, status)
	rows, err := tx.Statement.ConnPool.QueryContext(ctx, `
		WITH inserted AS (
		  INSERT INTO subscriptions AS s (subscription_id, livemode, stripe_customer_id, status, price_id,
		    current_period_start, current_period_end, cancel_at_period_end, cancel_at, canceled_at, ended_at,
		    trial_start, trial_end, sub_event_id, sub_event_type, sub_event_rank, sub_event_created,
		    updated_at, created_at, status_since, status_other_at,
		    pause_collection_behavior, pause_collection_resumes_at, quantity, renewal_reread_due)
		  VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $18,
		    $17, CASE WHEN $19 THEN CAST($17 AS timestamptz) END, $20, $21, $22, $23)
		  ON CONFLICT (subscription_id, livemode) DO NOTHING
		  RETURNING true AS made, `+subscriptionRowColumns+`,
		    (SELECT c.user_id FROM customers c WHERE c.stripe_customer_id = s.stripe_customer_id AND c.livemode = $2) AS user_id
		), existing AS (
		  SELECT false AS made, `+subscriptionRowColumns+`, NULL::text AS user_id FROM subscriptions s
		  WHERE s.subscription_id = $1 AND s.livemode = $2 `+webhooks.LockRows(ctx)+`
		)
		SELECT * FROM inserted UNION ALL SELECT * FROM existing`, append(args[:22:22], renewal)...)
	if err != nil {
		return nil, nil, fmt.Errorf("insert or lock subscription %s: %w", subscriptionID, err)
	}
	found, err := database.ScanAll[struct {
		Made bool `gorm:"column:made"`
		Subscription
	}](rows)
	if err != nil {
		return nil, nil, fmt.Errorf("insert or lock subscription %s: %w", subscriptionID, err)
	}
	if len(found) == 1 && found[0].Made {
		return placeholder, &found[0].Subscription, nil
	}
	if len(found) == 1 {
		return &found[0].Subscription, nil, nil
	}
	prior, err = scanSubscription(ctx, tx, subscriptionByID+` `+webhooks.LockRows(ctx), subscriptionID, livemode)
	if err == nil && prior == nil {
		err = fmt.Errorf("row not found after insert")
	}
	if err != nil {
		return nil, nil, fmt.Errorf("lock subscription %s: %w", subscriptionID, err)
	}
	return prior, nil, nil
}
