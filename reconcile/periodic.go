package reconcile

import (
	"context"
	"errors"
	"time"

	"github.com/riverqueue/river"
)

// The periodic run of serve. River runs periodic jobs on its leader only; the job does not run
// the reconciliation itself, it starts one (Start) when one is due, and the run belongs to the
// service (Stop ends it at shutdown). Due means: no run of the mode went through within
// reconcile.interval, read from reconcile_runs, so that restarts and leader changes neither skip
// nor repeat runs. A manual run and the periodic one never overlap: both need the mode's advisory
// lock. With no run yet, the first periodic one comes an interval after serve first checked.

// maxCheckEvery bounds how long after it is due a run starts.
const maxCheckEvery = 5 * time.Minute

// PeriodicArgs is the job that starts a run when one is due.
type PeriodicArgs struct{}

// Kind is River's job kind.
func (PeriodicArgs) Kind() string { return "reconcile_periodic" }

// InsertOpts: one attempt; the next check comes soon enough.
func (PeriodicArgs) InsertOpts() river.InsertOpts { return river.InsertOpts{MaxAttempts: 1} }

type periodicWorker struct {
	river.WorkerDefaults[PeriodicArgs]
	s *Service
}

func (w *periodicWorker) Work(ctx context.Context, _ *river.Job[PeriodicArgs]) error {
	_, err := w.s.Tick(ctx)
	return err
}

// AddWorkers registers the periodic job's worker.
func (s *Service) AddWorkers(workers *river.Workers) {
	river.AddWorker(workers, &periodicWorker{s: s})
}

// PeriodicJobs returns the periodic check for River's config; none when reconcile.interval is 0.
func (s *Service) PeriodicJobs() []*river.PeriodicJob {
	if s.interval <= 0 {
		return nil
	}
	every := min(s.interval, maxCheckEvery)
	return []*river.PeriodicJob{river.NewPeriodicJob(river.PeriodicInterval(every),
		func() (river.JobArgs, *river.InsertOpts) { return PeriodicArgs{}, nil },
		&river.PeriodicJobOpts{RunOnStart: true})}
}

// Tick starts a run if one is due and returns its id ("" when none was started). It also sets
// the last-success gauge from the database, so that a replica that has not run one itself (or
// has just started) reports the fleet's.
func (s *Service) Tick(ctx context.Context) (string, error) {
	started, finished, err := s.lastSuccess(ctx)
	if err != nil {
		return "", err
	}
	if !finished.IsZero() {
		s.metrics.lastSuccess.Set(float64(finished.Unix()))
	}
	if s.interval <= 0 {
		return "", nil
	}
	if started.IsZero() {
		// No run went through yet: the first comes an interval after the first check, so that a
		// fresh deployment (or a development one against stripe-mock) is not reconciled at its
		// first start; `billing reconcile` is the backfill.
		if started, err = s.firstCheck(ctx); err != nil {
			return "", err
		}
	}
	if s.now().Sub(started) < s.interval {
		return "", nil
	}
	runID, err := s.Start(RunOptions{Trigger: TriggerPeriodic})
	if errors.Is(err, ErrRunning) {
		s.log.InfoContext(ctx, "reconcile due, but a run of the mode is going")
		return "", nil
	}
	return runID, err
}
