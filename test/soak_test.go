package test

// The soak (make soak; not part of make test): the storm at the scale of a real account with
// everything at once — ≥ 10,000 events over ≥ 2,000 subscriptions of the lifecycle mix, delivered
// by concurrent senders to 3 replicas, ≥ 50 SIGKILLs spread over them, PostgreSQL restarted with
// -m immediate in the middle, 10 % of the subscription and invoice events dropped (never
// delivered), the app's own traffic (customers, charges, refunds, Checkout) calling a Stripe that
// fails at random on every outbound path, then one `billing reconcile` through the same faults,
// then the model check and `billing verify`. SOAK_SCALE scales the sizes (SOAK_SCALE=0.05 for a
// smoke run); RELIABILITY_SEED replays a run. The long run (make soak-long) is soak_long_test.go.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"billing/internal/stripeemu"
	"billing/internal/testenv"
)

// soakOutbound are the Stripe paths the soak's faults hit: every outbound path of the service.
var soakOutbound = []string{"/v1/customers", "/v1/payment_intents", "/v1/refunds", "/v1/checkout/sessions",
	"/v1/subscriptions", "/v1/invoices", "/v1/billing/meter_events", "/v1/entitlements"}

// soakRun is what a soak hook gets: the replicas' base URLs, the Stripe double and the database.
type soakRun struct {
	Targets []string
	Proxy   *stripeemu.Proxy
	Account *stripeemu.Account
	// URL is the database's.
	URL   string
	Scale float64
	Rng   *rand.Rand
}

// soakHook is a part of the mix that another package's feature adds (usage records and their
// meter events, feature entitlements): Traffic runs during the storm, against the replicas, until
// ctx ends or it is done; Check runs after the reconcile and returns its problems (each a wrong
// state) and figures to print.
type soakHook struct {
	Name    string
	Traffic func(ctx context.Context, t *testing.T, r *soakRun)
	Check   func(t *testing.T, r *soakRun) (problems []string, figures string)
}

// soakHooks are registered by the files of those features (init funcs beside their tests).
var soakHooks []soakHook

