package entitlements

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/client"

	"billing/billing"
	"billing/billing/billingtest"
	"billing/internal/httpserver"
	"billing/internal/jobs"
	"billing/internal/stripeclient"
	"billing/internal/stripeemu"
	"billing/internal/testenv"
	"billing/webhooks"
)

// Time-aware entitlement: the re-read of a subscription whose renewal did not arrive, and of one
// whose events tie within a second, run by River against Stripe (stripe-mock behind the proxy,
// which answers the subscription the test puts there).

const grace = 2 * time.Hour

// rereadJobs sweeps every planned re-read into its job, whenever due, then lists the jobs: what
// the sweep will have queued by the time each check is due.
func (e *env) rereadJobs(t *testing.T, subscriptionID string) []billingtest.RereadJob {
	t.Helper()
	now := e.clock.Now()
	e.clock.Set(time.Unix(1<<40, 0))
	_, err := e.subs.QueueDueRereads(context.Background())
	e.clock.Set(now)
	if err != nil {
		t.Fatalf("sweep: %v", err)
	}
	return billingtest.RereadJobs(t, e.db, billing.RereadJobKind, subscriptionID)
}

// withStripe gives the service a Stripe client, which turns the re-reads on.
func withStripe(g billing.SubscriptionGetter) envOpt {
	return func(d *Deps, b *billing.Deps) { b.Reread.Stripe = g; d.Policy.PeriodGrace = grace }
}

// One job per subscription and renewal, however many events carry that renewal; a renewal
// queues the next one; trialing is checked at the trial's end; nothing is queued for statuses the
// period does not decide; and nothing without a Stripe client to run it.
func TestRenewalRereadIsQueuedOncePerRenewal(t *testing.T) {
	t.Parallel()
	unused := stripeclient.New("http://127.0.0.1:9", "sk_test_unused", slog.New(slog.DiscardHandler)).Subscriptions
	e := newEnv(t, withStripe(unused))
	s := subObj{ID: "sub_q", Customer: "cus_q", Status: billing.StatusActive, Price: "p", PeriodStart: 10, PeriodEnd: 30 * 86400}
	e.mustHandle(t, created("evt_q1", 10, s), updated("evt_q2", 20, s), updated("evt_q3", 30, s))
	// A redelivery and older events that lose the guard queue nothing either, even one whose
	// renewal differs: only an applied event sets the renewal its job checks.
	older := s
	older.PeriodEnd = 20 * 86400
	e.mustHandle(t, updated("evt_q3", 30, s), updated("evt_q0", 5, s), updated("evt_q00", 4, older))
	// Applied again through a snapshot (as reconciliation does): still the same job.
	e.applySnapshot(t, billing.Snapshot{Subscription: s.JSON(), FetchedAt: at(40), Source: "reconcile:q"})
	jobs := e.rereadJobs(t, "sub_q")
	if len(jobs) != 1 || jobs[0].Due != base+30*86400 || !jobs[0].ScheduledAt.Equal(at(30*86400).Add(grace/2)) ||
		jobs[0].MaxAttempts != billing.DefaultRereadAttempts {
		t.Fatalf("after four applies of one period: %+v, want one job halfway through the grace", jobs)
	}

	// Once its job is gone (worked, then cleaned away by River), events that leave the renewal
	// where it was queue no other: the job belongs to the event that set the renewal.
	jobID := jobs[0].ID
	if err := e.db.Exec(`DELETE FROM river_job WHERE id = $1`, jobID).Error; err != nil {
		t.Fatal(err)
	}
	seats := s
	seats.Quantity = 7
	e.mustHandle(t, updated("evt_q3b", 50, seats))
	if jobs := e.rereadJobs(t, "sub_q"); len(jobs) != 0 {
		t.Fatalf("an update that keeps the renewal queued: %+v", jobs)
	}

	// The renewal: a job for the new period.
	renewed := s
	renewed.PeriodStart, renewed.PeriodEnd = 30*86400, 60*86400
	e.mustHandle(t, updated("evt_q4", 30*86400, renewed))
	if jobs := e.rereadJobs(t, "sub_q"); len(jobs) != 1 || jobs[0].Due != base+60*86400 || !jobs[0].ScheduledAt.Equal(at(60*86400).Add(grace/2)) {
		t.Fatalf("after the renewal: %+v", jobs)
	}
	// past_due and canceled are not held to the period: no job.
	e.mustHandle(t, updated("evt_q5", 30*86400+60, renewed.With(billing.StatusPastDue)))
	e.mustHandle(t, deleted("evt_q6", 30*86400+120, renewed.With(billing.StatusCanceled)))
	if jobs := e.rereadJobs(t, "sub_q"); len(jobs) != 1 {
		t.Errorf("past_due and canceled queued re-reads: %+v", jobs)
	}

	// Trialing: checked at the trial's end.
	e.mustHandle(t, created("evt_t1", 10, subObj{ID: "sub_tr", Customer: "cus_q", Status: billing.StatusTrialing, Price: "p",
		PeriodStart: 10, PeriodEnd: 14 * 86400, TrialStart: 10, TrialEnd: 14 * 86400}))
	if jobs := e.rereadJobs(t, "sub_tr"); len(jobs) != 1 || jobs[0].Due != base+14*86400 {
		t.Errorf("trialing: %+v", jobs)
	}

	// Without a Stripe client nothing could run the job, so none is queued.
	plain := newEnv(t)
	plain.mustHandle(t, created("evt_p1", 10, s))
	if jobs := plain.rereadJobs(t, "sub_q"); len(jobs) != 0 {
		t.Errorf("queued without a Stripe client: %+v", jobs)
	}
}

