package billing

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"billing/billing/billingtest"
	"billing/internal/jobs"
	"billing/internal/stripeclient"
)

const grace = 2 * time.Hour

// withStripe gives the service a Stripe client, which turns the re-reads on.
func withStripe(g SubscriptionGetter) envOpt {
	return func(d *Deps) { d.Reread.Stripe = g; d.PeriodGrace = grace }
}

// plannedRereadOf is the renewal whose re-read the row plans and the sweep has not queued yet,
// nil for none.
func (e *env) plannedRereadOf(t *testing.T, subscriptionID string) *time.Time {
	t.Helper()
	var due []time.Time
	if err := e.db.Raw(`SELECT renewal_reread_due FROM subscriptions WHERE subscription_id = $1 AND NOT livemode
		AND renewal_reread_due IS NOT NULL AND NOT renewal_reread_queued`, subscriptionID).Scan(&due).Error; err != nil {
		t.Fatal(err)
	}
	if len(due) == 0 {
		return nil
	}
	return &due[0]
}

func (e *env) reallyQueuedRereads(t *testing.T, subscriptionID string) []billingtest.RereadJob {
	t.Helper()
	return billingtest.RereadJobs(t, e.db, RereadJobKind, subscriptionID)
}

// The event plans the re-read in the row and queues no job; the sweep queues it only once its
// check is due (halfway through the grace), as the job the event used to queue, and marks the
// plan queued, so a second sweep queues nothing; a renewal moves the plan on, and a
// cancellation drops it.
func TestRenewalRereadIsPlannedThenQueuedByTheSweepWhenDue(t *testing.T) {
	t.Parallel()
	unused := stripeclient.New("http://127.0.0.1:9", "sk_test_unused", slog.New(slog.DiscardHandler)).Subscriptions
	e := newEnv(t, withStripe(unused))
	ctx := context.Background()
	s := subObj{ID: "sub_sw", Customer: "cus_sw", Status: StatusActive, Price: "p", PeriodStart: 10, PeriodEnd: 30 * 86400}
	e.mustHandle(t, created("evt_sw1", 10, s), updated("evt_sw2", 20, s))
	if due := e.plannedRereadOf(t, "sub_sw"); due == nil || !due.Equal(at(30*86400)) {
		t.Fatalf("planned re-read %v, want the renewal %v", due, at(30*86400))
	}
	if jobs := e.reallyQueuedRereads(t, "sub_sw"); len(jobs) != 0 {
		t.Fatalf("the event queued jobs: %+v", jobs)
	}

	// A second before the check: nothing.
	check := at(30 * 86400).Add(grace / 2)
	e.clock.Set(check.Add(-time.Second))
	if n, err := e.svc.QueueDueRereads(ctx); err != nil || n != 0 {
		t.Fatalf("sweep before the check: %d, %v", n, err)
	}
	if e.plannedRereadOf(t, "sub_sw") == nil {
		t.Fatal("the early sweep took the plan")
	}
	// At the check: the job, scheduled at the check, and the plan marked queued.
	e.clock.Set(check)
	if n, err := e.svc.QueueDueRereads(ctx); err != nil || n != 1 {
		t.Fatalf("sweep at the check: %d, %v", n, err)
	}
	jobs := e.reallyQueuedRereads(t, "sub_sw")
	if len(jobs) != 1 || jobs[0].Due != base+30*86400 || !jobs[0].ScheduledAt.Equal(check) || jobs[0].MaxAttempts != DefaultRereadAttempts {
		t.Fatalf("after the sweep: %+v, want one job at %v", jobs, check)
	}
	if due := e.plannedRereadOf(t, "sub_sw"); due != nil {
		t.Fatalf("plan left after its job was queued: %v", due)
	}
	if n, err := e.svc.QueueDueRereads(ctx); err != nil || n != 0 {
		t.Fatalf("second sweep: %d, %v", n, err)
	}

	// The renewal plans the next period's read; a cancellation drops the plan.
	renewed := s
	renewed.PeriodStart, renewed.PeriodEnd = 30*86400, 60*86400
	e.mustHandle(t, updated("evt_sw3", 30*86400, renewed))
	if due := e.plannedRereadOf(t, "sub_sw"); due == nil || !due.Equal(at(60*86400)) {
		t.Fatalf("after the renewal: planned %v", due)
	}
	e.mustHandle(t, deleted("evt_sw4", 30*86400+60, renewed.With(StatusCanceled)))
	if due := e.plannedRereadOf(t, "sub_sw"); due != nil {
		t.Fatalf("a canceled subscription still plans a re-read of %v", due)
	}
}

// A job an earlier build queued with the event and the sweep's for the same renewal are one job:
// the sweep meets River's unique key, and still takes the plan.
func TestRenewalRereadSweepMeetsAJobQueuedByAnEarlierBuild(t *testing.T) {
	t.Parallel()
	unused := stripeclient.New("http://127.0.0.1:9", "sk_test_unused", slog.New(slog.DiscardHandler)).Subscriptions
	e := newEnv(t, withStripe(unused))
	ctx := context.Background()
	s := subObj{ID: "sub_old", Customer: "cus_old", Status: StatusActive, Price: "p", PeriodStart: 10, PeriodEnd: 30 * 86400}
	e.mustHandle(t, created("evt_old1", 10, s))
	check := at(30 * 86400).Add(grace / 2)
	query, params, err := jobs.UniqueInsert(e.svc.rereads.jobs, RereadArgs{SubscriptionID: "sub_old", Due: base + 30*86400},
		check, DefaultRereadAttempts, 1, jobs.Within{})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.db.Exec(query, params...).Error; err != nil {
		t.Fatalf("the earlier build's job: %v", err)
	}
	e.clock.Set(check)
	if n, err := e.svc.QueueDueRereads(ctx); err != nil || n != 1 {
		t.Fatalf("sweep: %d, %v", n, err)
	}
	if jobs := e.reallyQueuedRereads(t, "sub_old"); len(jobs) != 1 {
		t.Fatalf("jobs: %+v, want the one", jobs)
	}
	if due := e.plannedRereadOf(t, "sub_old"); due != nil {
		t.Fatalf("plan left: %v", due)
	}
}
