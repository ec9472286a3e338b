package webhooks_test

import (
	"bufio"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"

	"billing/internal/httpserver"
	"billing/internal/jobs"
	"billing/internal/testenv"
	"billing/webhooks"
)

// scrape returns the unlabelled samples of /metrics by name.
func scrape(t *testing.T, e *echo.Echo) map[string]float64 {
	t.Helper()
	rec := httptest.NewRecorder()
	e.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("/metrics: %d %s", rec.Code, rec.Body)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(rec.Body)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if !ok || strings.HasPrefix(name, "#") || strings.Contains(name, "{") {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			t.Fatalf("sample %q: %v", sc.Text(), err)
		}
		out[name] = v
	}
	return out
}

func expectBacklog(t *testing.T, step string, got map[string]float64, deadLetters, pending float64) {
	t.Helper()
	for name, want := range map[string]float64{"billing_webhook_dead_letters": deadLetters, "billing_webhook_events_pending": pending} {
		if v, ok := got[name]; !ok || v != want {
			t.Errorf("%s: %s = %v (exported: %v), want %v", step, name, v, ok, want)
		}
	}
}

func expectNoBacklog(t *testing.T, step string, got map[string]float64) {
	t.Helper()
	for _, name := range []string{"billing_webhook_dead_letters", "billing_webhook_events_pending"} {
		if v, ok := got[name]; ok {
			t.Errorf("%s: %s exported (%v), want nothing", step, name, v)
		}
	}
}