// ---- the River harness ----------------------------------------------------------------------

// rereadEnv is an env whose River client works the re-read jobs, against the proxy's Stripe.
type rereadEnv struct {
	*env
	rc     *river.Client[*sql.Tx]
	proxy  *stripeemu.Proxy
	logs   *logRecorder
	events <-chan *river.Event
	now    time.Time // the real time the test started, whole seconds

	mu     sync.Mutex
	stripe map[string]json.RawMessage // what Stripe answers per subscription id
}

// newRereadEnv starts the harness. retrying uses the service's own Stripe client (which retries
// failed requests itself, waiting between tries); otherwise a client that tries once, so that a
// Stripe that is down fails fast.
func newRereadEnv(t *testing.T, retrying bool) *rereadEnv {
	t.Helper()
	db := testenv.DB(t)
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	r := &rereadEnv{
		proxy:  stripeemu.New(t, testenv.StripeMockURL(t)),
		logs:   &logRecorder{},
		now:    time.Now().UTC().Truncate(time.Second),
		stripe: map[string]json.RawMessage{},
	}
	r.proxy.Handle("/v1/subscriptions", r.serveSubscription)
	logger := slog.New(r.logs)

	var subs billing.SubscriptionGetter = stripeclient.New(r.proxy.URL, "sk_test_reread", logger).Subscriptions
	if !retrying {
		backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
			URL: stripe.String(r.proxy.URL), MaxNetworkRetries: stripe.Int64(0),
			LeveledLogger: &stripe.LeveledLogger{Level: stripe.LevelNull},
		})
		api := &client.API{}
		api.Init("sk_test_reread", &stripe.Backends{API: backend})
		subs = api.Subscriptions
	}

	e := &env{db: db, clock: testenv.NewClock(r.now), reg: webhooks.NewRegistry(), echo: echo.New()}
	workers := river.NewWorkers()
	rc, err := jobs.NewClient(sqlDB, jobs.ClientOptions{
		Workers:      workers,
		Queues:       map[string]int{river.QueueDefault: 2},
		PollInterval: 10 * time.Millisecond,
		Logger:       slog.New(slog.DiscardHandler),
		TestOnly:     true,
	})
	if err != nil {
		t.Fatalf("river client: %v", err)
	}
	policy := Policy{PastDueEntitled: true, PeriodGrace: grace}
	e.subs = billing.New(billing.Deps{
		DB: db, Jobs: rc, Logger: logger, Now: e.clock.Now, PeriodGrace: grace, Renewals: policy,
		Reread: billing.RereadDeps{Stripe: subs, MaxAttempts: 3, RetryDelay: time.Millisecond},
	})
	e.svc = New(Deps{DB: db, Billing: e.subs, Jobs: rc, Logger: logger, Now: e.clock.Now, Policy: policy})
	e.subs.SetTeller(e.svc)
	e.subs.AddWorkers(workers)
	e.subs.Register(e.reg)
	e.svc.Register(e.reg)
	e.echo.HTTPErrorHandler = httpserver.ErrorHandler(slog.New(slog.DiscardHandler))
	e.subs.MountAPI(e.echo.Group("/v1"))
	e.svc.MountAPI(e.echo.Group("/v1"))
	r.env, r.rc = e, rc

	events, stopEvents := rc.Subscribe(river.EventKindJobCompleted, river.EventKindJobFailed, river.EventKindJobCancelled, river.EventKindJobSnoozed)
	r.events = events
	ctx, cancel := context.WithCancel(context.Background())
	if err := rc.Start(ctx); err != nil {
		t.Fatalf("start river: %v", err)
	}
	t.Cleanup(func() {
		stopCtx, stop := context.WithTimeout(context.Background(), 10*time.Second)
		defer stop()
		_ = rc.Stop(stopCtx)
		stopEvents()
		cancel()
	})
	return r
}

