package billing

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/riverqueue/river"
	"gorm.io/gorm"

	"billing/internal/database"
	"billing/internal/jobs"
	"billing/webhooks"
)

// subscriptionSet is what a subscription event writes to its row, its parameters numbered as
// applySubscriptionEvent's arguments. Unqualified columns are the row as it was: status_since
// moves only when the status changes (or a snapshot says when it began), and the renewal's
// re-read is planned anew only when the renewal moves (renewal_reread_queued says the sweep
// has queued the plan's job).
const subscriptionSet = `
		  stripe_customer_id = $3,
		  status_since = CASE WHEN sub_event_created IS NULL OR status IS DISTINCT FROM CAST($4 AS text) OR $19
		                      THEN CAST($17 AS timestamptz) ELSE status_since END,
		  status_other_at = CASE WHEN $19 THEN CAST($17 AS timestamptz)
		                         WHEN sub_event_created IS NULL THEN NULL
		                         WHEN status IS DISTINCT FROM CAST($4 AS text) THEN sub_event_created
		                         ELSE status_other_at END,
		  status = $4,
		  price_id = $5,
		  current_period_start = $6,
		  current_period_end = $7,
		  cancel_at_period_end = $8,
		  cancel_at = $9,
		  canceled_at = $10,
		  ended_at = $11,
		  trial_start = $12,
		  trial_end = $13,
		  pause_collection_behavior = $20,
		  pause_collection_resumes_at = $21,
		  quantity = $22,
		  sub_event_id = $14,
		  sub_event_type = $15,
		  sub_event_created = $17,
		  sub_event_rank = $16,
		  updated_at = $18,
		  renewal_reread_due = CASE WHEN $23 THEN CAST($24 AS timestamptz) ELSE renewal_reread_due END,
		  renewal_reread_queued = CASE WHEN $23 AND renewal_reread_due IS DISTINCT FROM CAST($24 AS timestamptz)
		                               THEN false ELSE renewal_reread_queued END`

// subscriptionGuard is the ordering guard of a subscription event, and the rule that a terminal
// status is final.
var subscriptionGuard = newerThanStored("sub", 17, 16, 14) + `
		  AND (status NOT IN ('canceled', 'incomplete_expired') OR CAST($4 AS text) IN ('canceled', 'incomplete_expired'))`

// subscriptionUpdate applies a subscription event to the row, locked already.
var subscriptionUpdate = `
		UPDATE subscriptions SET` + subscriptionSet + `
		WHERE subscription_id = $1 AND livemode = $2 AND ` + subscriptionGuard

// writtenSubscription is what writeSubscription wrote: the row as it was before (its status and
// its last event's time; none for a row it made) and the user linked to its customer.
type writtenSubscription struct {
	PriorStatus  *string    `gorm:"column:prior_status"`
	PriorCreated *time.Time `gorm:"column:prior_created"`
	UserID       *string    `gorm:"column:user_id"`
}

// writeSubscription applies a subscription event in one statement when it can: a subscription
// not seen yet is inserted whole, as the event's UPDATE would have made the placeholder; one
// whose row exists is updated under the guard, locked by the same statement, which returns the
// row as it was (the locking subquery reads the version the UPDATE replaces). It returns nil
// when it wrote nothing: a stale event, a customer other than the row's, or a row that another
// transaction inserted since the statement began. The caller then locks the row, looks at it
// and decides, as for every event before: the common cases cost one statement instead of a
// locking read and an UPDATE (or an INSERT and the UPDATE that rewrote it).
func (s *Service) writeSubscription(ctx context.Context, tx *gorm.DB, args []any) (*writtenSubscription, error) {
	rows, err := tx.Statement.ConnPool.QueryContext(ctx, `
		WITH made AS (
		  INSERT INTO subscriptions AS s (subscription_id, livemode, stripe_customer_id, status, price_id,
		    current_period_start, current_period_end, cancel_at_period_end, cancel_at, canceled_at, ended_at,
		    trial_start, trial_end, sub_event_id, sub_event_type, sub_event_rank, sub_event_created,
		    updated_at, created_at, status_since, status_other_at,
		    pause_collection_behavior, pause_collection_resumes_at, quantity, renewal_reread_due)
		  VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $18,
		    $17, CASE WHEN $19 THEN CAST($17 AS timestamptz) END, $20, $21, $22, CASE WHEN $23 THEN CAST($24 AS timestamptz) END)
		  ON CONFLICT (subscription_id, livemode) DO NOTHING
		  RETURNING (SELECT c.user_id FROM customers c WHERE c.stripe_customer_id = s.stripe_customer_id AND c.livemode = $2) AS user_id
		), updated AS (
		  UPDATE subscriptions SET`+subscriptionSet+`
		  FROM (SELECT status AS old_status, sub_event_created AS old_created, stripe_customer_id AS old_customer
		        FROM subscriptions WHERE subscription_id = $1 AND livemode = $2 `+webhooks.LockRows(ctx)+`) old
		  WHERE subscription_id = $1 AND livemode = $2 AND `+subscriptionGuard+`
		    AND (old.old_created IS NULL OR old.old_customer = $3)`+linkedUserReturning+` AS user_id, old.old_status, old.old_created
		)
		SELECT NULL::text AS prior_status, NULL::timestamptz AS prior_created, user_id FROM made
		UNION ALL SELECT old_status, old_created, user_id FROM updated`, args...)
	if err != nil {
		return nil, err
	}
	written, err := database.ScanAll[writtenSubscription](rows)
	if err != nil || len(written) == 0 {
		return nil, err
	}
	return &written[0], nil
}

// queueRereads queues the re-reads due now (a tie within a second: rare), and says of each
// whether it was queued (1) or met its duplicate (0).
func (s *Service) queueRereads(ctx context.Context, tx *gorm.DB, due []dueReread) ([]int64, error) {
	queued := make([]int64, len(due))
	if len(due) == 0 {
		return queued, nil
	}
	sqlTx, err := jobs.SQLTx(tx)
	if err != nil {
		return nil, err
	}
	for k, r := range due {
		ok, err := s.insertReread(ctx, sqlTx, r.args, r.at)
		if err != nil {
			return nil, err
		}
		if ok {
			queued[k] = 1
		}
	}
	return queued, nil
}

// insertReread queues one re-read job in tx, unique by its args as every re-read is (River's
// InsertTx, the one insert of a job outside a statement of the caller's), scheduled at at; it
// says whether the job was queued rather than met its duplicate.
func (s *Service) insertReread(ctx context.Context, tx *sql.Tx, args RereadArgs, at time.Time) (bool, error) {
	res, err := s.rereads.jobs.InsertTx(ctx, tx, args, &river.InsertOpts{
		MaxAttempts: s.rereads.MaxAttempts, ScheduledAt: at, UniqueOpts: river.UniqueOpts{ByArgs: true},
	})
	if err != nil {
		return false, fmt.Errorf("queue re-read of %s: %w", args.SubscriptionID, err)
	}
	return !res.UniqueSkippedAsDuplicate, nil
}
