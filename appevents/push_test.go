package appevents

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"gorm.io/gorm"

	"billing/internal/testenv"
)

// The Standard Webhooks specification's published example.
func TestSignerMatchesTheSpecificationsExample(t *testing.T) {
	s, err := NewSigner([]string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"})
	if err != nil {
		t.Fatal(err)
	}
	got := s.Signature("msg_p5jXN8AQM9LWM0D4loKWxJek", time.Unix(1614265330, 0), []byte(`{"test": 2432232314}`))
	if want := "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="; got != want {
		t.Fatalf("signature = %q, want %q", got, want)
	}
}

func TestSignerSignsWithEverySecret(t *testing.T) {
	old, cur := "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_"+strings.Repeat("QUJD", 8)
	s, err := NewSigner([]string{cur, old})
	if err != nil {
		t.Fatal(err)
	}
	at := time.Now()
	body := []byte(`{"id":"aevt_1"}`)
	h := http.Header{}
	h.Set("webhook-id", "aevt_1")
	h.Set("webhook-timestamp", itoa(at.Unix()))
	h.Set("webhook-signature", s.Signature("aevt_1", at, body))
	if n := len(strings.Fields(h.Get("webhook-signature"))); n != 2 {
		t.Fatalf("%d signatures, want one per secret", n)
	}
	for _, sec := range []string{cur, old} {
		wh, err := standardwebhooks.NewWebhook(sec)
		if err != nil {
			t.Fatal(err)
		}
		if err := wh.Verify(body, h); err != nil {
			t.Errorf("the app holding one of the secrets cannot verify: %v", err)
		}
	}
	if _, err := NewSigner([]string{"not-a-secret"}); err == nil {
		t.Error("a secret without whsec_ was taken")
	}
	if _, err := NewSigner(nil); err == nil {
		t.Error("no secret was taken")
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func TestRetryScheduleIsTheContracts(t *testing.T) {
	want := []time.Duration{5 * time.Second, 30 * time.Second, 2 * time.Minute, 10 * time.Minute, time.Hour, 6 * time.Hour, 6 * time.Hour, 6 * time.Hour}
	for n, w := range want {
		if got := RetryDelay(n + 1); got != w {
			t.Errorf("delay after attempt %d = %s, want %s", n+1, got, w)
		}
	}
	if Retry.GiveUp != 72*time.Hour {
		t.Errorf("give up after %s, want 3 days", Retry.GiveUp)
	}
}

// app is the app's endpoint in push tests: it records what it was sent and answers as told.
type app struct {
	mu       sync.Mutex
	got      []http.Header
	bodies   []Body
	status   int
	answerer func(w http.ResponseWriter)
	// failSeq, when set, is the one sequence answered 500.
	failSeq int64
}

func (a *app) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	var body Body
	_ = json.Unmarshal(b, &body)
	a.mu.Lock()
	a.got = append(a.got, r.Header.Clone())
	a.bodies = append(a.bodies, body)
	status, answerer := a.status, a.answerer
	if a.failSeq != 0 && body.Sequence == a.failSeq {
		status = http.StatusInternalServerError
	}
	a.mu.Unlock()
	if answerer != nil {
		answerer(w)
		return
	}
	w.WriteHeader(status)
}

func (a *app) sequences() []int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	var s []int64
	for _, b := range a.bodies {
		s = append(s, b.Sequence)
	}
	return s
}

// clock is a settable clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) { c.mu.Lock(); defer c.mu.Unlock(); c.t = c.t.Add(d) }
func newClock() *clock               { return &clock{t: time.Now().UTC().Truncate(time.Second)} }
func job(id int64, user string) *river.Job[PushArgs] {
	return &river.Job[PushArgs]{JobRow: &rivertype.JobRow{ID: id}, Args: PushArgs{UserID: user}}
}

type pushEnv struct {
	db     *gorm.DB
	app    *app
	clock  *clock
	pusher *Pusher
	teller *Teller
}

func newPushEnv(t *testing.T, timeout time.Duration) *pushEnv {
	t.Helper()
	e := &pushEnv{db: testenv.DB(t), app: &app{status: http.StatusOK}, clock: newClock()}
	srv := httptest.NewServer(e.app)
	t.Cleanup(srv.Close)
	signer, err := NewSigner([]string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"})
	if err != nil {
		t.Fatal(err)
	}
	e.pusher = NewPusher(PusherConfig{DB: e.db, URL: srv.URL + "/hooks", Signer: signer, Timeout: timeout, Now: e.clock.Now})
	e.teller = NewTeller(false, nil, e.clock.Now)
	return e
}

func (e *pushEnv) tellN(t *testing.T, user string, n int) {
	t.Helper()
	for k := range n {
		tell(t, e.db, e.teller, answer{UserID: user, Status: "s" + itoa(int64(k))})
	}
}

func TestPushDeliversInSequenceSigned(t *testing.T) {
	e := newPushEnv(t, 2*time.Second)
	e.tellN(t, "u1", 3)
	if err := e.pusher.Work(context.Background(), job(1, "u1")); err != nil {
		t.Fatalf("Work: %v", err)
	}
	if got := e.app.sequences(); len(got) != 3 || got[0] != 1 || got[1] != 2 || got[2] != 3 {
		t.Fatalf("the app got sequences %v, want 1 2 3", got)
	}
	wh, _ := standardwebhooks.NewWebhook("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	rows := events(t, e.db, "u1")
	for k, h := range e.app.got {
		if h.Get("webhook-id") != rows[k].ID || h.Get("Content-Type") != "application/json" {
			t.Errorf("push %d headers %v, want webhook-id %s and JSON", k, h, rows[k].ID)
		}
	}
	// The body as pushed verifies with the secret (re-encoded here exactly as sent: compare the
	// feed's body, which is the pushed one).
	p, err := Feed(context.Background(), e.db, false, "", 10)
	if err != nil {
		t.Fatal(err)
	}
	for k, b := range p.Events {
		raw, _ := json.Marshal(b)
		h := e.app.got[k]
		if err := wh.VerifyIgnoringTimestamp(raw, h); err != nil {
			t.Errorf("event %s: the feed's body does not verify against the pushed signature: %v", b.ID, err)
		}
	}
	for _, r := range rows {
		if r.Status != "delivered" || r.Attempts != 1 {
			t.Errorf("event %d: %s after %d attempts, want delivered after 1", r.Sequence, r.Status, r.Attempts)
		}
	}
	var queued bool
	if err := e.db.Raw(`SELECT push_queued FROM app_event_users WHERE user_id = 'u1'`).Row().Scan(&queued); err != nil || queued {
		t.Fatalf("push_queued = %v (%v), want false once nothing is pending", queued, err)
	}
}

// snoozed returns the snooze of a Work result, failing on anything else.
func snoozed(t *testing.T, err error) time.Duration {
	t.Helper()
	var s *rivertype.JobSnoozeError
	if !errors.As(err, &s) {
		t.Fatalf("Work = %v, want a snooze", err)
	}
	return s.Duration
}

func TestPushRetriesOnTheScheduleThenGivesUpAndTheNextGoes(t *testing.T) {
	e := newPushEnv(t, 2*time.Second)
	e.app.failSeq = 1
	e.tellN(t, "u1", 2)
	start := e.clock.Now()
	for n := 1; ; n++ {
		err := e.pusher.Work(context.Background(), job(1, "u1"))
		rows := events(t, e.db, "u1")
		if rows[0].Status == "failed" {
			if elapsed := e.clock.Now().Sub(start); elapsed < Retry.GiveUp {
				t.Fatalf("given up after %s, want 3 days", elapsed)
			}
			if rows[1].Status != "delivered" {
				t.Fatalf("after the first was given up the second is %s, want delivered", rows[1].Status)
			}
			if err != nil {
				t.Fatalf("Work = %v, want done", err)
			}
			break
		}
		if got, want := snoozed(t, err), RetryDelay(n); got != want {
			t.Fatalf("after failed attempt %d the job waits %s, want %s", n, got, want)
		}
		if rows[1].Attempts != 0 {
			t.Fatalf("the second event was pushed while the first was pending")
		}
		// The job comes back when its snooze ends.
		e.clock.Add(RetryDelay(n))
		if n > 40 {
			t.Fatal("never given up")
		}
	}
	if seq := e.app.sequences(); seq[len(seq)-1] != 2 {
		t.Errorf("last pushed %v, want 2", seq)
	}
}

func TestPushTreatsTimeoutsRedirectsAndGarbage(t *testing.T) {
	for _, tc := range []struct {
		name     string
		answerer func(w http.ResponseWriter)
		want     string // status after one attempt
		errText  string
	}{
		{"hangs", func(w http.ResponseWriter) { time.Sleep(300 * time.Millisecond) }, "pending", "no answer within"},
		{"redirects", func(w http.ResponseWriter) {
			w.Header().Set("Location", "https://elsewhere.example/")
			w.WriteHeader(http.StatusFound)
		}, "pending", "redirect"},
		{"2xx with garbage", func(w http.ResponseWriter) { w.WriteHeader(http.StatusAccepted); _, _ = w.Write([]byte("<html>")) }, "delivered", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newPushEnv(t, 100*time.Millisecond)
			e.app.answerer = tc.answerer
			e.tellN(t, "u1", 1)
			_ = e.pusher.Work(context.Background(), job(1, "u1"))
			var status string
			var lastErr *string
			if err := e.db.Raw(`SELECT status, last_error FROM app_events WHERE user_id = 'u1'`).Row().Scan(&status, &lastErr); err != nil {
				t.Fatal(err)
			}
			if status != tc.want {
				t.Fatalf("status %s, want %s", status, tc.want)
			}
			if tc.errText != "" && (lastErr == nil || !strings.Contains(*lastErr, tc.errText)) {
				t.Fatalf("last_error = %v, want it to say %q", lastErr, tc.errText)
			}
		})
	}
}

// TestPushOneUserAtATime: two runs for one user (a rescued job beside its first run, or two
// replicas) never push at once; the second waits for the first's lease.
func TestPushOneUserAtATime(t *testing.T) {
	e := newPushEnv(t, 2*time.Second)
	release := make(chan struct{})
	inFlight := make(chan struct{}, 1)
	e.app.answerer = func(w http.ResponseWriter) {
		select {
		case inFlight <- struct{}{}:
		default:
		}
		<-release
		w.WriteHeader(http.StatusOK)
	}
	e.tellN(t, "u1", 1)
	first := make(chan error, 1)
	go func() { first <- e.pusher.Work(context.Background(), job(1, "u1")) }()
	<-inFlight
	// The first run is mid-push: a second run for the user steps aside.
	if d := snoozed(t, e.pusher.Work(context.Background(), job(2, "u1"))); d <= 0 {
		t.Fatalf("second run snoozed %s", d)
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if n := len(e.app.sequences()); n != 1 {
		t.Fatalf("the app got %d pushes, want 1", n)
	}
}

func TestPushWritesAJobOnlyForTheFirstPendingEvent(t *testing.T) {
	db := testenv.DB(t)
	tl := NewTeller(true, noInserter{}, nil)
	for k := range 3 {
		tell(t, db, tl, answer{UserID: "u1", Status: "s" + itoa(int64(k))})
	}
	var jobs int
	if err := db.Raw(`SELECT count(*) FROM river_job WHERE kind = $1 AND args->>'user_id' = 'u1'`, PushJobKind).Row().Scan(&jobs); err != nil {
		t.Fatal(err)
	}
	if jobs != 1 {
		t.Fatalf("%d push jobs for 3 events, want 1 (the next ones wait behind it)", jobs)
	}
}

// noInserter stands for River's client: the Teller writes the job row itself.
type noInserter struct{}

func (noInserter) InsertTx(context.Context, *sql.Tx, river.JobArgs, *river.InsertOpts) (*rivertype.JobInsertResult, error) {
	return nil, errors.New("not used")
}

// TestPushRunDoesNotEndOverAnEventWrittenMeanwhile: a run that found nothing pending must not
// end (and clear push_queued) over an event committed after it looked, since that event's
// writer saw a job queued and queued none.
func TestPushRunDoesNotEndOverAnEventWrittenMeanwhile(t *testing.T) {
	e := newPushEnv(t, 2*time.Second)
	tl := NewTeller(true, noInserter{}, e.clock.Now)
	tell(t, e.db, tl, answer{UserID: "u1", Status: "s0"}) // queues the job (push_queued)
	ctx := context.Background()
	head, wakes, held, err := e.pusher.claim(ctx, e.db, PushArgs{UserID: "u1"}, 1)
	if err != nil || !held || head == nil {
		t.Fatalf("claim: %v %v %v", head, held, err)
	}
	next, wakes, retry, err := e.pusher.attempt(ctx, e.db, PushArgs{UserID: "u1"}, 1, head)
	if err != nil || retry != nil || next != nil {
		t.Fatalf("attempt: next %v, retry %v, %v", next, retry, err)
	}
	// Nothing pending as the run saw it; now an event commits, its writer queuing no job.
	tell(t, e.db, tl, answer{UserID: "u1", Status: "s1"})
	var jobs int
	if err := e.db.Raw(`SELECT count(*) FROM river_job WHERE kind = $1`, PushJobKind).Row().Scan(&jobs); err != nil || jobs != 1 {
		t.Fatalf("%d jobs (%v), want the first one only", jobs, err)
	}
	done, lost, err := e.pusher.finish(ctx, e.db, PushArgs{UserID: "u1"}, 1, wakes)
	if err != nil || lost || done {
		t.Fatalf("finish over a new event: done %v lost %v %v; want the run to go on", done, lost, err)
	}
	if err := e.pusher.Work(ctx, job(1, "u1")); err != nil {
		t.Fatal(err)
	}
	if got := e.app.sequences(); len(got) != 2 || got[1] != 2 {
		t.Fatalf("the app got %v, want 1 2", got)
	}
	var queued bool
	if err := e.db.Raw(`SELECT push_queued FROM app_event_users WHERE user_id = 'u1'`).Row().Scan(&queued); err != nil || queued {
		t.Fatalf("push_queued = %v (%v) once all was pushed", queued, err)
	}
}
