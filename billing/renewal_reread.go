package billing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/stripe/stripe-go/v79"
	"gorm.io/gorm"

	"billing/internal/jobs"
	"billing/internal/stripeclient"
	"billing/webhooks"
)

// Time-aware entitlement: a subscription is entitled by what Stripe last told us, and Stripe
// tells us of a renewal by an event. Should that event be lost, an active subscription would
// stay entitled forever, so the policy gives it until its renewal is due plus
// policy.period_grace (entitlements.Policy.Unconfirmed). Halfway through the grace a River job
// re-reads the one subscription from Stripe and applies it as a snapshot (early, so that a
// renewed user never loses access while the read runs; once more at the end of the grace if
// Stripe still showed the old period): a renewal moves the period on and access continues; a
// cancellation ends it; a Stripe that cannot be reached, or that still shows the old period,
// leaves the policy to withdraw access, with a warning in the log.
//
// The re-read is planned in the subscription's row by the event (or snapshot) that sets the
// renewal, in its UPDATE (renewal_reread_due), and queued as a job, keyed by subscription and
// renewal time, by a periodic sweep once its check is due (renewal_sweep.go): the many events
// of one period plan one read, a renewal plans the next one instead, and a job that finds its
// period gone does nothing.
//
// The same re-read settles two events of one subscription created in the same second with
// different statuses: Stripe's seconds cannot order them, the status rank only guesses, and
// Stripe's current object knows.

// Defaults of the re-read's settings.
const (
	DefaultPeriodGrace      = 2 * time.Hour
	DefaultRereadAttempts   = 8
	DefaultRereadRetryDelay = time.Minute
	// maxRereadRetryDelay caps the backoff: with the defaults the attempts span about two hours.
	maxRereadRetryDelay = time.Hour
)

// SubscriptionGetter reads one subscription from Stripe. The Subscriptions client of the API
// that internal/stripeclient builds implements it.
type SubscriptionGetter interface {
	Get(id string, params *stripe.SubscriptionParams) (*stripe.Subscription, error)
}

// RereadDeps configure the re-read of a subscription from Stripe.
type RereadDeps struct {
	// Stripe reads the subscription (pinned API version); AddWorkers requires it.
	Stripe SubscriptionGetter
	// Livemode is the mode of Stripe's key: an object of the other mode cannot be read with it.
	Livemode bool
	// MaxAttempts of one re-read before it gives up; DefaultRereadAttempts when zero.
	MaxAttempts int
	// RetryDelay is the first delay between attempts, doubled at each one; DefaultRereadRetryDelay
	// when zero.
	RetryDelay time.Duration
}

// RereadJobKind is the River kind of RereadArgs; queued jobs name it, so it never changes.
const RereadJobKind = "billing_reread"

// RereadArgs is the River job that re-reads one subscription from Stripe. Exactly one of Due
// and Tie is set; with the subscription id they make the job unique.
type RereadArgs struct {
	SubscriptionID string `json:"subscription_id" river:"unique"`
	Livemode       bool   `json:"livemode"`
	// Due is the renewal (Unix seconds) whose confirmation the job checks.
	Due int64 `json:"due,omitempty" river:"unique"`
	// Tie is the second (Unix) in which two events with different statuses were created.
	Tie int64 `json:"tie,omitempty" river:"unique"`
}

func (RereadArgs) Kind() string { return RereadJobKind }

// rereads is the service's part that queues and runs re-reads.
type rereads struct {
	RereadDeps
	jobs     jobs.Inserter
	outcomes *prometheus.CounterVec
}

func newRereads(d Deps) *rereads {
	r := &rereads{RereadDeps: d.Reread, jobs: d.Jobs}
	if r.MaxAttempts <= 0 {
		r.MaxAttempts = DefaultRereadAttempts
	}
	if r.RetryDelay <= 0 {
		r.RetryDelay = DefaultRereadRetryDelay
	}
	r.outcomes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "billing_subscription_rereads_total",
		Help: "Re-reads of a subscription from Stripe, by reason (renewal, tie) and outcome (applied, unchanged, unconfirmed, skipped, failed).",
	}, []string{"reason", "outcome"})
	if d.Registerer != nil {
		d.Registerer.MustRegister(r.outcomes)
	}
	return r
}

// AddWorkers registers the re-read worker and its sweep's. It panics on a wiring bug (no Stripe
// client).
func (s *Service) AddWorkers(w *river.Workers) {
	if s.rereads.Stripe == nil {
		panic("billing: Deps.Reread.Stripe is nil")
	}
	river.AddWorker(w, &rereadWorker{s: s})
	river.AddWorker(w, &rereadSweepWorker{s: s})
}

// dueReread is a re-read that a subscription event (or snapshot) calls for now: its job is queued
// in the event's transaction, by the event's UPDATE on the path that locks first (withRereads),
// and only if that UPDATE applied the event when ifApplied.
type dueReread struct {
	args      RereadArgs
	at        time.Time
	ifApplied bool
}