func soakScale(t *testing.T) float64 {
	t.Helper()
	v := os.Getenv("SOAK_SCALE")
	if v == "" {
		return 1
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f <= 0 {
		t.Fatalf("SOAK_SCALE=%q: want a positive number", v)
	}
	return f
}

func TestSoak(t *testing.T) {
	if os.Getenv("BILLING_SOAK") == "" {
		t.Skip("the soak runs with make soak (BILLING_SOAK=1)")
	}
	scale := soakScale(t)
	seed := relSeed(t)
	rng := rand.New(rand.NewPCG(seed, 27))
	nSubs, nEvents := max(int(2000*scale), 40), max(int(10000*scale), 200)
	nKills, nOps := max(int(50*scale), 6), max(int(300*scale), 24)

	cluster, url, db := dedicatedCluster(t)
	proxy := stripeemu.New(t, testenv.StripeMockURL(t))
	acct := stripeemu.NewAccount(proxy, false)
	stripeemu.NewCheckoutSessions(proxy, false)
	env := relEnv(t, url)
	env["BILLING_STRIPE_API_URL"] = proxy.URL
	// Production's rescue delay, so that the recovery figure is the one production gets.
	delete(env, "BILLING_WORKER_RESCUE_AFTER")
	// The app is told of every change, and fails a first push now and then.
	appRecv, appURL := newAppReceiver(t, seed, 0.05)
	env["BILLING_APP_EVENTS_URL"], env["BILLING_APP_EVENTS_SECRETS"] = appURL, appSecret
	var replicas []*service
	var targets []string
	for i := range 3 {
		r := newService(t, fmt.Sprintf("replica-%d", i), env)
		replicas = append(replicas, r)
		targets = append(targets, r.url(""))
	}

	plan := genPlan(rng, "soak", nSubs, nEvents)
	linkUsers(t, db, plan, nSubs/3)
	// The dropped share: subscription and invoice events, whose loss `billing reconcile` repairs
	// from Stripe (a customer.updated lost stays lost: reconcile does not read customers' emails).
	dropped := map[string]bool{}
	for _, ev := range plan.Events {
		if !ev.isCustomer() && rng.Float64() < 0.10 {
			dropped[ev.ID] = true
		}
	}
	deliveries := slices.DeleteFunc(plan.deliveries(rng), func(ev *relEvent) bool { return dropped[ev.ID] })

	proxy.SetChaos(&stripeemu.Chaos{Prefixes: soakOutbound, Rate: 0.10, Seed: seed})
	run := &soakRun{Targets: targets, Proxy: proxy, Account: acct, URL: url, Scale: scale, Rng: rand.New(rand.NewPCG(seed, 28))}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	t0 := time.Now()
	s := newSenders(plan, targets)
	done := s.run(ctx, deliveries, stormSenders)
	app := &soakApp{t: t, targets: targets, client: &http.Client{Timeout: time.Minute}}
	var traffic sync.WaitGroup
	traffic.Go(func() { app.run(ctx, nOps, 4) })
	for _, h := range soakHooks {
		traffic.Go(func() { h.Traffic(ctx, t, run) })
	}

	// The kills, spread over the replicas at random shares of the delivery; PostgreSQL's
	// restart at the middle one.
	thresholds := make([]int64, nKills)
	for i := range thresholds {
		thresholds[i] = int64(len(deliveries) * (3 + rng.IntN(92)) / 100)
	}
	slices.Sort(thresholds)
	restartAt := len(thresholds) / 2
	var outage time.Duration
	for i, th := range thresholds {
		if !waitAcked(s, th, done) {
			break
		}
		if i == restartAt {
			outage = soakRestartPostgres(t, cluster, s)
		}
		time.Sleep(time.Duration(rng.IntN(40)) * time.Millisecond) // the stimulus: a random moment
		victim := replicas[rng.IntN(len(replicas))]
		victim.kill()
		victim.start()
	}
	select {
	case <-done:
	case <-time.After(60 * time.Minute):
		t.Fatalf("senders still running after an hour: %s", s.stats)
	}
	traffic.Wait()
	t.Logf("delivered %d deliveries of %d events (%d dropped) in %s", len(deliveries), len(plan.Events)-len(dropped), len(dropped),
		time.Since(t0).Round(time.Millisecond))
	waitDrained(t, db, 10*time.Minute)
	waitNoticesSent(t, db, 10*time.Minute)
	recovery := logRecovery(t, db, plan, s.stats)

	// Stripe's truth: every subscription as its newest event says, with the latest invoice the
	// model's hold calls for; then one reconcile, through the same faults.
	soakPutTruth(t, acct, plan)
	cmd := exec.Command(binary(t), "reconcile")
	cmd.Env = baseEnv(map[string]string{"BILLING_DATABASE_URL": url, "BILLING_STRIPE_API_URL": proxy.URL,
		"BILLING_STRIPE_SECRET_KEY": env["BILLING_STRIPE_SECRET_KEY"], "BILLING_LOG_LEVEL": "warn"})
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Errorf("billing reconcile: %v\nstdout: %s\nstderr: %s", err, out.String(), tail(errOut.String(), 3000))
		rows, qerr := db.Query(`SELECT subscription_id, field, local, stripe, coalesce(reason, '') FROM reconcile_drift WHERE NOT repaired AND livemode = false ORDER BY id LIMIT 20`)
		if qerr == nil {
			for rows.Next() {
				var sub, field, local, stripe, reason string
				if rows.Scan(&sub, &field, &local, &stripe, &reason) == nil {
					t.Logf("not repaired: %s %s local=%q stripe=%q: %s", sub, field, local, stripe, reason)
				}
			}
			rows.Close()
		}
	}
	reconciled := strings.TrimSpace(out.String())
	waitDrained(t, db, 5*time.Minute)

	f := verifyDropped(t, db, plan, s.stats, targets[len(targets)-1], dropped)
	f.Deliveries = len(deliveries)
	for _, r := range replicas {
		f.Kills += r.kills
	}
	oneEach := app.check(t, proxy)
	for _, h := range soakHooks {
		problems, figures := h.Check(t, run)
		for _, p := range problems {
			f.WrongStates++
			t.Errorf("%s: %s", h.Name, p)
		}
		t.Logf("%s: %s", h.Name, figures)
	}
	waitAppEventsPushed(t, db, 10*time.Minute)
	appProblems, appFigures := checkAppEvents(t, db, appRecv, f.Kills)
	for _, p := range appProblems {
		f.WrongStates++
		t.Errorf("app events: %s", p)
	}
	verified := runVerifyCommand(t, env)

	faults := proxy.Faulted()
	var rss []string
	for _, r := range replicas {
		rss = append(rss, fmt.Sprintf("%s=%dMiB", r.name, r.PeakRSS()/1024))
	}
	line := fmt.Sprintf("soak: events=%d dropped=%d deliveries=%d kills=%d postgres_outage=%s faults_injected=%d (429=%d 500=%d lost_after_applied=%d reset=%d) "+
		"lost=%d wrong_states=%d duplicate_notices=%d %s recovery_worst=%s peak_rss=[%s] elapsed=%s",
		len(plan.Events), len(dropped), f.Deliveries, f.Kills, outage.Round(time.Millisecond),
		faults[stripeemu.Fault429]+faults[stripeemu.Fault500]+faults[stripeemu.FaultDropAfter]+faults[stripeemu.FaultDrop],
		faults[stripeemu.Fault429], faults[stripeemu.Fault500], faults[stripeemu.FaultDropAfter], faults[stripeemu.FaultDrop],
		f.Lost, f.WrongStates, f.DuplicateNotices, oneEach, recovery.Round(time.Millisecond), strings.Join(rss, " "),
		time.Since(t0).Round(time.Second))
	t.Log(line)
	t.Logf("soak: %s", appFigures)
	t.Logf("soak: %s", reconciled)
	t.Logf("soak: %s", verified)
	t.Logf("soak: senders: %s", s.stats)
	fmt.Println(line)
	if f.Kills < nKills {
		t.Errorf("%d kills, want at least %d", f.Kills, nKills)
	}
	if len(plan.Events) < nEvents || len(plan.Subs) < nSubs {
		t.Errorf("plan of %d events over %d subscriptions, want at least %d over %d", len(plan.Events), len(plan.Subs), nEvents, nSubs)
	}
}