// off is t as an offset from base, for the event builders.
func off(t time.Time) int64 { return t.Unix() - base }

// setStripe makes Stripe answer s, with latestInvoice (nil: none) expanded when asked to.
func (r *rereadEnv) setStripe(s subObj, latestInvoice map[string]any) {
	var m map[string]any
	if err := json.Unmarshal(s.JSON(), &m); err != nil {
		panic(err)
	}
	m["latest_invoice"] = nil
	if latestInvoice != nil {
		m["latest_invoice"] = latestInvoice
	}
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stripe[s.ID] = b
}

func (r *rereadEnv) serveSubscription(req stripeemu.Request) stripeemu.Answer {
	id := strings.TrimPrefix(req.Path, "/v1/subscriptions/")
	r.mu.Lock()
	defer r.mu.Unlock()
	obj, ok := r.stripe[id]
	if req.Method != http.MethodGet || !ok {
		return stripeemu.Answer{Status: http.StatusNotFound, Body: map[string]any{"error": map[string]any{
			"type": "invalid_request_error", "code": "resource_missing", "message": "No such subscription: " + id}}}
	}
	// Stripe expands latest_invoice only when asked.
	if req.Query.Get("expand[0]") != "latest_invoice" {
		var m map[string]any
		_ = json.Unmarshal(obj, &m)
		if inv, ok := m["latest_invoice"].(map[string]any); ok {
			m["latest_invoice"] = inv["id"]
		}
		return stripeemu.Answer{Status: http.StatusOK, Body: m}
	}
	return stripeemu.Answer{Status: http.StatusOK, Body: obj}
}

// runNow makes a scheduled job run now: the moment it was scheduled for has come.
func (r *rereadEnv) runNow(t *testing.T, id int64) {
	t.Helper()
	if _, err := r.rc.JobRetry(context.Background(), id); err != nil {
		t.Fatalf("run job %d: %v", id, err)
	}
}

// waitJob waits until job id is done in one of the given final states and returns that state.
// The timeout only bounds a failing test.
func (r *rereadEnv) waitJob(t *testing.T, id int64, final ...rivertype.JobState) rivertype.JobState {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case ev := <-r.events:
			if ev.Job.ID != id {
				continue
			}
			for _, s := range final {
				if ev.Job.State == s {
					return s
				}
			}
		case <-timeout:
			t.Fatalf("job %d did not reach %v", id, final)
		}
	}
}

