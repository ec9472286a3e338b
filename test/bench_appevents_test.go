package test

// BenchmarkAppEvents: the figures of the app events (docs/benchmarks.md), on the benchmark
// cluster with the real binary and an app endpoint on loopback that answers 204 at once:
//
//   - applied events/s of the lifecycle mix with the push on and off, alternated rounds of one
//     run (target: on ≥ 0.9 × off);
//   - the p99 from a change's commit (its webhook's 200) to the app's 2xx for that change, at
//     500 changes/s, each a subscription update of another user that changes its seats
//     (target ≤ 1 s);
//   - an outage's backlog: 100,000 events of 1,000 users written as pending, pushed by a
//     service that starts afterwards (target ≥ 1,000/s);
//   - the feed read from the start, 500 a page (target ≥ 5,000 events/s).
//
// Reported against the targets, never failed on them. BENCH_APPEVENTS_DURATION sets a round's
// length (10 s), BENCH_APPEVENTS_ROUNDS their number (2), BENCH_APPEVENTS_BACKLOG the outage's
// events (100,000).

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"billing/internal/stripeevents"
)

// benchApp is the app's endpoint: it counts pushes and, for the latency round, notes when each
// change (by its seats) arrived.
type benchApp struct {
	pushes  atomic.Int64
	mu      sync.Mutex
	arrived map[int64]time.Time
}

func (a *benchApp) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	at := time.Now()
	a.pushes.Add(1)
	var ev struct {
		Data struct {
			Quantity *int64 `json:"quantity"`
		} `json:"data"`
	}
	if json.Unmarshal(body, &ev) == nil && ev.Data.Quantity != nil && *ev.Data.Quantity > 1000 {
		a.mu.Lock()
		if _, seen := a.arrived[*ev.Data.Quantity]; !seen {
			a.arrived[*ev.Data.Quantity] = at
		}
		a.mu.Unlock()
	}
	w.WriteHeader(http.StatusNoContent)
}