// soakRestartPostgres stops PostgreSQL with -m immediate while the senders deliver, waits until
// the endpoint has been seen answering 503 (and at least 3 s), and starts it again. It returns
// how long the database was away.
func soakRestartPostgres(t *testing.T, cluster interface {
	StopImmediate() error
	Restart(context.Context) error
}, s *senders) time.Duration {
	t.Helper()
	s.outage.Store(true)
	if err := cluster.StopImmediate(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if !waitUntil(30*time.Second, func() bool { return s.stats.outage503.Load() > 0 && time.Since(start) >= 3*time.Second }) {
		t.Logf("PostgreSQL down for 30 s without a 503 seen by the senders (they were waiting on replicas meanwhile)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := cluster.Restart(ctx); err != nil {
		t.Fatalf("restart PostgreSQL: %v", err)
	}
	s.outage.Store(false)
	return time.Since(start)
}

// soakPutTruth puts into the Stripe double what Stripe holds after the plan: each subscription as
// its newest subscription event's object, with the latest invoice the model's hold says (open and
// attempted while held, paid otherwise), and each customer (with metadata.user_id when linked).
func soakPutTruth(t *testing.T, acct *stripeemu.Account, plan *relPlan) {
	t.Helper()
	for _, s := range plan.Subs {
		md := map[string]string{}
		if s.User != "" {
			md["user_id"] = s.User
		}
		acct.AddCustomer(stripeemu.CustomerSpec{ID: s.Customer, Email: s.ID + "@example.com", Metadata: md})
		want := s.expected()
		var newest *relEvent
		for _, ev := range s.Events {
			if ev.ID == want.SubEventID {
				newest = ev
			}
		}
		if newest == nil {
			t.Fatalf("subscription %s: no subscription event in the plan", s.ID)
		}
		var body struct {
			Data struct {
				Object map[string]any `json:"object"`
			} `json:"data"`
		}
		if err := json.Unmarshal(newest.Body, &body); err != nil {
			t.Fatal(err)
		}
		obj := body.Data.Object
		if want.InvoiceID != "" {
			inv := map[string]any{"id": want.InvoiceID, "object": "invoice", "customer": s.Customer, "subscription": s.ID,
				"status": "paid", "attempt_count": 1, "amount_due": 2000, "currency": "usd", "created": want.InvCreated.Unix()}
			if want.PaymentHold {
				inv["status"] = "open"
			}
			obj["latest_invoice"] = inv
		}
		raw, err := json.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		acct.PutSubscriptionJSON(raw)
	}
}

// soakApp is the app backend's own traffic during the soak: customers, charges, refunds and
// Checkout sessions, each retried (with the same body, at any replica) until the answer is final.
type soakApp struct {
	t       *testing.T
	targets []string
	client  *http.Client
	next    atomic.Int64

	mu      sync.Mutex
	orders  []string
	refunds []string // "order/refund_id"
	users   []string
	failed  int
}

func (a *soakApp) run(ctx context.Context, n, workers int) {
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(a.next.Add(1)) - 1
				if i >= n || ctx.Err() != nil {
					return
				}
				a.one(i)
			}
		})
	}
	wg.Wait()
}