// onlyJob returns the one re-read job of a subscription.
func (r *rereadEnv) onlyJob(t *testing.T, subscriptionID string) billingtest.RereadJob {
	t.Helper()
	jobs := r.rereadJobs(t, subscriptionID)
	if len(jobs) != 1 {
		t.Fatalf("re-read jobs of %s: %+v, want one", subscriptionID, jobs)
	}
	return jobs[0]
}

func (r *rereadEnv) entitlement(t *testing.T, userID string) Entitlement {
	t.Helper()
	var ent Entitlement
	if code, body := r.get(t, "/v1/customers/"+userID+"/entitlement", &ent); code != http.StatusOK {
		t.Fatalf("entitlement of %s: %d %s", userID, code, body)
	}
	return ent
}

// logRecorder keeps the records logged at warning level or above.
type logRecorder struct {
	mu    sync.Mutex
	warns []string
}

func (l *logRecorder) Enabled(_ context.Context, lv slog.Level) bool { return lv >= slog.LevelWarn }
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler            { return l }
func (l *logRecorder) WithGroup(string) slog.Handler                 { return l }
func (l *logRecorder) Handle(_ context.Context, rec slog.Record) error {
	var b strings.Builder
	b.WriteString(rec.Message)
	rec.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s=%v", a.Key, a.Value); return true })
	l.mu.Lock()
	defer l.mu.Unlock()
	l.warns = append(l.warns, b.String())
	return nil
}

func (l *logRecorder) warnings(containing string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, w := range l.warns {
		if strings.Contains(w, containing) {
			out = append(out, w)
		}
	}
	return out
}

// A subscription whose period ends within the hour, seen by the service in the usual way.
func (r *rereadEnv) activeSubscription(t *testing.T, id, user string) (subObj, time.Time) {
	t.Helper()
	r.link(t, user, "cus_"+id, user+"@example.com")
	end := r.now.Add(time.Hour)
	s := subObj{ID: id, Customer: "cus_" + id, Status: billing.StatusActive, Price: "price_m",
		PeriodStart: off(end.AddDate(0, -1, 0)), PeriodEnd: off(end)}
	r.mustHandle(t, created("evt_"+id+"_1", off(r.now.Add(-time.Minute)), s))
	return s, end
}

// ---- the re-read when the renewal is not heard of -------------------------------------------

// The renewal event is lost: at period end + grace the job reads the subscription from Stripe
// (pinned version, latest invoice expanded), which has renewed it; access continues with the new
// period, and the new period has its own job.
func TestRereadRenewedAtStripeStaysEntitled(t *testing.T) {
	t.Parallel()
	r := newRereadEnv(t, true)
	s, end := r.activeSubscription(t, "sub_ren", "u_ren")
	job := r.onlyJob(t, "sub_ren")
	if !job.ScheduledAt.Equal(end.Add(grace/2)) || job.State != string(rivertype.JobStateScheduled) {
		t.Fatalf("job %+v, want scheduled at %s", job, end.Add(grace/2))
	}

	renewed := s
	renewed.PeriodStart, renewed.PeriodEnd = off(end), off(end.AddDate(0, 1, 0))
	r.setStripe(renewed, map[string]any{"id": "in_ren", "object": "invoice", "customer": s.Customer,
		"subscription": s.ID, "status": "paid", "attempt_count": 1, "amount_due": 900, "currency": "usd"})

	// The grace has run out and no renewal has come: not entitled, and the answer says why.
	r.clock.Set(end.Add(grace))
	if ent := r.entitlement(t, "u_ren"); ent.Entitled || ptrTime(ent.UnconfirmedSince) != ptrTime(&end) {
		t.Fatalf("before the re-read: %+v", ent)
	}
	r.runNow(t, job.ID)
	if got := r.waitJob(t, job.ID, rivertype.JobStateCompleted, rivertype.JobStateDiscarded); got != rivertype.JobStateCompleted {
		t.Fatalf("job ended %s", got)
	}

	ent := r.entitlement(t, "u_ren")
	newEnd := end.AddDate(0, 1, 0)
	if !ent.Entitled || ent.Status != billing.StatusActive || ptrTime(ent.CurrentPeriodEnd) != ptrTime(&newEnd) || ent.UnconfirmedSince != nil {
		t.Errorf("after the re-read: %+v", ent)
	}
	reqs := r.proxy.Filter(http.MethodGet, "/v1/subscriptions/sub_ren")
	if len(reqs) != 1 || reqs[0].StripeVersion != stripeclient.APIVersion || reqs[0].Query.Get("expand[0]") != "latest_invoice" {
		t.Errorf("requests to Stripe: %+v", reqs)
	}
	if got := ptrStr(r.sub(t, "sub_ren").SubEventID); got != "reread:sub_ren" {
		t.Errorf("applied as %s, want the re-read's snapshot", got)
	}
	jobs := r.rereadJobs(t, "sub_ren")
	if len(jobs) != 2 || jobs[1].Due != newEnd.Unix() || !jobs[1].ScheduledAt.Equal(newEnd.Add(grace/2)) {
		t.Errorf("the new period's job: %+v", jobs)
	}
	if w := r.logs.warnings("cannot be confirmed"); len(w) != 0 {
		t.Errorf("warnings: %q", w)
	}
}