func BenchmarkAppEvents(b *testing.B) {
	dur := benchDurationEnv(b, "BENCH_APPEVENTS_DURATION", 10*time.Second)
	rounds := benchCountEnv(b, "BENCH_APPEVENTS_ROUNDS", 2)
	backlog := benchCountEnv(b, "BENCH_APPEVENTS_BACKLOG", 100000)
	d := startBenchDB(b)
	benchSeedUsers(b, d)
	gen := newE2EEvents(b, benchUsers)
	app := &benchApp{arrived: map[int64]time.Time{}}
	srv := httptest.NewServer(app)
	b.Cleanup(srv.Close)
	push := map[string]string{"BILLING_APP_EVENTS_URL": srv.URL + "/events", "BILLING_APP_EVENTS_SECRETS": appSecret}
	client := benchHTTPClient()

	// 1. Applied events/s, push off and on, alternated.
	rates := map[string][]float64{}
	for r := range rounds {
		for _, mode := range []string{"off", "on"} {
			var extra map[string]string
			if mode == "on" {
				extra = push
			}
			// Each round pushes its own events only: what an earlier round left pending (the push
			// was off) is not this round's work.
			benchAppEventsSettled(b, d)
			p := startBenchService(b, d, extra)
			prefix := fmt.Sprintf("evt_aev%d%s", r, mode)
			cpu0 := benchCPUTime(p.cmd.Process.Pid)
			start := time.Now()
			lat, elapsed, errs, firstErr := benchLoad(benchClients, dur, func(w, i int) error {
				return benchPostEvent(client, p.url("/webhooks/stripe"), appliedEvent(gen, "mix", prefix, w, i))
			})
			if errs > 0 {
				b.Errorf("push %s round %d: %d deliveries not acknowledged; first: %v", mode, r, errs, firstErr)
			}
			var applied int
			if err := d.db.QueryRow(`SELECT count(*) FROM webhook_events WHERE event_id LIKE $1 || '%' AND status = 'processed' AND processed_at <= $2`,
				prefix, start.Add(elapsed)).Scan(&applied); err != nil {
				b.Fatal(err)
			}
			cpu := benchCPUTime(p.cmd.Process.Pid) - cpu0
			rate := float64(applied) / elapsed.Seconds()
			rates[mode] = append(rates[mode], rate)
			var pushed int
			if err := d.db.QueryRow(`SELECT count(*) FROM app_events WHERE status = 'delivered' AND delivered_at >= $1`, start).Scan(&pushed); err != nil {
				b.Fatal(err)
			}
			fmt.Printf("app events round %d push %-3s applied %5.0f/s (%d acknowledged) p99 %s, service CPU %s/event, %d pushed\n",
				r+1, mode, rate, len(lat), benchMS(benchQuantile(lat, 0.99)), appliedMicros(cpu/time.Duration(max(applied, 1))), pushed)
			if code := p.stop(b, syscall.SIGTERM); code != 0 {
				b.Errorf("billing exited %d after SIGTERM", code)
			}
		}
	}
	on, off := benchMedian(rates["on"]), benchMedian(rates["off"])
	fmt.Printf("app events: applied with the push on %.0f/s, off %.0f/s: %.2f (%s)\n", on, off, on/off, e2eVerdict(on >= 0.9*off, "≥ 0.9"))
	b.ReportMetric(on/off, "push-on/off")

	// 2. Commit to the app's 2xx at 500 changes/s.
	benchAppEventsSettled(b, d)
	p := startBenchService(b, d, push)
	const rate = 500
	n := int(dur.Seconds() * rate)
	acked := make([]time.Time, n)
	var wg sync.WaitGroup
	var failed atomic.Int64
	t0 := time.Now()
	for i := range n {
		// Open loop: the i-th change goes at its time, whatever the answers' pace.
		time.Sleep(time.Until(t0.Add(time.Duration(i) * time.Second / rate)))
		user := 1 + i%benchUsers // one change a user: each is news
		seats := int64(1001 + i)
		wg.Go(func() {
			body := stripeevents.SubscriptionEvent(fmt.Sprintf("evt_aelat_%d", i), "customer.subscription.updated", time.Now(), false,
				stripeevents.Subscription{ID: "sub_bench_" + strconv.Itoa(user), Customer: "cus_bench_" + strconv.Itoa(user), Status: "active",
					PriceID: "price_bench", CurrentPeriodStart: t0.Add(-24 * time.Hour), CurrentPeriodEnd: t0.AddDate(0, 1, 0), Quantity: seats})
			if err := benchPostEvent(client, p.url("/webhooks/stripe"), body); err != nil {
				failed.Add(1)
				return
			}
			acked[i] = time.Now()
		})
	}
	offered := time.Since(t0)
	wg.Wait()
	waitPushed := time.Now().Add(time.Minute)
	var lat []time.Duration
	for {
		app.mu.Lock()
		got := len(app.arrived)
		app.mu.Unlock()
		if got >= n-int(failed.Load()) || time.Now().After(waitPushed) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	app.mu.Lock()
	missing := 0
	for i := range n {
		at, ok := app.arrived[int64(1001+i)]
		if !ok || acked[i].IsZero() {
			missing++
			continue
		}
		lat = append(lat, max(0, at.Sub(acked[i])))
	}
	app.mu.Unlock()
	slices.Sort(lat)
	p99 := benchQuantile(lat, 0.99)
	fmt.Printf("app events: %d changes at %.0f/s offered: commit → app's 2xx p50 %s p99 %s (%s); %d not pushed within a minute\n",
		n, float64(n)/offered.Seconds(), benchMS(benchQuantile(lat, 0.5)), benchMS(p99), e2eVerdict(p99 <= time.Second, "≤ 1 s"), missing)
	b.ReportMetric(float64(p99)/float64(time.Millisecond), "commit-to-2xx-p99-ms")
	if code := p.stop(b, syscall.SIGTERM); code != 0 {
		b.Errorf("billing exited %d after SIGTERM", code)
	}

	// 3. An outage's backlog, pushed by a service that starts after it.
	users := 1000
	per := backlog / users
	benchAppEventsSettled(b, d)
	// The app was down for an hour: every user's head is due again now, at its next retry.
	d.exec(b, `INSERT INTO app_event_users (user_id, livemode, last_sequence, push_due_at) SELECT 'backlog_' || u, false, `+strconv.Itoa(per)+`, now()
		FROM generate_series(1, `+strconv.Itoa(users)+`) u`)
	d.exec(b, `INSERT INTO app_events (id, user_id, livemode, sequence, type, subject, created_at, data, next_at)
		SELECT 'aevt_backlog_' || u || '_' || s, 'backlog_' || u, false, s, 'entitlement.updated', 'entitlement', now() - interval '1 hour',
		  jsonb_build_object('user_id', 'backlog_' || u, 'entitled', s % 2 = 0, 'status', 'active', 'previous', jsonb_build_object('entitled', s % 2 = 1)), now()
		FROM generate_series(1, `+strconv.Itoa(users)+`) u, generate_series(1, `+strconv.Itoa(per)+`) s`)
	d.exec(b, `INSERT INTO app_event_queue (livemode, user_id, sequence, id, created_at)
		SELECT livemode, user_id, sequence, id, created_at FROM app_events WHERE id LIKE 'aevt_backlog_%'`)
	before := app.pushes.Load()
	t1 := time.Now()
	p = startBenchService(b, d, push)
	var pending int
	ok := waitUntil(10*time.Minute, func() bool {
		return d.db.QueryRow(`SELECT count(*) FROM app_events WHERE status = 'pending'`).Scan(&pending) == nil && pending == 0
	})
	drain := time.Since(t1)
	pushed := app.pushes.Load() - before
	drainRate := float64(users*per) / drain.Seconds()
	fmt.Printf("app events: a backlog of %d events of %d users pushed in %s (from the service's start): %.0f/s (%s)%s\n",
		users*per, users, drain.Round(time.Millisecond), drainRate, e2eVerdict(drainRate >= 1000, "≥ 1,000/s"),
		map[bool]string{true: "", false: fmt.Sprintf("; %d still pending", pending)}[ok])
	if pushed < int64(users*per) {
		b.Errorf("the app got %d pushes of the %d backlog events", pushed, users*per)
	}
	b.ReportMetric(drainRate, "backlog-events/s")

	// 4. The feed from the start.
	t2 := time.Now()
	read, after := 0, ""
	for {
		url := p.url("/v1/app-events?limit=500")
		if after != "" {
			url += "&after=" + after
		}
		code, body := get(b, url, benchAPIToken)
		if code != http.StatusOK {
			b.Fatalf("feed: %d %s", code, body)
		}
		var page struct {
			Events []struct {
				ID string `json:"id"`
			} `json:"events"`
			HasMore bool `json:"has_more"`
		}
		if err := json.Unmarshal([]byte(body), &page); err != nil {
			b.Fatal(err)
		}
		read += len(page.Events)
		if len(page.Events) > 0 {
			after = page.Events[len(page.Events)-1].ID
		}
		if !page.HasMore {
			break
		}
	}
	feedRate := float64(read) / time.Since(t2).Seconds()
	fmt.Printf("app events: the feed read %d events from the start at %.0f/s (%s)\n", read, feedRate, e2eVerdict(feedRate >= 5000, "≥ 5,000/s"))
	b.ReportMetric(feedRate, "feed-events/s")
	if code := p.stop(b, syscall.SIGTERM); code != 0 {
		b.Errorf("billing exited %d after SIGTERM", code)
	}
}

// benchAppEventsSettled marks every pending app event delivered: a round's pushes are its own.
func benchAppEventsSettled(b *testing.B, d *benchDB) {
	d.exec(b, `UPDATE app_events SET status = 'delivered', delivered_at = now() WHERE status = 'pending'`)
	d.exec(b, `DELETE FROM app_event_queue`)
	d.exec(b, `UPDATE app_event_users SET push_due_at = NULL WHERE push_due_at IS NOT NULL`)
}
