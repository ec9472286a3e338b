package test

// The long run (make soak-long; not part of make test): steady mixed load on one replica for
// SOAK_DURATION (30 minutes by default) — lifecycle events from rounds of fresh plans, paced, and
// the app's own traffic — with the replica's resident set, its goroutines, the database
// connections and the event table's size sampled every 10 s. Memory and goroutines must stay
// flat (no leak); the samples are written as an SVG plot of RSS over time (SOAK_PLOT, by default
// docs/soak-rss.svg) and one figure line.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"billing/internal/stripeemu"
	"billing/internal/testenv"
)

type soakSample struct {
	At         time.Duration
	RSSKB      int64
	Goroutines int64
	Conns      int64
	EventBytes int64
	Events     int64
}

func TestSoakLong(t *testing.T) {
	if os.Getenv("BILLING_SOAK_LONG") == "" {
		t.Skip("the long run runs with make soak-long (BILLING_SOAK_LONG=1)")
	}
	duration := 30 * time.Minute
	if v := os.Getenv("SOAK_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 30*time.Second {
			t.Fatalf("SOAK_DURATION=%q: want a duration of at least 30s", v)
		}
		duration = d
	}
	const every = 10 * time.Second
	seed := relSeed(t)
	rng := rand.New(rand.NewPCG(seed, 29))
	url := testenv.DatabaseURL(t)
	db := openDB(t, url)
	proxy := stripeemu.New(t, testenv.StripeMockURL(t))
	stripeemu.NewAccount(proxy, false)
	stripeemu.NewCheckoutSessions(proxy, false)
	env := relEnv(t, url)
	env["BILLING_STRIPE_API_URL"] = proxy.URL
	// Retention on, at its shortest: the pruner runs, though nothing of a run this short is old
	// enough to go (the event table's size shows the growth it will bound).
	env["BILLING_WEBHOOKS_RETENTION"] = "24h"
	delete(env, "BILLING_WORKER_RESCUE_AFTER")
	svc := newService(t, "replica", env)

	ctx, cancel := context.WithTimeout(context.Background(), duration)
	defer cancel()
	var load sync.WaitGroup
	var rounds, delivered int
	load.Go(func() {
		// Rounds of fresh plans, delivered 20 deliveries a second by 4 senders.
		pace := time.NewTicker(time.Second)
		defer pace.Stop()
		for round := 0; ctx.Err() == nil; round++ {
			plan := genPlan(rng, fmt.Sprintf("long%04d", round), 20, 100)
			deliveries := plan.deliveries(rng)
			s := newSenders(plan, []string{svc.url("")})
			for start := 0; start < len(deliveries) && ctx.Err() == nil; start += 20 {
				batch := deliveries[start:min(start+20, len(deliveries))]
				<-s.run(context.Background(), batch, 4)
				delivered += len(batch)
				select {
				case <-ctx.Done():
				case <-pace.C:
				}
			}
			rounds++
		}
	})
	app := &soakApp{t: t, targets: []string{svc.url("")}, client: &http.Client{Timeout: time.Minute}}
	load.Go(func() {
		for i := 0; ctx.Err() == nil; i++ {
			app.one(i)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second): // the app's pace: a user's business a second
			}
		}
	})

	var samples []soakSample
	t0 := time.Now()
	sample := func() {
		s := soakSample{At: time.Since(t0).Round(time.Second), RSSKB: procStatusKB(svc.p.cmd.Process.Pid, "VmRSS")}
		if _, body := get(t, svc.url("/metrics"), ""); body != "" {
			s.Goroutines = metricValue(body, "go_goroutines")
		}
		_ = db.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&s.Conns)
		_ = db.QueryRow(`SELECT pg_total_relation_size('webhook_events'), (SELECT count(*) FROM webhook_events)`).Scan(&s.EventBytes, &s.Events)
		samples = append(samples, s)
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	sample()
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-tick.C:
			sample()
		}
	}
	load.Wait()
	sample()
	waitDrained(t, db, 5*time.Minute)

	// Flat: after the first fifth (warm-up: pools, caches, the heap's first growth), the last
	// third's median RSS stays within a quarter (and 16 MiB) of the middle third's, and the
	// goroutines' peak of the last third within 20 of the middle third's.
	n := len(samples)
	warm := samples[n/5:]
	third := len(warm) / 3
	if third < 1 {
		t.Fatalf("%d samples: too few to judge (SOAK_DURATION too short)", n)
	}
	mid, last := warm[third:2*third], warm[2*third:]
	medRSS := func(ss []soakSample) int64 {
		v := make([]int64, len(ss))
		for i, s := range ss {
			v[i] = s.RSSKB
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	peakG := func(ss []soakSample) int64 {
		var m int64
		for _, s := range ss {
			m = max(m, s.Goroutines)
		}
		return m
	}
	if medRSS(last) > medRSS(mid)*5/4+16*1024 {
		t.Errorf("RSS grows: median %d KiB in the middle third, %d KiB in the last", medRSS(mid), medRSS(last))
	}
	if peakG(last) > peakG(mid)+20 {
		t.Errorf("goroutines grow: peak %d in the middle third, %d in the last", peakG(mid), peakG(last))
	}
	first, end := samples[0], samples[n-1]
	line := fmt.Sprintf("soak-long: duration=%s rounds=%d deliveries=%d app_users=%d samples=%d rss_kib(first=%d mid_median=%d last_median=%d peak=%d) "+
		"goroutines(first=%d mid_peak=%d last_peak=%d) db_conns(last=%d) webhook_events(rows=%d bytes=%d)",
		duration, rounds, delivered, len(app.users), n, first.RSSKB, medRSS(mid), medRSS(last), slices.MaxFunc(samples, func(a, b soakSample) int {
			return int(a.RSSKB - b.RSSKB)
		}).RSSKB, first.Goroutines, peakG(mid), peakG(last), end.Conns, end.Events, end.EventBytes)
	t.Log(line)
	fmt.Println(line)
	plot := os.Getenv("SOAK_PLOT")
	if plot == "" {
		plot = "../docs/soak-rss.svg"
	}
	if err := os.WriteFile(plot, []byte(rssSVG(samples, line)), 0o644); err != nil {
		t.Errorf("write the plot: %v", err)
	} else {
		t.Logf("plot of RSS over time written to %s", plot)
	}
}

// metricValue is the value of an unlabelled metric in Prometheus' text format (0 when absent).
func metricValue(body, name string) int64 {
	for _, line := range strings.Split(body, "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			f, _ := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return int64(f)
		}
	}
	return 0
}