// rereadsOn reports whether re-reads are planned and queued at all.
func (s *Service) rereadsOn() bool {
	if s.rereads.jobs == nil || s.rereads.Stripe == nil {
		return false // nothing could run the job (a service built for other packages' tests)
	}
	_, discard := s.rereads.jobs.(jobs.Discard) // a replay whose jobs must not exist
	return !discard
}

// renewalPlan is what a subscription event (or snapshot) writes to the plan of its renewal's
// re-read when it is applied: whether re-reads are on, and the renewal the subscription now
// waits for (nil unless it is active or trialing). The plan is made anew only when the renewal
// moves (subscriptionSet): an event that leaves it where the row had it (most updates: a seat,
// metadata, a redelivered snapshot) leaves the plan, or its job once queued, as it is.
func (s *Service) renewalPlan(obj *subscriptionObject, status string) (on bool, renewal *time.Time) {
	if !s.rereadsOn() {
		return false, nil
	}
	_, end := obj.Period()
	next := Subscription{Status: status, CurrentPeriodEnd: end.Ptr(), TrialEnd: obj.TrialEnd.Ptr()}
	return true, next.RenewalDue()
}

// rereadsOf are the re-reads that the subscription event (or snapshot) ev calls for at once: the
// settling of a tie with the event stored before, created in the same second with another
// status. A snapshot fetched within that second would lose the tie again, so it is read in the
// next one.
func (s *Service) rereadsOf(ev webhooks.Event, prior *Subscription, status string) []dueReread {
	if !s.rereadsOn() {
		return nil
	}
	var due []dueReread
	created := ev.Created.UTC().Truncate(time.Second)
	if prior.SubEventCreated != nil && prior.SubEventCreated.UTC().Truncate(time.Second).Equal(created) && prior.Status != status {
		due = append(due, dueReread{args: RereadArgs{SubscriptionID: prior.SubscriptionID, Livemode: ev.Livemode, Tie: created.Unix()},
			at: created.Add(time.Second)})
	}
	return due
}

// withRereads makes update (which applies a subscription event, its arguments params) the
// statement that also queues the event's re-reads: data-modifying CTEs, each inserted for each
// row the UPDATE applied when ifApplied. It selects the rows updated, then whether each re-read
// was queued (not a duplicate).
func (s *Service) withRereads(update string, params []any, due []dueReread) (string, []any, error) {
	var q strings.Builder
	q.WriteString("WITH updated AS (" + update + linkedUserReturning + " AS user_id)")
	selects := "(SELECT count(*) FROM updated), (SELECT max(user_id) FROM updated)"
	for k, r := range due {
		from := ""
		if r.ifApplied {
			from = "updated"
		}
		job, jobParams, err := jobs.UniqueInsert(s.rereads.jobs, r.args, r.at, s.rereads.MaxAttempts, len(params)+1, jobs.Within{From: from})
		if err != nil {
			return "", nil, fmt.Errorf("queue re-read of %s: %w", r.args.SubscriptionID, err)
		}
		name := "reread" + strconv.Itoa(k)
		q.WriteString(", " + name + " AS (" + job + " RETURNING 1)")
		selects += ", (SELECT count(*) FROM " + name + ")"
		params = append(params, jobParams...)
	}
	q.WriteString(" SELECT " + selects)
	return q.String(), params, nil
}

// unconfirmed is the policy's Unconfirmed at the service's now, nil without a policy.
func (s *Service) unconfirmed(sub *Subscription) *time.Time {
	if s.renewals == nil {
		return nil
	}
	return s.renewals.Unconfirmed(sub, s.now())
}

// MaxRereadRetryDelay caps the backoff of the Stripe reads' jobs (the features read too).
const MaxRereadRetryDelay = maxRereadRetryDelay

func (a RereadArgs) reason() string {
	if a.Tie != 0 {
		return "tie"
	}
	return "renewal"
}

type rereadWorker struct {
	river.WorkerDefaults[RereadArgs]
	s *Service
}

func (w *rereadWorker) Work(ctx context.Context, job *river.Job[RereadArgs]) error {
	outcome, err := w.s.reread(ctx, job.Args, job.Attempt >= job.MaxAttempts)
	if outcome != "" {
		w.s.rereads.outcomes.WithLabelValues(job.Args.reason(), outcome).Inc()
	}
	return err
}

// NextRetry doubles the delay at each attempt, from RetryDelay up to an hour.
func (w *rereadWorker) NextRetry(job *river.Job[RereadArgs]) time.Time {
	d := w.s.rereads.RetryDelay
	for i := 1; i < job.Attempt && d < maxRereadRetryDelay; i++ {
		d *= 2
	}
	return time.Now().Add(min(d, maxRereadRetryDelay))
}

