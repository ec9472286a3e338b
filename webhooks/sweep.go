package webhooks

import (
	"context"
	"fmt"
	"time"

	"github.com/riverqueue/river"
	"gorm.io/gorm"
)

// SweepArgs is the periodic job that re-enqueues received events that have no live job. Each
// stored event gets its job in the same transaction, so this only matters when River gave up on
// a job (its own attempt limit, a job deleted by hand): a safety net for "no acknowledged event
// is left unprocessed".
type SweepArgs struct{}

func (SweepArgs) Kind() string { return "webhook_sweep" }

func (SweepArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: QueueWebhooks, MaxAttempts: 3}
}

// sweepAge is how long an event must have waited before the sweeper looks at it: far beyond the
// normal lag, so it never races the ordinary job.
const sweepAge = 10 * time.Minute

type sweeper struct {
	river.WorkerDefaults[SweepArgs]
	inbox *Inbox
}

func (s *sweeper) Work(ctx context.Context, job *river.Job[SweepArgs]) error {
	n, err := s.inbox.Sweep(ctx, sweepAge)
	if err != nil {
		return err
	}
	if n > 0 {
		s.inbox.log.Warn("re-enqueued received events that had no live job", "count", n)
	}
	return nil
}

// PeriodicJobs returns the inbox's periodic jobs for River's config.
func (i *Inbox) PeriodicJobs() []*river.PeriodicJob {
	jobs := []*river.PeriodicJob{
		river.NewPeriodicJob(river.PeriodicInterval(5*time.Minute), func() (river.JobArgs, *river.InsertOpts) {
			return SweepArgs{}, nil
		}, &river.PeriodicJobOpts{RunOnStart: true}),
	}
	if i.cfg.Retention > 0 {
		jobs = append(jobs, river.NewPeriodicJob(river.PeriodicInterval(time.Hour), func() (river.JobArgs, *river.InsertOpts) {
			return RetentionArgs{}, nil
		}, &river.PeriodicJobOpts{RunOnStart: true}))
	}
	return jobs
}

// Sweep enqueues a job for every event received more than minAge ago that is still `received`
// and has no job that could still run. It returns how many it enqueued.
func (i *Inbox) Sweep(ctx context.Context, minAge time.Duration) (int, error) {
	var ids []EventKey
	err := i.cfg.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		err := tx.Raw(`
			/* all modes */
			SELECT e.event_id AS id, e.livemode FROM webhook_events e
			WHERE e.status = 'received' AND e.received_at < $1
			  AND NOT EXISTS (
			    SELECT 1 FROM river_job j
			    WHERE j.kind = $2 AND j.args->>'event_id' = e.event_id
			      AND coalesce(CAST(j.args->>'livemode' AS boolean), e.livemode) = e.livemode
			      AND j.state IN ('available', 'pending', 'retryable', 'running', 'scheduled'))
			ORDER BY e.received_at
			LIMIT 1000
			FOR UPDATE OF e SKIP LOCKED`, i.cfg.Now().Add(-minAge), JobKindProcessEvent).Scan(&ids).Error
		if err != nil {
			return fmt.Errorf("find events without a job: %w", err)
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
