package billing

import (
	"context"
	"fmt"
	"time"

	"github.com/riverqueue/river"
	"gorm.io/gorm"

	"billing/internal/jobs"
)

// The sweep of the planned renewal re-reads: every RereadSweepInterval, on River's leader, the
// renewals whose check is due (halfway through the grace, by the policy's clock) are queued as
// re-read jobs, and their plans marked queued, in one transaction per batch: a plan is either
// still to queue or its job exists. The plan stays in the row, so that an event that leaves the
// renewal where it was knows its job is queued without reading the row first. The job is the one an event queued before the plan moved into the
// row (the same unique key and schedule), so a job queued by an earlier build and the sweep's
// never both run.

// RereadSweepJobKind is the River kind of RereadSweepArgs.
const RereadSweepJobKind = "billing_reread_sweep"

// RereadSweepInterval is how often the sweep runs. A re-read comes at most this late after its
// check is due: nothing next to the grace (policy.period_grace, 2 hours by default).
const RereadSweepInterval = 30 * time.Second

// sweepBatch is how many plans one transaction of the sweep takes.
const sweepBatch = 500

// RereadSweepArgs is the periodic sweep of the planned renewal re-reads.
type RereadSweepArgs struct{}

func (RereadSweepArgs) Kind() string { return RereadSweepJobKind }

// PeriodicJobs is the sweep, every RereadSweepInterval and at start. River runs periodic jobs on
// its leader only; SKIP LOCKED lets two sweeps (a leader's handover) share the work.
func PeriodicJobs() []*river.PeriodicJob {
	return []*river.PeriodicJob{river.NewPeriodicJob(river.PeriodicInterval(RereadSweepInterval),
		func() (river.JobArgs, *river.InsertOpts) { return RereadSweepArgs{}, nil }, &river.PeriodicJobOpts{RunOnStart: true})}
}

type rereadSweepWorker struct {
	river.WorkerDefaults[RereadSweepArgs]
	s *Service
}

func (w *rereadSweepWorker) Work(ctx context.Context, _ *river.Job[RereadSweepArgs]) error {
	n, err := w.s.QueueDueRereads(ctx)
	if n > 0 {
		w.s.log.InfoContext(ctx, "renewal re-reads queued", "count", n)
	}
	return err
}

// QueueDueRereads queues the re-read of every renewal whose check is due, and returns how many
// it queued.
func (s *Service) QueueDueRereads(ctx context.Context) (int, error) {
	return s.queueRereadsDueBy(ctx, s.now().Add(-s.grace/2))
}

// queueRereadsDueBy queues the re-reads of the renewals due by the instant given.
func (s *Service) queueRereadsDueBy(ctx context.Context, renewal time.Time) (int, error) {
	if !s.rereadsOn() {
		return 0, nil
	}
	total := 0
	for {
		n, err := s.queueDueRereads(ctx, renewal)
		total += n
		if err != nil || n < sweepBatch {
			return total, err
		}
	}
}

// plannedReread is a plan the sweep took from its row.
type plannedReread struct {
	SubscriptionID string    `gorm:"column:subscription_id"`
	Livemode       bool      `gorm:"column:livemode"`
	Due            time.Time `gorm:"column:renewal_reread_due"`
}

// queueDueRereads queues one batch. Plans of both modes are taken, as the events of both modes
// queued their jobs: the worker skips a subscription of the other mode than Stripe's key.
func (s *Service) queueDueRereads(ctx context.Context, renewal time.Time) (int, error) {
	half := s.grace / 2
	var taken []plannedReread
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Raw(`/* all modes: the worker skips a subscription of the other mode */
			WITH due AS (
			  SELECT subscription_id, livemode, renewal_reread_due FROM subscriptions
			  WHERE renewal_reread_due IS NOT NULL AND NOT renewal_reread_queued AND renewal_reread_due <= $1
			  ORDER BY renewal_reread_due LIMIT $2 FOR UPDATE SKIP LOCKED
			)
			UPDATE subscriptions s SET renewal_reread_queued = true
			FROM due WHERE s.subscription_id = due.subscription_id AND s.livemode = due.livemode
			RETURNING s.subscription_id, s.livemode, due.renewal_reread_due`,
			renewal, sweepBatch).Scan(&taken).Error; err != nil {
			return err
		}
		sqlTx, err := jobs.SQLTx(tx)
		if err != nil {
			return err
		}
		for _, p := range taken {
			args := RereadArgs{SubscriptionID: p.SubscriptionID, Livemode: p.Livemode, Due: p.Due.Unix()}
			if _, err := s.insertReread(ctx, sqlTx, args, p.Due.Add(half)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("sweep renewal re-reads: %w", err)
	}
	return len(taken), nil
}