// Stripe says the subscription was canceled (its deletion event was lost too): access ends, as a
// cancellation and not as an unconfirmed renewal.
func TestRereadCanceledAtStripeLosesAccess(t *testing.T) {
	t.Parallel()
	r := newRereadEnv(t, true)
	s, end := r.activeSubscription(t, "sub_can", "u_can")
	job := r.onlyJob(t, "sub_can")
	canceled := s.With(billing.StatusCanceled)
	canceled.CanceledAt, canceled.EndedAt = off(end), off(end)
	r.setStripe(canceled, nil)

	// Still within the grace: entitled.
	r.clock.Set(end.Add(grace - time.Second))
	if ent := r.entitlement(t, "u_can"); !ent.Entitled {
		t.Fatalf("within the grace: %+v", ent)
	}
	r.clock.Set(end.Add(grace))
	r.runNow(t, job.ID)
	r.waitJob(t, job.ID, rivertype.JobStateCompleted)

	ent := r.entitlement(t, "u_can")
	if ent.Entitled || ent.Status != billing.StatusCanceled || ent.UnconfirmedSince != nil {
		t.Errorf("after the re-read: %+v", ent)
	}
	if st := r.sub(t, "sub_can"); st.EndedAt == nil || !st.EndedAt.Equal(end) {
		t.Errorf("ended_at %s, want %s", ptrTime(st.EndedAt), end)
	}
}

// Stripe cannot be reached: the job tries its attempts and gives up with a warning; the
// subscription is not entitled past the grace and the answer says since when it is unconfirmed.
// Once Stripe answers again, a later re-read restores access.
func TestRereadStripeUnreachable(t *testing.T) {
	t.Parallel()
	r := newRereadEnv(t, false)
	s, end := r.activeSubscription(t, "sub_down", "u_down")
	job := r.onlyJob(t, "sub_down")
	r.proxy.InjectFault(http.MethodGet, "/v1/subscriptions/sub_down", stripeemu.FaultDrop, 3)

	r.clock.Set(end.Add(grace))
	r.runNow(t, job.ID)
	if got := r.waitJob(t, job.ID, rivertype.JobStateDiscarded, rivertype.JobStateCompleted); got != rivertype.JobStateDiscarded {
		t.Fatalf("job ended %s, want discarded after its attempts", got)
	}
	if n := len(r.proxy.Filter(http.MethodGet, "/v1/subscriptions/sub_down")); n != 3 {
		t.Errorf("%d requests to Stripe, want one per attempt (3)", n)
	}
	ent := r.entitlement(t, "u_down")
	if ent.Entitled || ent.Status != billing.StatusActive || ptrTime(ent.UnconfirmedSince) != ptrTime(&end) {
		t.Errorf("after the failed re-read: %+v", ent)
	}
	if w := r.logs.warnings("subscription cannot be confirmed: Stripe could not be read"); len(w) != 1 || !strings.Contains(w[0], "sub_down") {
		t.Errorf("warnings: %q, want one naming sub_down", w)
	}

	// Stripe is back and has renewed it; the job is run again (by an admin, or a later event).
	renewed := s
	renewed.PeriodStart, renewed.PeriodEnd = off(end), off(end.AddDate(0, 1, 0))
	r.setStripe(renewed, nil)
	r.runNow(t, job.ID)
	r.waitJob(t, job.ID, rivertype.JobStateCompleted)
	if ent := r.entitlement(t, "u_down"); !ent.Entitled || ent.UnconfirmedSince != nil {
		t.Errorf("after Stripe came back: %+v", ent)
	}
}

