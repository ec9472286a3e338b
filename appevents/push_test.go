package appevents

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

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

type pushEnv struct {
	db     *gorm.DB
	app    *app
	clock  *testenv.Clock
	pusher *Pusher
	teller *Teller
	url    string
}

func newPushEnv(t *testing.T, timeout time.Duration) *pushEnv {
	t.Helper()
	e := &pushEnv{db: testenv.DB(t), app: &app{status: http.StatusOK}, clock: testenv.NewClock(time.Now().UTC().Truncate(time.Second))}
	srv := httptest.NewServer(e.app)
	t.Cleanup(srv.Close)
	e.url = srv.URL + "/hooks"
	e.pusher = e.newPusher(t, timeout)
	e.teller = NewTeller(e.clock.Now)
	return e
}

func (e *pushEnv) newPusher(t *testing.T, timeout time.Duration) *Pusher {
	signer, err := NewSigner([]string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"})
	if err != nil {
		t.Fatal(err)
	}
	return NewPusher(PusherConfig{DB: e.db, URL: e.url, Signer: signer, Timeout: timeout, Concurrency: 4, Now: e.clock.Now})
}

func (e *pushEnv) tellN(t *testing.T, user string, n int) {
	t.Helper()
	for k := range n {
		tell(t, e.db, e.teller, answer{UserID: user, Status: "s" + itoa(int64(k))})
	}
}

// step runs one round of the push and returns how many users it pushed.
func (e *pushEnv) step(t *testing.T) int {
	t.Helper()
	n, err := e.pusher.Step(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// dueAt is the user's push_due_at.
func (e *pushEnv) dueAt(t *testing.T, user string) *time.Time {
	t.Helper()
	var at *time.Time
	if err := e.db.Raw(`SELECT push_due_at FROM app_event_users WHERE user_id = $1`, user).Row().Scan(&at); err != nil {
		t.Fatal(err)
	}
	return at
}

func TestPushDeliversInSequenceSigned(t *testing.T) {
	e := newPushEnv(t, 2*time.Second)
	e.tellN(t, "u1", 3)
	for e.step(t) > 0 {
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
	// The feed's body is the pushed one: it verifies against the pushed signature.
	p, err := Feed(context.Background(), e.db, false, "", 10)
	if err != nil {
		t.Fatal(err)
	}
	for k, b := range p.Events {
		raw, _ := json.Marshal(b)
		if err := wh.VerifyIgnoringTimestamp(raw, e.app.got[k]); err != nil {
			t.Errorf("event %s: the feed's body does not verify against the pushed signature: %v", b.ID, err)
		}
	}
	for _, r := range rows {
		if r.Status != "delivered" || r.Attempts != 1 {
			t.Errorf("event %d: %s after %d attempts, want delivered after 1", r.Sequence, r.Status, r.Attempts)
		}
	}
	if at := e.dueAt(t, "u1"); at != nil {
		t.Fatalf("push_due_at = %v once nothing is pending, want none", at)
	}
}

func TestPushRetriesOnTheScheduleThenGivesUpAndTheNextGoes(t *testing.T) {
	e := newPushEnv(t, 2*time.Second)
	e.app.failSeq = 1
	e.tellN(t, "u1", 2)
	start := e.clock.Now()
	for n := 1; ; n++ {
		if got := e.step(t); got != 1 {
			t.Fatalf("round %d pushed %d users, want 1", n, got)
		}
		rows := events(t, e.db, "u1")
		if rows[0].Status == "failed" {
			if elapsed := e.clock.Now().Sub(start); elapsed < Retry.GiveUp {
				t.Fatalf("given up after %s, want 3 days", elapsed)
			}
			if e.step(t) != 1 || events(t, e.db, "u1")[1].Status != "delivered" {
				t.Fatalf("after the first was given up the second is not delivered: %+v", events(t, e.db, "u1"))
			}
			break
		}
		if rows[0].Attempts != n || rows[1].Attempts != 0 {
			t.Fatalf("round %d: attempts %d and %d, want %d and 0 (the second waits)", n, rows[0].Attempts, rows[1].Attempts, n)
		}
		due := e.dueAt(t, "u1")
		if want := e.clock.Now().Add(RetryDelay(n)); due == nil || !due.Equal(want) {
			t.Fatalf("after failed attempt %d the user is due at %v, want %v", n, due, want)
		}
		// Not before its time.
		e.clock.Add(RetryDelay(n) - time.Second)
		if got := e.step(t); got != 0 {
			t.Fatalf("pushed %d users a second before the retry", got)
		}
		e.clock.Add(time.Second)
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
			e.step(t)
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

// TestPushOneUserAtATime: two replicas never push one user at once; a user's hanging app
// delays no other user.
func TestPushOneUserAtATime(t *testing.T) {
	e := newPushEnv(t, 2*time.Second)
	release := make(chan struct{})
	inFlight := make(chan struct{}, 1)
	e.app.answerer = func(w http.ResponseWriter) {
		select {
		case inFlight <- struct{}{}:
			<-release // the first push hangs until released
		default:
		}
		w.WriteHeader(http.StatusOK)
	}
	e.tellN(t, "u1", 1)
	first := make(chan error, 1)
	go func() { _, err := e.pusher.Step(context.Background()); first <- err }()
	<-inFlight
	other := e.newPusher(t, 2*time.Second)
	e.tellN(t, "u2", 1)
	if n, err := other.Step(context.Background()); err != nil || n != 1 {
		t.Fatalf("the other replica pushed %d users (%v), want u2 only", n, err)
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	e.app.mu.Lock()
	defer e.app.mu.Unlock()
	var u1 int
	for _, b := range e.app.bodies {
		if b.UserID == "u1" {
			u1++
		}
	}
	if u1 != 1 || len(e.app.bodies) != 2 {
		t.Fatalf("the app got %d pushes of u1 and %d in all, want 1 and 2", u1, len(e.app.bodies))
	}
}

func TestTellMakesTheUserDueOnce(t *testing.T) {
	e := newPushEnv(t, 2*time.Second)
	e.tellN(t, "u1", 1)
	first := e.dueAt(t, "u1")
	if first == nil {
		t.Fatal("a pending event left its user not due")
	}
	e.clock.Add(time.Minute)
	e.tellN(t, "u1", 1)
	if again := e.dueAt(t, "u1"); again == nil || !again.Equal(*first) {
		t.Fatalf("a second event moved the due time %v to %v: the head goes first", first, again)
	}
}

// TestPushDoesNotLeaveAnEventWrittenDuringItsRecord: an event that commits while a push records
// its answer (the writer holds the user's lock; the record's snapshot misses the event) keeps
// the user due, so the event is pushed next, not left without a push.
func TestPushDoesNotLeaveAnEventWrittenDuringItsRecord(t *testing.T) {
	e := newPushEnv(t, 2*time.Second)
	e.tellN(t, "u1", 1)
	ctx := context.Background()
	heads, err := e.pusher.claim(ctx, 4)
	if err != nil || len(heads) != 1 || heads[0].head == nil {
		t.Fatalf("claim: %+v %v", heads, err)
	}
	// A writer locks the user and writes the next event, not committed yet.
	w := e.db.Begin()
	l, err := e.teller.Lock(ctx, w, "u1", false, SubjectEntitlement)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.teller.Tell(ctx, w, l, Change{Type: TypeEntitlementUpdated, Answer: answer{UserID: "u1", Status: "next"}}); err != nil {
		t.Fatal(err)
	}
	pushed := make(chan error, 1)
	go func() { pushed <- e.pusher.push(ctx, heads[0]) }()
	// The record waits for the writer's lock.
	var waiting int
	for ; waiting == 0; time.Sleep(time.Millisecond) {
		// The statement's start: pg_stat_activity keeps only its first kilobyte.
		if err := e.db.Raw(`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'WITH held AS%'`).Row().Scan(&waiting); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Commit().Error; err != nil {
		t.Fatal(err)
	}
	if err := <-pushed; err != nil {
		t.Fatal(err)
	}
	if at := e.dueAt(t, "u1"); at == nil {
		t.Fatal("the user is not due with an event pending")
	}
	if e.step(t) != 1 || len(e.app.sequences()) != 2 {
		t.Fatalf("the app got %v, want 1 2", e.app.sequences())
	}
}
