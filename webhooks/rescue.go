package webhooks

import (
	"context"
	"fmt"
	"time"

	"github.com/riverqueue/river"
	"gorm.io/gorm"
)

// Fast rescue. When a replica dies (SIGKILL, OOM, a lost node), the jobs it had fetched stay
// "running" until River's rescuer notices them: worker.rescue_after plus the rescuer's own
// 30-second round, over a minute with the defaults. Users would wait that long for access that
// Stripe already granted. Processing holds the event row locked (FOR UPDATE) for its whole
// transaction, and PostgreSQL drops a dead process's locks with its connection, so an event that
// is still "received", whose job has been running for a few seconds and whose row nobody holds,
// belongs to a dead process: it gets a fresh job at once. A job that was only slow finds the
// event processed when it goes on, and does nothing; River's own rescue stays as the backstop.

// RescueArgs is the periodic job that gives events stuck behind a dead process's job a new one.
type RescueArgs struct{}

func (RescueArgs) Kind() string { return "webhook_rescue" }

func (RescueArgs) InsertOpts() river.InsertOpts {
	// The default queue, not the webhooks one: a backlog of events must not delay their rescue.
	return river.InsertOpts{Queue: river.QueueDefault, MaxAttempts: 1}
}

const (
	// rescueInterval is how often the leader looks for stuck events.
	rescueInterval = 5 * time.Second
	// rescueStuckAfter is how long a job may run before its event counts as stuck: far above an
	// event's processing time (milliseconds), far below River's own rescue.
	rescueStuckAfter = 5 * time.Second
)

type rescuer struct {
	river.WorkerDefaults[RescueArgs]
	inbox *Inbox
}

func (r *rescuer) Work(ctx context.Context, job *river.Job[RescueArgs]) error {
	n, err := r.inbox.RescueStuck(ctx, rescueStuckAfter)
	if n > 0 {
		r.inbox.log.Warn("gave events held by a dead process's jobs a new job", "count", n)
	}
	return err
}

// RescueStuck enqueues a new job for every received event whose only job has been running for
// longer than stuckAfter and whose row no live transaction holds. It returns how many.
func (i *Inbox) RescueStuck(ctx context.Context, stuckAfter time.Duration) (int, error) {
	var ids []string
	err := i.cfg.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		// Running jobs are few (workers × replicas); the state condition comes first so that the
		// planner starts from them, and the live-job check reads River's fetch index by state.
		err := tx.Raw(`
			SELECT e.event_id FROM river_job j
			JOIN webhook_events e ON e.event_id = j.args->>'event_id'
			WHERE j.state = 'running' AND j.kind = $1 AND j.attempted_at < $2
			  AND e.status = 'received'
			  AND NOT EXISTS (
			    SELECT 1 FROM river_job w
			    WHERE w.state IN ('available', 'pending', 'retryable', 'scheduled')
			      AND w.kind = $1 AND w.args->>'event_id' = e.event_id)
			ORDER BY j.attempted_at
			LIMIT 1000
			FOR UPDATE OF e SKIP LOCKED`, JobKindProcessEvent, i.cfg.Now().Add(-stuckAfter)).Scan(&ids).Error
		if err != nil {
			return fmt.Errorf("find events held by stuck jobs: %w", err)
		}
		for _, id := range ids {
			if err := i.enqueue(ctx, tx, id); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return len(ids), nil
}