// Stripe answers, but still shows the period that ended: nothing confirms the renewal, so the
// subscription stays unentitled and the job says so in the log.
func TestRereadStripeStillShowsTheOldPeriod(t *testing.T) {
	t.Parallel()
	r := newRereadEnv(t, true)
	s, end := r.activeSubscription(t, "sub_old", "u_old")
	job := r.onlyJob(t, "sub_old")
	r.setStripe(s, nil)
	r.clock.Set(end.Add(grace + time.Minute))
	r.runNow(t, job.ID)
	r.waitJob(t, job.ID, rivertype.JobStateCompleted)
	if ent := r.entitlement(t, "u_old"); ent.Entitled || ptrTime(ent.UnconfirmedSince) != ptrTime(&end) {
		t.Errorf("after the re-read: %+v", ent)
	}
	if w := r.logs.warnings("Stripe still shows a renewal past its grace"); len(w) != 1 {
		t.Errorf("warnings: %q", r.logs.warnings(""))
	}
	// The snapshot queued no second job: the one for this renewal already ran.
	if jobs := r.rereadJobs(t, "sub_old"); len(jobs) != 1 {
		t.Errorf("jobs: %+v", jobs)
	}
}

// The renewal event arrives in time: the old period's job finds nothing to do and asks Stripe
// nothing.
func TestRereadAfterTheRenewalEventAsksStripeNothing(t *testing.T) {
	t.Parallel()
	r := newRereadEnv(t, true)
	s, end := r.activeSubscription(t, "sub_ok", "u_ok")
	job := r.onlyJob(t, "sub_ok")
	renewed := s
	renewed.PeriodStart, renewed.PeriodEnd = off(end), off(end.AddDate(0, 1, 0))
	r.mustHandle(t, updated("evt_sub_ok_2", off(end), renewed))

	r.clock.Set(end.Add(grace))
	r.runNow(t, job.ID)
	r.waitJob(t, job.ID, rivertype.JobStateCompleted)
	if n := len(r.proxy.Filter(http.MethodGet, "/v1/subscriptions/sub_ok")); n != 0 {
		t.Errorf("%d requests to Stripe, want none", n)
	}
	if ent := r.entitlement(t, "u_ok"); !ent.Entitled || ent.SubscriptionID == nil || ptrTime(ent.CurrentPeriodEnd) != ptrTime(tp(end.AddDate(0, 1, 0))) {
		t.Errorf("entitlement: %+v", ent)
	}
}

// ---- the re-read of a tie -------------------------------------------------------------------