// rssSVG plots RSS (MiB) and goroutines over time, with the figure line as the caption.
func rssSVG(samples []soakSample, caption string) string {
	const w, h, left, bottom, top = 800.0, 400.0, 60.0, 40.0, 30.0
	var maxT, maxRSS, maxG float64 = 1, 1, 1
	for _, s := range samples {
		maxT = max(maxT, s.At.Seconds())
		maxRSS = max(maxRSS, float64(s.RSSKB)/1024)
		maxG = max(maxG, float64(s.Goroutines))
	}
	maxRSS *= 1.1
	maxG *= 1.1
	x := func(s soakSample) float64 { return left + (w-left-20)*s.At.Seconds()/maxT }
	yOf := func(v, top2 float64) float64 { return h - bottom - (h-bottom-top)*v/top2 }
	var rss, gor []string
	for _, s := range samples {
		rss = append(rss, fmt.Sprintf("%.1f,%.1f", x(s), yOf(float64(s.RSSKB)/1024, maxRSS)))
		gor = append(gor, fmt.Sprintf("%.1f,%.1f", x(s), yOf(float64(s.Goroutines), maxG)))
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="11">`+"\n", w, h+30)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="black"/>`+"\n", left, h-bottom, w-20, h-bottom)
	fmt.Fprintf(&b, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="black"/>`+"\n", left, top, left, h-bottom)
	for i := 0; i <= 4; i++ {
		v := maxRSS * float64(i) / 4
		y := yOf(v, maxRSS)
		fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" text-anchor="end">%.0f MiB</text>`+"\n", left-4, y+4, v)
		fmt.Fprintf(&b, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#ddd"/>`+"\n", left, y, w-20, y)
		tx := left + (w-left-20)*float64(i)/4
		fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" text-anchor="middle">%s</text>`+"\n", tx, h-bottom+16,
			(time.Duration(maxT*float64(i)/4) * time.Second).Round(time.Second))
	}
	fmt.Fprintf(&b, `<polyline fill="none" stroke="#1f77b4" stroke-width="2" points="%s"/>`+"\n", strings.Join(rss, " "))
	fmt.Fprintf(&b, `<polyline fill="none" stroke="#ff7f0e" stroke-width="1" stroke-dasharray="4 3" points="%s"/>`+"\n", strings.Join(gor, " "))
	fmt.Fprintf(&b, `<text x="%.0f" y="18">billing serve under steady load: RSS (MiB, solid) and goroutines (dashed, 0–%.0f), sampled every 10 s</text>`+"\n", left, maxG)
	fmt.Fprintf(&b, `<text x="10" y="%.0f" font-size="9">%s</text>`+"\n", h+20, xmlEscape(caption))
	b.WriteString("</svg>\n")
	return b.String()
}

func xmlEscape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}
