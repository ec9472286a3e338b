package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/stripe/stripe-go/v79"

	"billing/internal/httpserver"
	"billing/internal/stripeclient"
	"billing/internal/stripeemu"
)

// addSubscriptions puts n active subscriptions of one customer into the account.
func (e *env) addSubscriptions(n int) []string {
	start, end := period()
	cus := e.acct.AddCustomer(stripeemu.CustomerSpec{})
	ids := make([]string, n)
	for i := range ids {
		ids[i] = e.acct.PutSubscription(stripeemu.SubscriptionSpec{Customer: cus, Status: "active", PriceID: "price_a",
			CurrentPeriodStart: start, CurrentPeriodEnd: end, LatestInvoice: &stripeemu.InvoiceSpec{Status: "paid", AttemptCount: 1}})
	}
	return ids
}

// Two reconcilers on one database (two replicas, or a replica and the command): while one runs,
// the other starts nothing, whether asked by Run, Start (the periodic job) or the admin route.
// A run left unfinished by a dead process is marked interrupted by the next one.
func TestTwoReplicasRunOneAtATime(t *testing.T) {
	e := newEnv(t)
	e.addSubscriptions(3)
	other := e.reconciler()
	if err := e.db.Exec(`INSERT INTO reconcile_runs (run_id, livemode, dry_run, trigger, started_at) VALUES ('rr_dead', false, false, 'periodic', now() - interval '1 hour')`).Error; err != nil {
		t.Fatal(err)
	}

	arrived, release := e.proxy.Gate(http.MethodGet, "/v1/subscriptions")
	defer release()
	runID, err := e.rec.Start(RunOptions{Trigger: TriggerPeriodic})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, arrived, "the first page request")

	if _, err := other.Run(context.Background(), RunOptions{}); !errors.Is(err, ErrRunning) {
		t.Fatalf("second replica's Run = %v, want ErrRunning", err)
	}
	if _, err := other.Start(RunOptions{Trigger: TriggerPeriodic}); !errors.Is(err, ErrRunning) {
		t.Fatalf("second replica's Start = %v, want ErrRunning", err)
	}
	if _, err := e.rec.Start(RunOptions{}); !errors.Is(err, ErrRunning) {
		t.Fatalf("same replica's second Start = %v, want ErrRunning", err)
	}
	rec := e.admin(other, http.MethodPost, "/admin/reconcile")
	if rec.Code != http.StatusConflict || !strings.Contains(rec.Body.String(), `"reconcile_running"`) {
		t.Fatalf("POST /admin/reconcile during a run = %d %s, want 409 reconcile_running", rec.Code, rec.Body)
	}
	if n := e.count(`SELECT count(*) FROM reconcile_runs WHERE finished_at IS NULL`); n != 1 {
		t.Fatalf("%d unfinished runs during the run, want 1 (the dead one was closed)", n)
	}
	release()
	e.waitFinished(runID)

	if n := e.count(`SELECT count(*) FROM reconcile_runs`); n != 2 {
		t.Errorf("%d runs recorded, want the dead one and one run", n)
	}
	var dead RunView
	if err := e.db.Raw(`SELECT * FROM reconcile_runs WHERE run_id = 'rr_dead'`).Scan(&dead).Error; err != nil {
		t.Fatal(err)
	}
	if dead.FinishedAt == nil || dead.Error == nil || !strings.Contains(*dead.Error, "interrupted") {
		t.Errorf("dead run = %+v, want finished as interrupted", dead)
	}
	// Once it is over, the other replica may run.
	sum, err := other.Run(context.Background(), RunOptions{})
	if err != nil || sum.Objects != 3 {
		t.Fatalf("run after the first = %+v, %v", sum, err)
	}
}