// one is one user's business: a customer, a charge, a partial refund, a Checkout session.
func (a *soakApp) one(i int) {
	user := fmt.Sprintf("soak_app_%05d", i)
	order := "soak_order_" + user
	steps := []struct {
		method, path string
		body         any
	}{
		{http.MethodPut, "/v1/customers/" + user, map[string]any{"email": user + "@example.com"}},
		{http.MethodPost, "/v1/charges", map[string]any{"order_id": order, "user_id": user, "amount": 1500, "currency": "usd"}},
		{http.MethodPost, "/v1/charges/" + order + "/refunds", map[string]any{"refund_id": "r1", "amount": 500}},
		{http.MethodPost, "/v1/customers/" + user + "/checkout-sessions", map[string]any{"request_id": "rq1", "price_id": "price_basic",
			"success_url": "https://app.example.com/ok", "cancel_url": "https://app.example.com/no"}},
	}
	for _, st := range steps {
		if code, body := a.final(st.method, st.path, st.body); code >= 300 {
			a.mu.Lock()
			a.failed++
			a.mu.Unlock()
			a.t.Errorf("%s %s: %d %s", st.method, st.path, code, body)
			return
		}
	}
	a.mu.Lock()
	a.users = append(a.users, user)
	a.orders = append(a.orders, order)
	a.refunds = append(a.refunds, order+"/r1")
	a.mu.Unlock()
}

// final calls until the answer is final (< 500), at the replicas in turn, for at most 3 minutes
// (replicas are killed and PostgreSQL restarts meanwhile).
func (a *soakApp) final(method, path string, body any) (int, string) {
	b, _ := json.Marshal(body)
	var code int
	var answer string
	try := 0
	ok := waitUntil(3*time.Minute, func() bool {
		base := a.targets[try%len(a.targets)]
		try++
		req, err := http.NewRequest(method, base+path, bytes.NewReader(b))
		if err != nil {
			return false
		}
		req.Header.Set("Authorization", "Bearer "+relAPIToken)
		req.Header.Set("Content-Type", "application/json")
		resp, err := a.client.Do(req)
		if err != nil {
			return false
		}
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		code, answer = resp.StatusCode, string(out)
		return code < 500
	})
	if !ok {
		return 599, "no final answer within 3 minutes (last: " + strconv.Itoa(code) + " " + answer + ")"
	}
	return code, answer
}

// check counts what Stripe made for the app's traffic: exactly one customer per user, one
// PaymentIntent per order, one refund per refund id, one Checkout session per request. It
// returns the figures.
func (a *soakApp) check(t *testing.T, p *stripeemu.Proxy) string {
	t.Helper()
	count := func(method, path string) map[string]int { return executedPerKey(p, method, path) }
	customers, pis, refunds, sessions := count(http.MethodPost, "/v1/customers"), count(http.MethodPost, "/v1/payment_intents"),
		count(http.MethodPost, "/v1/refunds"), count(http.MethodPost, "/v1/checkout/sessions")
	bad := 0
	for _, u := range a.users {
		for key, got := range map[string]int{"customer-" + u: customers["customer-"+u], "checkout-" + u + "-rq1": sessions["checkout-"+u+"-rq1"]} {
			if got != 1 {
				bad++
				t.Errorf("%s: %d objects made at Stripe, want 1", key, got)
			}
		}
	}
	for _, o := range a.orders {
		if n := pis["charge-"+o]; n != 1 {
			bad++
			t.Errorf("order %s: %d PaymentIntents, want 1", o, n)
		}
	}
	for _, r := range a.refunds {
		order, id, _ := strings.Cut(r, "/")
		if n := refunds["refund-"+order+"-"+id]; n != 1 {
			bad++
			t.Errorf("refund %s of %s: %d refunds, want 1", id, order, n)
		}
	}
	return fmt.Sprintf("orders=%d refunds=%d app_failures=%d not_exactly_once=%d", len(a.orders), len(a.refunds), a.failed, bad)
}