// The backlog gauges are counted by River's periodic job and a scrape only reads the count:
// /metrics is unauthenticated, and once ran two count(*) per scrape.
func TestBacklogGaugesAreCountedByAJobNotByScrapes(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	exec := func(sql string) {
		t.Helper()
		if err := db.Exec(sql).Error; err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec(`INSERT INTO webhook_events (event_id, source, type, livemode, status, payload) VALUES
		('evt_r1', 'stripe', 't', false, 'received', '{}'),
		('evt_r2', 'stripe', 't', false, 'received', '{}'),
		('evt_p1', 'stripe', 't', false, 'processed', '{}'),
		('evt_f1', 'stripe', 't', false, 'failed', '{}'),
		('evt_f2', 'stripe', 't', false, 'failed', '{}')`)
	exec(`INSERT INTO webhook_dead_letters (event_id, livemode, attempts, last_error) VALUES ('evt_f1', false, 3, 'boom')`)

	logger := slog.New(slog.DiscardHandler)
	clk := testenv.NewClock(time.Now())
	inbox := webhooks.New(webhooks.Config{DB: db, Logger: logger, Registry: webhooks.NewRegistry(), Now: clk.Now})
	reg := prometheus.NewRegistry()
	e := httpserver.New(httpserver.Options{Logger: logger, Registry: reg, Ready: func(context.Context) error { return nil }})
	workers := river.NewWorkers()
	inbox.AddWorkers(workers)
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	client, err := jobs.NewClient(sqlDB, jobs.ClientOptions{
		Workers:      workers,
		Queues:       map[string]int{webhooks.QueueWebhooks: 2},
		PollInterval: 10 * time.Millisecond,
		Logger:       logger,
		TestOnly:     true,
	})
	if err != nil {
		t.Fatal(err)
	}
	inbox.SetJobs(client)
	inbox.RegisterGauges(reg, workers, client.PeriodicJobs())

	// Never counted (a replica that is not the leader): nothing rather than a made-up 0.
	expectNoBacklog(t, "before any count", scrape(t, e))

	// The leader's periodic job counts on start.
	events, unsubscribe := client.Subscribe(river.EventKindJobCompleted, river.EventKindJobFailed)
	defer unsubscribe()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := client.Start(ctx); err != nil {
		t.Fatal(err)
	}
	guard := time.After(30 * time.Second) // bounds a failing test only
	for counted := false; !counted; {
		select {
		case ev := <-events:
			if ev.Job.Kind != (webhooks.BacklogArgs{}).Kind() {
				continue
			}
			if ev.Kind != river.EventKindJobCompleted {
				t.Fatalf("backlog count failed: %v", ev.Job.Errors)
			}
			counted = true
		case <-guard:
			t.Fatal("the periodic backlog count did not run")
		}
	}
	stopCtx, stop := context.WithTimeout(context.Background(), 10*time.Second)
	defer stop()
	if err := client.Stop(stopCtx); err != nil {
		t.Fatalf("stop river: %v", err)
	}
	expectBacklog(t, "after the periodic count", scrape(t, e), 1, 2)

	// A later count sees the changes.
	exec(`INSERT INTO webhook_dead_letters (event_id, livemode, attempts, last_error) VALUES ('evt_f2', false, 3, 'boom')`)
	exec(`UPDATE webhook_events SET status = 'processed' WHERE event_id = 'evt_r1'`)
	expectBacklog(t, "before the next count", scrape(t, e), 1, 2)
	if err := inbox.RefreshGauges(context.Background()); err != nil {
		t.Fatal(err)
	}
	expectBacklog(t, "after the next count", scrape(t, e), 2, 1)

	// Scrapes do not touch the database: they still answer with it closed.
	if err := sqlDB.Close(); err != nil {
		t.Fatal(err)
	}
	expectBacklog(t, "with the database closed", scrape(t, e), 2, 1)
	if err := inbox.RefreshGauges(context.Background()); err == nil {
		t.Error("a count with the database closed succeeded")
	}
	expectBacklog(t, "after a failed count", scrape(t, e), 2, 1)

	// A count too old (this replica lost the leadership, or the job stopped) is not exported.
	clk.Add(time.Hour)
	expectNoBacklog(t, "with a stale count", scrape(t, e))
}

// Event ids are opaque: one that needs percent-encoding in a URL can be viewed and replayed.
func TestAdminEventIDsArePercentDecoded(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ids := []string{"evt a/b", "evt_100%", "evt_ü?x#y"}
	for _, id := range ids {
		if got := h.deliver(subEvent(id, h.clock.Now())); got.Status != http.StatusOK {
			t.Fatalf("deliver %q: %d %v", id, got.Status, got.Body)
		}
	}
	for _, id := range ids {
		path := "/admin/events/" + url.PathEscape(id)
		got := h.admin(http.MethodGet, path, adminToken)
		if got.Status != http.StatusOK || got.Body["event_id"] != id {
			t.Errorf("GET %s: %d %v, want event %q", path, got.Status, got.Body, id)
		}
		if err := h.db.Exec(`UPDATE webhook_events SET status = 'failed' WHERE event_id = $1`, id).Error; err != nil {
			t.Fatal(err)
		}
		got = h.admin(http.MethodPost, path+"/replay", adminToken)
		if got.Status != http.StatusAccepted || got.Body["event_id"] != id {
			t.Errorf("POST %s/replay: %d %v, want event %q replayed", path, got.Status, got.Body, id)
		}
		if row, _ := h.event(id); row.Status != "received" {
			t.Errorf("event %q is %s after its replay", id, row.Status)
		}
	}

	// An escape that does not decode is the client's error.
	req := httptest.NewRequest(http.MethodGet, "/admin/events/x", nil)
	req.URL.Path, req.URL.RawPath = "/admin/events/%zz", "/admin/events/%zz"
	req.Header.Set("Authorization", "Bearer "+adminToken)
	rec := httptest.NewRecorder()
	h.e.ServeHTTP(rec, req)
	if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "invalid_request") {
		t.Errorf("bad escape: %d %s, want 400 invalid_request", rec.Code, rec.Body)
	}
}

// An event's payload is served as JSON: it must not be cached or sniffed as something else.
func TestAdminEventAnswerIsNotCachedOrSniffed(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.deliver(subEvent("evt_hdr", h.clock.Now()))
	for _, path := range []string{"/admin/events/evt_hdr", "/admin/events", "/admin/events/evt_none"} {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		req.Header.Set("Authorization", "Bearer "+adminToken)
		rec := httptest.NewRecorder()
		h.e.ServeHTTP(rec, req)
		if got := rec.Header().Get("Cache-Control"); got != "no-store" {
			t.Errorf("%s (%d): Cache-Control %q", path, rec.Code, got)
		}
		if got := rec.Header().Get("X-Content-Type-Options"); got != "nosniff" {
			t.Errorf("%s (%d): X-Content-Type-Options %q", path, rec.Code, got)
		}
	}
}