// Two events of one subscription created in the same second with different statuses: the rank
// guesses (past_due wins), an immediate re-read asks Stripe, and Stripe's object settles it.
// Events of one second that agree on the status queue nothing.
func TestSameSecondTieIsSettledByStripe(t *testing.T) {
	t.Parallel()
	r := newRereadEnv(t, true)
	s, _ := r.activeSubscription(t, "sub_tie", "u_tie")
	renewal := r.rereadJobs(t, "sub_tie")

	second := r.now.Add(-30 * time.Second)
	// Same status in one second: no doubt, no job.
	r.mustHandle(t, updated("evt_tie_a", off(second.Add(-10*time.Second)), s), updated("evt_tie_b", off(second.Add(-10*time.Second)), s))
	if jobs := r.rereadJobs(t, "sub_tie"); len(jobs) != len(renewal) {
		t.Fatalf("events agreeing within a second queued a re-read: %+v", jobs)
	}

	r.setStripe(s, nil) // Stripe: it is active (the payment went through after the failure).
	// Hold the re-read at Stripe's door, to see a third event of that second arrive meanwhile.
	arrived, release := r.proxy.Gate(http.MethodGet, "/v1/subscriptions/sub_tie")
	defer release()
	r.mustHandle(t, updated("evt_tie_1", off(second), s), updated("evt_tie_2", off(second), s.With(billing.StatusPastDue)))
	if got := r.sub(t, "sub_tie").Status; got != billing.StatusPastDue {
		t.Fatalf("the rank's guess: %s, want past_due", got)
	}
	tieJobs := func() []billingtest.RereadJob {
		var out []billingtest.RereadJob
		for _, j := range r.rereadJobs(t, "sub_tie") {
			if j.Tie != 0 {
				out = append(out, j)
			}
		}
		return out
	}
	tie := tieJobs()
	if len(tie) != 1 || tie[0].Tie != second.Unix() {
		t.Fatalf("tie re-reads queued: %+v, want one for %d", tie, second.Unix())
	}
	// It runs at once (its time is past); while it waits for Stripe, a third status of that
	// second queues no second job.
	select {
	case <-arrived:
	case <-time.After(30 * time.Second):
		t.Fatal("the tie's re-read did not reach Stripe")
	}
	r.mustHandle(t, updated("evt_tie_3", off(second), s.With(billing.StatusUnpaid)))
	if got := r.sub(t, "sub_tie").Status; got != billing.StatusUnpaid {
		t.Fatalf("the rank's second guess: %s, want unpaid", got)
	}
	release()
	r.waitJob(t, tie[0].ID, rivertype.JobStateCompleted)
	st := r.sub(t, "sub_tie")
	if st.Status != billing.StatusActive || ptrStr(st.SubEventID) != "reread:sub_tie" {
		t.Errorf("after the tie's re-read: %s by %s, want active by the re-read", st.Status, ptrStr(st.SubEventID))
	}
	if n := len(tieJobs()); n != 1 {
		t.Errorf("%d tie jobs for one second, want 1", n)
	}
}

// Halfway through the grace Stripe has not renewed yet: the user keeps access, and the job reads
// once more at the end of the grace, where Stripe's renewal is found and applied.
func TestRereadHalfwayThenAtTheEndOfTheGrace(t *testing.T) {
	t.Parallel()
	r := newRereadEnv(t, true)
	s, end := r.activeSubscription(t, "sub_late", "u_late")
	job := r.onlyJob(t, "sub_late")
	r.setStripe(s, nil)
	r.clock.Set(end.Add(grace/2 + time.Minute))
	r.runNow(t, job.ID)
	r.waitJob(t, job.ID, rivertype.JobStateScheduled)
	if ent := r.entitlement(t, "u_late"); !ent.Entitled || ent.UnconfirmedSince != nil {
		t.Errorf("halfway through the grace, not renewed at Stripe yet: %+v", ent)
	}
	renewed := s
	renewed.PeriodStart, renewed.PeriodEnd = off(end), off(end.AddDate(0, 1, 0))
	r.setStripe(renewed, nil)
	r.clock.Set(end.Add(grace + time.Minute))
	r.runNow(t, job.ID)
	r.waitJob(t, job.ID, rivertype.JobStateCompleted)
	if n := len(r.proxy.Filter(http.MethodGet, "/v1/subscriptions/sub_late")); n != 2 {
		t.Errorf("%d reads of Stripe, want 2", n)
	}
	if ent := r.entitlement(t, "u_late"); !ent.Entitled || ptrTime(ent.CurrentPeriodEnd) != ptrTime(tp(end.AddDate(0, 1, 0))) {
		t.Errorf("after the renewal was read: %+v", ent)
	}
}
