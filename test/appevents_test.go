package test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"billing/internal/testenv"
)

// appSecret signs the app events of these tests (the Standard Webhooks example secret).
const appSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// appReceiver is the app's endpoint: it verifies each push, records it, and fails the first
// attempt of some events (500), as an app that is having a bad minute.
type appReceiver struct {
	t   *testing.T
	wh  *standardwebhooks.Webhook
	mu  sync.Mutex
	rng *rand.Rand
	// pushes in arrival order; failedOnce the ids answered 500 once.
	pushes     []appPush
	failedOnce map[string]bool
	failRate   float64
	badSigs    int
}

type appPush struct {
	ID       string `json:"id"`
	UserID   string `json:"user_id"`
	Sequence int64  `json:"sequence"`
	Type     string `json:"type"`
	Status   int    `json:"-"`
}

func newAppReceiver(t *testing.T, seed uint64, failRate float64) (*appReceiver, string) {
	wh, err := standardwebhooks.NewWebhook(appSecret)
	if err != nil {
		t.Fatal(err)
	}
	r := &appReceiver{t: t, wh: wh, rng: rand.New(rand.NewPCG(seed, 7)), failedOnce: map[string]bool{}, failRate: failRate}
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	return r, srv.URL + "/billing-events"
}

func (r *appReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	if err := r.wh.Verify(body, req.Header); err != nil {
		r.mu.Lock()
		r.badSigs++
		r.mu.Unlock()
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	var p appPush
	if err := json.Unmarshal(body, &p); err != nil || p.ID != req.Header.Get("webhook-id") {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	p.Status = http.StatusOK
	if !r.failedOnce[p.ID] && r.rng.Float64() < r.failRate {
		r.failedOnce[p.ID] = true
		p.Status = http.StatusInternalServerError
	}
	r.pushes = append(r.pushes, p)
	w.WriteHeader(p.Status)
}

func (r *appReceiver) snapshot() []appPush {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]appPush(nil), r.pushes...)
}

// TestAppEventsSurviveKillsAndReplicas: two replicas apply a storm of subscription events while
// one is SIGKILLed and restarted mid-push, the app fails some first attempts; afterwards every
// event written was delivered, each user's in sequence order without a gap, duplicates only by
// retries and kills, the feed lists each event once, and `billing verify` finds every change told.
func TestAppEventsSurviveKillsAndReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two services")
	}
	seed := relSeed(t)
	rng := rand.New(rand.NewPCG(seed, 1))
	app, appURL := newAppReceiver(t, seed, 0.15)
	url := testenv.DatabaseURL(t)
	env := relEnv(t, url)
	env["BILLING_APP_EVENTS_URL"] = appURL
	env["BILLING_APP_EVENTS_SECRETS"] = appSecret
	env["BILLING_APP_EVENTS_TIMEOUT"] = "2s"
	a := newService(t, "replica-a", env)
	b := newService(t, "replica-b", env)
	db := openDB(t, url)

	const users = 12
	for u := range users {
		if _, err := db.Exec(`INSERT INTO customers (user_id, stripe_customer_id, email) VALUES ($1, $2, $3)`,
			fmt.Sprintf("user_%d", u), fmt.Sprintf("cus_ae%d", u), fmt.Sprintf("u%d@example.com", u)); err != nil {
			t.Fatal(err)
		}
	}
	// Each user's subscription goes through statuses that all change the answer.
	statuses := []string{"trialing", "active", "past_due", "active", "unpaid", "active", "canceled"}
	t0 := time.Now().Add(-time.Hour).Truncate(time.Second)
	client := &http.Client{Timeout: 10 * time.Second}
	ctx := context.Background()
	targets := []*service{a, b}
	for step, status := range statuses {
		for u := range users {
			typ := "customer.subscription.updated"
			if status == "canceled" {
				typ = "customer.subscription.deleted"
			}
			body := atkSubEvent(fmt.Sprintf("evt_ae_%d_%d", u, step), typ, false, fmt.Sprintf("sub_ae%d", u),
				fmt.Sprintf("cus_ae%d", u), status, t0.Add(time.Duration(step)*time.Minute))
			// Stripe retries until a 200; either replica may answer.
			for {
				code, _, err := postEvent(ctx, client, targets[rng.IntN(2)].url(""), body)
				if err == nil && code == http.StatusOK {
					break
				}
			}
		}
		if step == 2 || step == 4 {
			// Mid-push: the killed replica's running pushes are rescued by the other one.
			a.kill()
			a.start()
		}
	}

	waitAppEventsPushed(t, db, 3*time.Minute)

	if problems, figures := checkAppEvents(t, db, app, 2); len(problems) > 0 {
		t.Fatalf("%s: %v", figures, problems)
	} else {
		t.Log(figures)
	}
	stored := countRows(t, db, `SELECT count(*) FROM app_events`)

	// The feed lists each event once, whoever reads it, in an order that keeps each user's.
	seen := map[string]bool{}
	after := ""
	for {
		var page struct {
			Events []appPush `json:"events"`
			More   bool      `json:"has_more"`
		}
		code, body := get(t, a.url("/v1/app-events?limit=7&after="+after), relAPIToken)
		if code != http.StatusOK {
			t.Fatalf("feed: %d %s", code, body)
		}
		if err := json.Unmarshal([]byte(body), &page); err != nil {
			t.Fatal(err)
		}
		for _, e := range page.Events {
			if seen[e.ID] {
				t.Fatalf("the feed listed %s twice", e.ID)
			}
			seen[e.ID] = true
			after = e.ID
		}
		if !page.More {
			break
		}
	}
	if len(seen) != stored {
		t.Fatalf("the feed listed %d events of %d", len(seen), stored)
	}

	code, out := runCmd(t, t.TempDir(), map[string]string{"BILLING_DATABASE_URL": url, "BILLING_LOG_LEVEL": "warn"}, "verify")
	if code != 0 {
		t.Fatalf("billing verify after the storm: exit %d\n%s", code, tail(out, 3000))
	}
	if n := countRows(t, db, `SELECT count(DISTINCT user_id) FROM app_events`); n != users {
		t.Fatalf("events for %d users, want %d", n, users)
	}
	if n := countRows(t, db, `SELECT count(*) FROM app_events`); n < users*len(statuses) {
		t.Fatalf("%d events for %d users' %d changes each", n, users, len(statuses))
	}
}