// waitFinished polls until the run is recorded as finished.
func (e *env) waitFinished(runID string) RunView {
	e.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		run, err := e.rec.RunByID(context.Background(), runID)
		if err != nil {
			e.t.Fatal(err)
		}
		if run != nil && run.FinishedAt != nil {
			// The lock goes after the record: wait for the run's goroutine to let go of it.
			e.rec.wg.Wait()
			return *run
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("run %s not finished in time: %+v", runID, run)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A storm of 429s: the run backs off, goes on, and lists every page; where Stripe says how long
// to wait (Retry-After), that is the wait.
func TestRateLimitStormRunCompletes(t *testing.T) {
	e := newEnv(t)
	e.addSubscriptions(250)
	e.acct.Throttle(4, 0, false)
	sum := e.run(false)
	wantSummary(t, sum, 250, 250, 250, 0, 0, ExitClean)
	if got := e.recordedSleeps(); len(got) != 4 || got[0] != time.Millisecond || got[1] != 2*time.Millisecond ||
		got[2] != 4*time.Millisecond || got[3] != 8*time.Millisecond {
		t.Errorf("backoff = %v, want 1ms 2ms 4ms 8ms (exponential, capped)", got)
	}

	// Throttled again in the middle of the listing, with Retry-After.
	e.mu.Lock()
	e.sleeps = nil
	e.mu.Unlock()
	computed, release := e.acct.HoldNextPage()
	done := make(chan Summary, 1)
	go func() { done <- e.run(false) }()
	waitFor(t, computed, "the first page")
	e.acct.Throttle(3, 7*time.Second, false)
	release()
	sum = <-done
	wantSummary(t, sum, 250, 0, 0, 0, 0, ExitClean)
	if got := e.recordedSleeps(); len(got) != 3 || got[0] != 7*time.Second || got[2] != 7*time.Second {
		t.Errorf("waits = %v, want Retry-After's 7s three times", got)
	}
	if st := e.acct.Stats(); st.Pages != 6 {
		t.Errorf("%d pages answered over two runs, want 6", st.Pages)
	}
}

// When Stripe keeps refusing, the run gives up after a bounded number of requests (its own
// attempts times stripe-go's, which retries a 429 itself when Stripe-Should-Retry says so),
// records why, and its summary says it stopped.
func TestThrottledForeverStopsAfterBoundedRequests(t *testing.T) {
	limits := testLimits
	limits.MaxAttempts = 2
	e := newEnv(t, withLimits(limits))
	e.addSubscriptions(2)
	e.acct.Throttle(1000, 0, true)

	sum := e.run(false)
	if sum.Err == nil || sum.ExitCode() != ExitStopped || sum.Errors != 1 {
		t.Fatalf("summary %q err %v exit %d, want a stopped run with one error", sum.Line(), sum.Err, sum.ExitCode())
	}
	want := limits.MaxRequestsPerCall()
	if want != 2*(stripeclient.Retries+1) {
		t.Fatalf("MaxRequestsPerCall = %d", want)
	}
	if got := e.acct.Stats().Requests; got != want {
		t.Errorf("%d requests before giving up, want %d", got, want)
	}
	run := e.waitFinished(sum.RunID)
	if run.Error == nil || !strings.Contains(*run.Error, "gave up after 2 attempts") || run.Errors != 1 {
		t.Errorf("recorded run = %+v", run)
	}
	if !strings.Contains(sum.Err.Error(), "429") {
		t.Errorf("error %q does not say what Stripe answered", sum.Err)
	}
}

// A Stripe error that repeating cannot fix (a revoked key) stops the run at once.
func TestUnauthorizedStopsAtOnce(t *testing.T) {
	e := newEnv(t)
	e.addSubscriptions(1)
	e.proxy.Respond(http.MethodGet, "/v1/subscriptions", 1, func(stripeemu.Request) stripeemu.Answer {
		return stripeemu.Answer{Status: http.StatusUnauthorized, Body: map[string]any{"error": map[string]any{
			"type": "invalid_request_error", "message": "Invalid API Key provided"}}}
	})
	sum := e.run(false)
	if sum.ExitCode() != ExitStopped || len(e.proxy.Filter(http.MethodGet, "/v1/subscriptions")) != 1 {
		t.Fatalf("summary %q err %v; requests %d, want one request and a stopped run", sum.Line(), sum.Err,
			len(e.proxy.Filter(http.MethodGet, "/v1/subscriptions")))
	}
}

func (e *env) admin(s *Service, method, target string) *httptest.ResponseRecorder {
	e.t.Helper()
	ec := echo.New()
	ec.HTTPErrorHandler = httpserver.ErrorHandler(slog.New(slog.DiscardHandler))
	s.MountAdmin(ec.Group("/admin"))
	rec := httptest.NewRecorder()
	ec.ServeHTTP(rec, httptest.NewRequest(method, target, nil))
	return rec
}

// The admin routes: start a run (202 with its id), list runs newest first, list a run's drift.
func TestAdminRoutes(t *testing.T) {
	e := newEnv(t)
	e.addSubscriptions(2)
	first := e.run(true)

	rec := e.admin(e.rec, http.MethodPost, "/admin/reconcile")
	if rec.Code != http.StatusAccepted {
		t.Fatalf("POST /admin/reconcile = %d %s", rec.Code, rec.Body)
	}
	var started struct {
		RunID string `json:"run_id"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &started); err != nil || started.RunID == "" {
		t.Fatalf("POST body %s: %v", rec.Body, err)
	}
	e.waitFinished(started.RunID)

	rec = e.admin(e.rec, http.MethodGet, "/admin/reconcile/runs")
	var runs struct {
		Runs []map[string]any `json:"runs"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &runs); err != nil || rec.Code != http.StatusOK || len(runs.Runs) != 2 {
		t.Fatalf("GET runs = %d %s", rec.Code, rec.Body)
	}
	if runs.Runs[0]["run_id"] != started.RunID || runs.Runs[1]["run_id"] != first.RunID {
		t.Errorf("runs not newest first: %v", runs.Runs)
	}
	for _, k := range []string{"run_id", "started_at", "finished_at", "objects", "drifted", "repaired", "missing_at_stripe", "errors", "dry_run"} {
		if _, ok := runs.Runs[0][k]; !ok {
			t.Errorf("run lacks %q: %v", k, runs.Runs[0])
		}
	}
	if runs.Runs[0]["trigger"] != TriggerAdmin || runs.Runs[0]["repaired"] != float64(2) || runs.Runs[1]["dry_run"] != true {
		t.Errorf("runs = %v", runs.Runs)
	}

	rec = e.admin(e.rec, http.MethodGet, "/admin/reconcile/drift?run_id="+first.RunID)
	var drift struct {
		Drift []map[string]any `json:"drift"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &drift); err != nil || rec.Code != http.StatusOK || len(drift.Drift) != 2 {
		t.Fatalf("GET drift = %d %s", rec.Code, rec.Body)
	}
	for _, k := range []string{"run_id", "subscription_id", "field", "local", "stripe", "repaired"} {
		if _, ok := drift.Drift[0][k]; !ok {
			t.Errorf("drift row lacks %q: %v", k, drift.Drift[0])
		}
	}
	if drift.Drift[0]["field"] != FieldMissingLocally || drift.Drift[0]["repaired"] != false {
		t.Errorf("drift = %v", drift.Drift)
	}
	// Without run_id: the latest run, which repaired what the dry run found.
	rec = e.admin(e.rec, http.MethodGet, "/admin/reconcile/drift")
	if rec.Code != http.StatusOK || strings.Count(rec.Body.String(), `"run_id":"`+started.RunID+`"`) != 3 || strings.Count(rec.Body.String(), `"repaired":true`) != 2 {
		t.Errorf("GET drift of the latest run = %d %s", rec.Code, rec.Body)
	}
	for target, code := range map[string]int{
		"/admin/reconcile/drift?run_id=rr_unknown": http.StatusNotFound,
		"/admin/reconcile/drift?run_id=../x":       http.StatusBadRequest,
		"/admin/reconcile/runs?limit=0":            http.StatusBadRequest,
	} {
		if rec := e.admin(e.rec, http.MethodGet, target); rec.Code != code {
			t.Errorf("GET %s = %d %s, want %d", target, rec.Code, rec.Body, code)
		}
	}
}

// The periodic job starts a run only when none went through within the interval (the first one
// an interval after the first check), and sets the last-success gauge from the database.
func TestPeriodicTickStartsARunWhenDue(t *testing.T) {
	e := newEnv(t)
	e.addSubscriptions(1)
	e.rec.interval = time.Hour

	if runID, err := e.rec.Tick(context.Background()); err != nil || runID != "" {
		t.Fatalf("first tick = %q, %v; want none (the first run comes an interval after the first check)", runID, err)
	}
	other := e.reconciler()
	other.interval = time.Hour
	if runID, err := other.Tick(context.Background()); err != nil || runID != "" {
		t.Fatalf("another replica's tick = %q, %v; want none", runID, err)
	}
	if err := e.db.Exec(`UPDATE reconcile_schedule SET first_check_at = first_check_at - interval '61 minutes'`).Error; err != nil {
		t.Fatal(err)
	}
	runID, err := e.rec.Tick(context.Background())
	if err != nil || runID == "" {
		t.Fatalf("tick an interval after the first check = %q, %v; want a run", runID, err)
	}
	run := e.waitFinished(runID)
	if run.Trigger != TriggerPeriodic || run.Error != nil {
		t.Fatalf("periodic run = %+v", run)
	}
	e.rec.metrics.lastSuccess.Set(0)
	if runID, err := e.rec.Tick(context.Background()); err != nil || runID != "" {
		t.Fatalf("tick right after a run = %q, %v; want none", runID, err)
	}
	if got := metricValue(t, e.rec.metrics.lastSuccess); got != float64(run.FinishedAt.Unix()) {
		t.Errorf("last success gauge = %v, want %d", got, run.FinishedAt.Unix())
	}
	// A dry run does not count as keeping the state true.
	if err := e.db.Exec(`UPDATE reconcile_runs SET started_at = started_at - interval '2 hours'`).Error; err != nil {
		t.Fatal(err)
	}
	e.run(true)
	runID, err = e.rec.Tick(context.Background())
	if err != nil || runID == "" {
		t.Fatalf("tick after the interval = %q, %v; want a run", runID, err)
	}
	e.waitFinished(runID)

	e.rec.interval = 0
	if jobs := e.rec.PeriodicJobs(); len(jobs) != 0 {
		t.Errorf("interval 0: %d periodic jobs, want none", len(jobs))
	}
}

// Stop ends a run that Start started; it is recorded as interrupted.
func TestStopInterruptsARun(t *testing.T) {
	e := newEnv(t)
	e.addSubscriptions(1)
	arrived, release := e.proxy.Gate(http.MethodGet, "/v1/subscriptions")
	runID, err := e.rec.Start(RunOptions{Trigger: TriggerAdmin})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, arrived, "the page request")
	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		stopped <- e.rec.Stop(ctx)
	}()
	// The request is held at the double; the run's context is canceled meanwhile.
	deadline := time.Now().Add(30 * time.Second)
	for e.rec.baseCtx.Err() == nil && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	release()
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	run := e.waitFinished(runID)
	if run.Error == nil || !strings.Contains(*run.Error, "interrupted") {
		t.Fatalf("stopped run = %+v, want interrupted", run)
	}
	if _, err := e.rec.Start(RunOptions{}); err == nil {
		t.Error("Start after Stop started a run")
	}
}

// Pages are repaired several at once, but a page that shares a customer with one in flight
// waits for it: a customer whose subscriptions span two pages is linked, and its link reported,
// once, as one page at a time would. The counts add up over the pages.
func TestPagesInFlightShareNoCustomer(t *testing.T) {
	e := newEnv(t)
	start, end := period()
	add := func(customer string, n int) {
		for range n {
			e.acct.PutSubscription(stripeemu.SubscriptionSpec{Customer: customer, Status: "active", PriceID: "price_a",
				CurrentPeriodStart: start, CurrentPeriodEnd: end})
		}
	}
	// Newest first: page 1 holds b's 50 and a's newest 50, page 2 a's other 100, page 3 c's 30.
	cc := e.acct.AddCustomer(stripeemu.CustomerSpec{Metadata: map[string]string{"user_id": "uc"}})
	add(cc, 30)
	ca := e.acct.AddCustomer(stripeemu.CustomerSpec{Metadata: map[string]string{"user_id": "ua"}})
	add(ca, 150)
	cb := e.acct.AddCustomer(stripeemu.CustomerSpec{Metadata: map[string]string{"user_id": "ub"}})
	add(cb, 50)

	sum := e.run(false)
	wantSummary(t, sum, 230, 230, 230, 0, 0, ExitClean)
	links := map[string]int{}
	for _, r := range e.drift(sum.RunID) {
		if r.Field == FieldCustomerLink {
			links[r.Stripe]++
			if !r.Repaired {
				t.Errorf("link %s not repaired: %v", r.Stripe, r.Reason)
			}
		}
	}
	if len(links) != 3 {
		t.Errorf("links reported: %v, want one for each of ua, ub, uc", links)
	}
	for link, n := range links {
		if n != 1 {
			t.Errorf("link %s reported %d times, want once", link, n)
		}
	}
	for _, u := range []string{"ua", "ub", "uc"} {
		if !e.entitled(u) {
			t.Errorf("%s not entitled after the backfill", u)
		}
	}
	wantSummary(t, e.run(false), 230, 0, 0, 0, 0, ExitClean)
}

func TestPageWorkSharesCustomersAndUsers(t *testing.T) {
	page := func(customers ...*stripe.Customer) *pageWork {
		var subs []remote
		for _, c := range customers {
			subs = append(subs, remote{sub: &stripe.Subscription{Customer: c}})
		}
		return newPageWork(1, subs)
	}
	a := &stripe.Customer{ID: "cus_a", Metadata: map[string]string{"user_id": "u1"}}
	b := &stripe.Customer{ID: "cus_b", Metadata: map[string]string{"user_id": "u2"}}
	bSameUser := &stripe.Customer{ID: "cus_b2", Metadata: map[string]string{"user_id": "u1"}}
	c := &stripe.Customer{ID: "cus_c"}
	for _, tc := range []struct {
		name string
		x, y *pageWork
		want bool
	}{
		{"same customer", page(a, c), page(a), true},
		{"same user, another customer", page(a), page(bSameUser), true},
		{"nothing in common", page(a, c), page(b), false},
		{"no customer", page(nil), page(a), false},
	} {
		if got := tc.x.shares(tc.y); got != tc.want {
			t.Errorf("%s: shares = %v, want %v", tc.name, got, tc.want)
		}
	}
}
