package webhooks

import (
	"context"
	"fmt"
	"time"

	"github.com/riverqueue/river"
)

// Retention: processed and ignored events are history, kept for investigation and the admin log
// for Config.Retention, then pruned so that the inbox's cost stays flat in the age of the
// account. Failed events are never pruned (an admin still has to look at them), nor received ones
// (not applied yet).

// RetentionArgs is the periodic job that prunes old processed and ignored events.
type RetentionArgs struct{}

func (RetentionArgs) Kind() string { return "webhook_retention" }

func (RetentionArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: river.QueueDefault, MaxAttempts: 3}
}

// pruneBatch bounds one DELETE: short transactions that never hold many row locks, so receipt
// and processing never wait on the pruner.
const pruneBatch = 1000

type pruner struct {
	river.WorkerDefaults[RetentionArgs]
	inbox *Inbox
}

func (p *pruner) Work(ctx context.Context, job *river.Job[RetentionArgs]) error {
	n, err := p.inbox.Prune(ctx, p.inbox.cfg.Now().Add(-p.inbox.cfg.Retention), pruneBatch)
	if n > 0 {
		p.inbox.log.Info("pruned old webhook events", "count", n, "retention", p.inbox.cfg.Retention)
	}
	return err
}

// Prune deletes processed and ignored events received before cutoff, batch rows at a time, and
// returns how many it deleted. Rows locked by someone else (an event being replayed) are
// skipped, not waited for.
func (i *Inbox) Prune(ctx context.Context, cutoff time.Time, batch int) (int, error) {
	total := 0
	for {
		res := i.cfg.DB.WithContext(ctx).Exec(`
			/* all modes: retention prunes both worlds alike */
			WITH doomed AS (
			  SELECT event_id, livemode FROM webhook_events
			  WHERE status IN ('processed', 'ignored') AND received_at < $1
			  ORDER BY received_at
			  LIMIT $2
			  FOR UPDATE SKIP LOCKED
			)
			DELETE FROM webhook_events e USING doomed d WHERE e.event_id = d.event_id AND e.livemode = d.livemode`, cutoff, batch)
		if res.Error != nil {
			return total, fmt.Errorf("prune webhook events: %w", res.Error)
		}
		total += int(res.RowsAffected)
		if res.RowsAffected < int64(batch) || ctx.Err() != nil {
			return total, ctx.Err()
		}
	}
}