func countRows(t *testing.T, db *sql.DB, query string) int {
	t.Helper()
	var n int
	if err := db.QueryRow(query).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitAppEventsPushed waits until no app event is pending.
func waitAppEventsPushed(t *testing.T, db *sql.DB, limit time.Duration) {
	t.Helper()
	var pending int
	if !waitUntil(limit, func() bool {
		return db.QueryRow(`SELECT count(*) FROM app_events WHERE status = 'pending'`).Scan(&pending) == nil && pending == 0
	}) {
		t.Errorf("%d app events still pending %s after the storm", pending, limit)
	}
}

// checkAppEvents compares what the app was pushed with what is stored: every event delivered
// (lost 0), each user's first deliveries in sequence order without a gap, no event pushed more
// often than its recorded attempts plus the kills (a push in flight when its process died is
// pushed again), every push's signature valid. It returns the problems and a line of figures.
func checkAppEvents(t *testing.T, db *sql.DB, app *appReceiver, kills int) (problems []string, figures string) {
	t.Helper()
	type row struct {
		user     string
		sequence int64
		attempts int
		status   string
	}
	rows, err := db.Query(`SELECT id, user_id, sequence, attempts, status FROM app_events ORDER BY user_id, sequence`)
	if err != nil {
		t.Fatal(err)
	}
	stored := map[string]row{}
	gaps := 0
	last := map[string]int64{}
	for rows.Next() {
		var id string
		var r row
		if err := rows.Scan(&id, &r.user, &r.sequence, &r.attempts, &r.status); err != nil {
			t.Fatal(err)
		}
		if r.sequence != last[r.user]+1 {
			gaps++
			problems = append(problems, fmt.Sprintf("user %s: stored sequence %d after %d", r.user, r.sequence, last[r.user]))
		}
		last[r.user] = r.sequence
		stored[id] = r
	}
	rows.Close()

	pushes := app.snapshot()
	deliveries := map[string]int{}
	delivered := map[string]bool{}
	lastFirst := map[string]int64{}
	disorder := 0
	for _, p := range pushes {
		if _, ok := stored[p.ID]; !ok {
			problems = append(problems, "the app was pushed "+p.ID+", which is not stored")
			continue
		}
		deliveries[p.ID]++
		if delivered[p.ID] {
			continue // pushed again after a kill: the same event, not a later one
		}
		// The next of a user's events only after the previous was answered 2xx.
		if p.Sequence != lastFirst[p.UserID] && p.Sequence != lastFirst[p.UserID]+1 {
			disorder++
			problems = append(problems, fmt.Sprintf("user %s: pushed sequence %d after %d", p.UserID, p.Sequence, lastFirst[p.UserID]))
		}
		lastFirst[p.UserID] = p.Sequence
		if p.Status == http.StatusOK {
			delivered[p.ID] = true
		}
	}
	lost, extra, undelivered := 0, 0, 0
	for id, r := range stored {
		if !delivered[id] {
			lost++
		}
		if r.status != "delivered" {
			undelivered++
		}
		if deliveries[id] > r.attempts+kills {
			extra++
			problems = append(problems, fmt.Sprintf("event %s pushed %d times with %d attempts recorded", id, deliveries[id], r.attempts))
		}
	}
	if lost > 0 {
		problems = append(problems, fmt.Sprintf("%d app events never reached the app", lost))
	}
	if undelivered > 0 {
		problems = append(problems, fmt.Sprintf("%d app events not marked delivered", undelivered))
	}
	app.mu.Lock()
	bad := app.badSigs
	app.mu.Unlock()
	if bad > 0 {
		problems = append(problems, fmt.Sprintf("%d pushes failed their signature", bad))
	}
	app.mu.Lock()
	failedFirst := len(app.failedOnce)
	app.mu.Unlock()
	figures = fmt.Sprintf("app_events=%d users=%d pushes=%d app_failed_first=%d lost=%d sequence_gaps=%d out_of_order=%d beyond_retries=%d",
		len(stored), len(last), len(pushes), failedFirst, lost, gaps, disorder, extra)
	return problems, figures
}
