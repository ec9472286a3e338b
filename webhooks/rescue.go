package webhooks

import (
	"context"
	"fmt"
	"time"

	"gorm.io/gorm"

	"billing/internal/database"
)

// Fast rescue. When a replica dies (SIGKILL, OOM, a lost node), the jobs it had fetched stay
// "running" until River's rescuer notices them: worker.rescue_after plus the rescuer's own
// 30-second round, over a minute with the defaults. Users would wait that long for access that
// Stripe already granted. Processing holds the event row locked (FOR UPDATE) for its whole
// transaction, and PostgreSQL drops a dead process's locks with its connection, so an event that
// is still "received", whose job has been running for a few seconds and whose row nobody holds,
// belongs to a dead process: it gets a fresh job at once. A job that was only slow finds the
// event processed when it goes on, and does nothing; River's own rescue stays as the backstop.

// rescueInterval is how often every process looks for stuck events. Every process, not one
// leader: when the leader is the process that died, a new one is elected only after its lease
// expires (about 15 s), too late. Rounds of several processes are safe together: each locks the
// events it rescues (SKIP LOCKED), and an event with a live job is left alone.
const rescueInterval = 5 * time.Second

// rescueStuckAfter is how long a job may run before its event counts as stuck: far above an
// event's processing time (milliseconds), far below River's own rescue.
const rescueStuckAfter = 5 * time.Second

// RunRescuer rescues stuck events every rescueInterval until ctx ends.
func (i *Inbox) RunRescuer(ctx context.Context) {
	t := time.NewTicker(rescueInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := i.RescueStuck(ctx, rescueStuckAfter)
		switch {
		case err != nil && ctx.Err() == nil:
			i.log.Warn("rescue of stuck webhook events failed; next round in a few seconds", "error", err)
		case n > 0:
			i.log.Warn("gave events held by a dead process's jobs a new job", "count", n)
		}
	}
}

// RescueStuck enqueues a new job for every received event whose only job has been running for
// longer than stuckAfter and whose row no live transaction holds. It returns how many events it
// rescued or dead-lettered.
//
// The dead attempt counts: the event's attempts become that attempt's number, so that an event
// that kills the process every time (a poison event) is dead-lettered after worker.max_attempts
// instead of being rescued forever.
func (i *Inbox) RescueStuck(ctx context.Context, stuckAfter time.Duration) (int, error) {
	type stuck struct {
		EventID    string `gorm:"column:event_id"`
		Livemode   bool   `gorm:"column:livemode"`
		Type       string `gorm:"column:type"`
		Attempts   int    `gorm:"column:attempts"`
		JobAttempt int    `gorm:"column:job_attempt"`
	}
	var rows []stuck
	dead, rescued := 0, 0
	err := i.cfg.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		// Running jobs are few (workers × replicas); the state condition comes first so that the
		// planner starts from them. The live-job check is a containment on args, answered by
		// River's GIN index on args: with ->> it hashed every live job of a backlog each round.
		// Straight to the transaction's connection: gorm's Raw takes the @ of @> for a named
		// argument and drops the others.
		found, err := tx.Statement.ConnPool.QueryContext(ctx, `
			/* all modes */
			SELECT e.event_id, e.livemode, e.type, e.attempts,
			  coalesce((SELECT max(r.attempt) FROM river_job r
			   WHERE r.state = 'running' AND r.kind = $1 AND r.args->>'event_id' = e.event_id
			     AND coalesce(CAST(r.args->>'livemode' AS boolean), e.livemode) = e.livemode), 0) AS job_attempt
			FROM webhook_events e
			WHERE e.event_id IN (
			    SELECT j.args->>'event_id' FROM river_job j
			    WHERE j.state = 'running' AND j.kind = $1 AND j.attempted_at < $2)
			  AND e.status = 'received'
			  AND NOT EXISTS (
			    SELECT 1 FROM river_job w
			    WHERE w.args @> jsonb_build_object('event_id', e.event_id)
			      AND coalesce(CAST(w.args->>'livemode' AS boolean), e.livemode) = e.livemode
			      AND w.state IN ('available', 'pending', 'retryable', 'scheduled') AND w.kind = $1)
			ORDER BY e.received_at
			LIMIT 1000
			FOR UPDATE OF e SKIP LOCKED`, JobKindProcessEvent, i.cfg.Now().Add(-stuckAfter))
		if err == nil {
			rows, err = database.ScanAll[stuck](found)
		}
		if err != nil {
			return fmt.Errorf("find events held by stuck jobs: %w", err)
		}
		for _, r := range rows {
			// Another process's round may have rescued it between our snapshot and our lock: this
			// statement sees what committed since.
			var live bool
			if err := tx.Statement.ConnPool.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM river_job
				WHERE args @> jsonb_build_object('event_id', CAST($2 AS text))
				  AND coalesce(CAST(args->>'livemode' AS boolean), $3) = $3
				  AND state IN ('available', 'pending', 'retryable', 'scheduled') AND kind = $1)`,
				JobKindProcessEvent, r.EventID, r.Livemode).Scan(&live); err != nil {
				return err
			}
			if live {
				continue
			}
			// The number the dead attempt had, as process counts it.
			attempt := max(r.Attempts+1, r.JobAttempt)
			if attempt >= i.cfg.MaxAttempts {
				reason := fmt.Sprintf("%s: the process applying it died %d times", FailureCrashed, attempt)
				if err := deadLetter(tx, EventKey{r.EventID, r.Livemode}, attempt, reason, i.cfg.Now()); err != nil {
					return err
				}
				i.metrics.dead.WithLabelValues(r.Type, FailureCrashed).Inc()
				dead++
				continue
			}
			if err := tx.Exec(`UPDATE webhook_events SET attempts = $1 WHERE event_id = $2 AND livemode = $3`, attempt, r.EventID, r.Livemode).Error; err != nil {
				return err
			}
			if err := i.enqueue(ctx, tx, EventKey{r.EventID, r.Livemode}); err != nil {
				return err
			}
			rescued++
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	if dead > 0 {
		i.log.Error("webhook events dead-lettered: the process applying them died every time", "count", dead)
	}
	return rescued + dead, nil
}

// FailureCrashed is the failure reason of an event whose processing killed the process (or was
// cut by crashes) worker.max_attempts times.
const FailureCrashed = "crashed_during_processing"