// reread runs one attempt of a re-read job; last says no attempt follows. It returns the outcome
// to count ("" while the job goes on) and the error that River acts on.
func (s *Service) reread(ctx context.Context, a RereadArgs, last bool) (string, error) {
	log := s.log.With("subscription_id", a.SubscriptionID, "reason", a.reason())
	cur, err := s.Subscription(ctx, a.SubscriptionID, a.Livemode)
	if err != nil {
		return "", err
	}
	if a.Due != 0 {
		due := (*time.Time)(nil)
		if cur != nil {
			due = cur.RenewalDue()
		}
		if due == nil || due.Unix() != a.Due {
			// Renewed, ended or moved on since the job was queued: an event confirmed it.
			log.DebugContext(ctx, "re-read not needed: the renewal it checks is no longer pending")
			return "skipped", nil
		}
		// Read halfway through the grace, by the clock the policy uses, not River's: a renewed
		// subscription is confirmed while it is still entitled, so its user never loses access
		// for the time the read takes; a last read comes at the end of the grace if Stripe still
		// showed the old period.
		if wait := due.Add(s.grace / 2).Sub(s.now()); wait > 0 {
			return "", river.JobSnooze(wait)
		}
	} else if cur == nil {
		return "skipped", nil
	}
	if cur.Livemode != s.rereads.Livemode {
		log.WarnContext(ctx, "subscription cannot be confirmed: it belongs to the other Stripe mode than stripe.mode",
			"livemode", cur.Livemode)
		return "skipped", nil
	}
	fetchedAt := s.now()
	if a.Tie != 0 && fetchedAt.Unix() <= a.Tie {
		return "", river.JobSnooze(time.Unix(a.Tie+1, 0).Sub(fetchedAt))
	}

	params := &stripe.SubscriptionParams{}
	params.Context = ctx
	params.AddExpand("latest_invoice")
	got, err := s.rereads.Stripe.Get(a.SubscriptionID, params)
	if err != nil {
		var se *stripe.Error
		if errors.As(err, &se) && se.HTTPStatusCode == http.StatusNotFound {
			log.WarnContext(ctx, "subscription cannot be confirmed: Stripe does not know it", stripeclient.LogAttr(err))
			return "failed", river.JobCancel(stripeclient.Redact(err))
		}
		if last {
			log.WarnContext(ctx, "subscription cannot be confirmed: Stripe could not be read, giving up",
				stripeclient.LogAttr(err), slog.Any("unconfirmed_since", s.unconfirmed(cur)))
			return "failed", fmt.Errorf("re-read %s: %w", a.SubscriptionID, stripeclient.Redact(err))
		}
		return "", fmt.Errorf("re-read %s: %w", a.SubscriptionID, stripeclient.Redact(err))
	}
	if got.LastResponse == nil || len(got.LastResponse.RawJSON) == 0 {
		return "", fmt.Errorf("re-read %s: empty answer", a.SubscriptionID)
	}
	raw := json.RawMessage(got.LastResponse.RawJSON)
	var top struct {
		Livemode      bool            `json:"livemode"`
		LatestInvoice json.RawMessage `json:"latest_invoice"`
	}
	if err := json.Unmarshal(raw, &top); err != nil {
		return "", fmt.Errorf("re-read %s: %w", a.SubscriptionID, err)
	}
	snap := Snapshot{Livemode: top.Livemode, Subscription: raw, FetchedAt: fetchedAt, Source: "reread:" + a.SubscriptionID}
	if len(top.LatestInvoice) > 0 && top.LatestInvoice[0] == '{' {
		snap.LatestInvoice = top.LatestInvoice
	}

	outcome := "unchanged"
	var readAgainAt time.Time
	err = s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		out, err := s.ApplySnapshot(ctx, tx, snap)
		if err != nil {
			return err
		}
		if out.SubscriptionApplied || out.InvoiceApplied {
			outcome = "applied"
		}
		after, err := s.loadSubscriptionTx(ctx, tx, a.SubscriptionID, cur.Livemode)
		if err != nil {
			return err
		}
		if due := after.RenewalDue(); a.Due != 0 && due != nil && due.Unix() == a.Due && s.now().Before(due.Add(s.grace)) {
			// Not renewed at Stripe yet, but the grace still runs: one more read at its end.
			readAgainAt = due.Add(s.grace)
			outcome = "pending"
		} else if since := s.unconfirmed(after); since != nil {
			outcome = "unconfirmed"
			log.WarnContext(ctx, "subscription cannot be confirmed: Stripe still shows a renewal past its grace",
				"status", after.Status, "unconfirmed_since", since.UTC())
		}
		log.InfoContext(ctx, "subscription re-read from Stripe", "outcome", outcome, "from", cur.Status, "to", after.Status)
		return nil
	})
	if err != nil {
		if webhooks.IsPermanent(err) {
			log.WarnContext(ctx, "subscription cannot be confirmed: Stripe's object cannot be applied", "error", err)
			return "failed", river.JobCancel(err)
		}
		return "", err
	}
	if !readAgainAt.IsZero() {
		log.InfoContext(ctx, "renewal not at Stripe yet; reading again at the end of the grace", "at", readAgainAt.UTC())
		return "", river.JobSnooze(readAgainAt.Sub(s.now()))
	}
	return outcome, nil
}
