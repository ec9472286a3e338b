package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"billing/internal/testenv"
)

// eventsEnv is a fresh migrated database that runEventsCommand finds through the environment,
// as a deployment configures it, and the same database for inserting rows.
func eventsEnv(t *testing.T) *sql.DB {
	t.Helper()
	dbURL := testenv.DatabaseURL(t)
	for k, v := range map[string]string{
		"BILLING_CONFIG":       "",
		"BILLING_DATABASE_URL": dbURL,
		"BILLING_STRIPE_MODE":  "test",
		"BILLING_LOG_LEVEL":    "error",
	} {
		t.Setenv(k, v)
	}
	db, err := sql.Open("pgx", dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// insertEvent writes an app_events row as the teller would (n by default, feed_pos left to the
// feed), created at created.
func insertEvent(t *testing.T, db *sql.DB, id, user string, livemode bool, seq int, typ, subject string, created time.Time, data string) {
	t.Helper()
	if _, err := db.Exec(`INSERT INTO app_events (id, user_id, livemode, sequence, type, subject, created_at, data)
		VALUES ($1, $2, $3, $4, $5, $6, $7, CAST($8 AS jsonb))`, id, user, livemode, seq, typ, subject, created, data); err != nil {
		t.Fatalf("insert %s: %v", id, err)
	}
}

func runEvents(ctx context.Context, t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := runEventsCommand(ctx, args, &out, &errOut)
	t.Logf("billing events %s: exit %d\nstdout: %sstderr: %s", strings.Join(args, " "), code, out.String(), errOut.String())
	return code, out.String(), errOut.String()
}

// billing events tail: a line per event of stripe.mode in feed order (the other mode's never),
// what the app reads of each type; --after, --limit and --json; an unknown --after is one line
// and exit 2, as is a database that cannot be opened.
func TestEventsTailPrintsTheFeed(t *testing.T) {
	db := eventsEnv(t)
	at := time.Date(2026, 12, 7, 11, 0, 0, 0, time.UTC)
	insertEvent(t, db, "aevt_1", "u_1", false, 1, "entitlement.updated", "entitlement", at,
		`{"user_id":"u_1","entitled":true,"status":"active","quantity":3,"previous":{"status":"none","entitled":false,"quantity":null}}`)
	insertEvent(t, db, "aevt_live", "u_1", true, 1, "entitlement.updated", "entitlement", at,
		`{"user_id":"u_1","entitled":true,"status":"active","previous":{"entitled":false}}`)
	insertEvent(t, db, "aevt_2", "u_2", false, 1, "charge.updated", "charge:order_9", at.Add(time.Second),
		`{"order_id":"order_9","status":"succeeded","amount":2500,"currency":"usd","amount_refunded":500,"livemode":false}`)
	insertEvent(t, db, "aevt_3", "u_1", false, 2, "usage.needs_review", "usage:use_4", at.Add(2*time.Second),
		`{"usage_id":"use_4","meter":"api_calls","value":12,"status":"needs_review","identifier":"use_4"}`)

	code, out, errOut := runEvents(context.Background(), t, "tail", "--follow=false")
	want := "2026-12-07T11:00:00Z aevt_1 entitlement.updated user=u_1 seq=1 entitled=true status=active changed=entitled,quantity,status\n" +
		"2026-12-07T11:00:01Z aevt_2 charge.updated user=u_2 seq=1 order_id=order_9 status=succeeded amount_refunded=500\n" +
		"2026-12-07T11:00:02Z aevt_3 usage.needs_review user=u_1 seq=2 usage_id=use_4 meter=api_calls status=needs_review\n"
	if code != 0 || out != want || errOut != "" {
		t.Fatalf("tail: exit %d\nstdout:\n%swant:\n%sstderr: %q", code, out, want, errOut)
	}

	code, out, _ = runEvents(context.Background(), t, "tail", "--follow=false", "--after", "aevt_1")
	if lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n"); code != 0 || len(lines) != 2 ||
		!strings.Contains(lines[0], " aevt_2 ") || !strings.Contains(lines[1], " aevt_3 ") {
		t.Errorf("--after aevt_1: exit %d, %q", code, out)
	}

	code, out, _ = runEvents(context.Background(), t, "tail", "--follow=false", "--after", "aevt_1", "--limit", "1", "--json")
	var body struct {
		ID       string         `json:"id"`
		Type     string         `json:"type"`
		Created  int64          `json:"created"`
		Livemode bool           `json:"livemode"`
		UserID   string         `json:"user_id"`
		Sequence int64          `json:"sequence"`
		Data     map[string]any `json:"data"`
	}
	if code != 0 || strings.Count(out, "\n") != 1 {
		t.Fatalf("--after --limit 1 --json: exit %d, %q", code, out)
	}
	if err := json.Unmarshal([]byte(out), &body); err != nil {
		t.Fatalf("--json line %q: %v", out, err)
	}
	if body.ID != "aevt_2" || body.Type != "charge.updated" || body.Created != at.Unix()+1 || body.Livemode ||
		body.UserID != "u_2" || body.Sequence != 1 || body.Data["order_id"] != "order_9" || body.Data["amount_refunded"] != float64(500) {
		t.Errorf("--json body %+v", body)
	}

	// An id of no event, or of the other mode's: one line naming it, exit 2, nothing printed.
	for _, id := range []string{"aevt_nothing", "aevt_live"} {
		code, out, errOut = runEvents(context.Background(), t, "tail", "--follow=false", "--after", id)
		if code != 2 || out != "" || errOut != "billing events tail: --after "+id+" names no app event of test mode\n" {
			t.Errorf("--after %s: exit %d, stdout %q, stderr %q", id, code, out, errOut)
		}
	}

	if code, out, _ := runEvents(context.Background(), t, "tail", "-h"); code != 0 || !strings.Contains(out, "usage: billing events tail") {
		t.Errorf("tail -h: exit %d, %q", code, out)
	}
	if code, _, errOut := runEvents(context.Background(), t, "list"); code != 2 || !strings.Contains(errOut, "the one subcommand is tail") {
		t.Errorf("an unknown subcommand: exit %d, %q", code, errOut)
	}
	if code, _, errOut := runEvents(context.Background(), t, "tail", "--limit", "-1"); code != 2 || strings.Count(errOut, "\n") != 1 {
		t.Errorf("--limit -1: exit %d, %q", code, errOut)
	}

	t.Setenv("BILLING_STRIPE_MODE", "staging")
	if code, _, errOut := runEvents(context.Background(), t, "tail", "--follow=false"); code != 2 ||
		strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, "stripe.mode") {
		t.Errorf("a bad stripe.mode: exit %d, stderr %q", code, errOut)
	}
	t.Setenv("BILLING_STRIPE_MODE", "test")
	missing, err := url.Parse(testenv.AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	missing.Path = "/no_such_database_here"
	t.Setenv("BILLING_DATABASE_URL", missing.String())
	if code, out, errOut := runEvents(context.Background(), t, "tail", "--follow=false"); code != 2 || out != "" ||
		errOut != "billing events tail: cannot open the database (see the log line above)\n" {
		t.Errorf("a database that does not exist: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

// lineWriter hands each complete line written to lines.
type lineWriter struct {
	mu    sync.Mutex
	part  []byte
	lines chan string
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.part = append(w.part, p...)
	for {
		i := bytes.IndexByte(w.part, '\n')
		if i < 0 {
			return len(p), nil
		}
		w.lines <- string(w.part[:i])
		w.part = w.part[i+1:]
	}
}

// Following: the first page, then an event written after it, then a stop (SIGINT's context)
// that ends the tail with exit 0.
func TestEventsTailFollowsNewEvents(t *testing.T) {
	db := eventsEnv(t)
	at := time.Date(2026, 12, 7, 11, 0, 0, 0, time.UTC)
	insertEvent(t, db, "aevt_first", "u_1", false, 1, "entitlement.updated", "entitlement", at,
		`{"user_id":"u_1","entitled":true,"status":"active","previous":{"entitled":false,"status":"none"}}`)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &lineWriter{lines: make(chan string, 16)}
	var errOut bytes.Buffer
	done := make(chan int, 1)
	go func() { done <- runEventsCommand(ctx, []string{"tail"}, out, &errOut) }()
	next := func(what string) string {
		t.Helper()
		select {
		case l := <-out.lines:
			return l
		case code := <-done:
			t.Fatalf("tail ended (exit %d, stderr %q) before %s", code, errOut.String(), what)
		case <-time.After(30 * time.Second): // a guard against a hang, not a synchronisation
			t.Fatalf("no line for %s in 30 s", what)
		}
		return ""
	}
	if l := next("the first page"); !strings.Contains(l, " aevt_first ") {
		t.Fatalf("first line %q, want aevt_first", l)
	}
	insertEvent(t, db, "aevt_next", "u_1", false, 2, "entitlement.updated", "entitlement", at.Add(time.Minute),
		`{"user_id":"u_1","entitled":false,"status":"canceled","previous":{"entitled":true,"status":"active"}}`)
	if l := next("the event written after it"); l != "2026-12-07T11:01:00Z aevt_next entitlement.updated user=u_1 seq=2 entitled=false status=canceled changed=entitled,status" {
		t.Fatalf("followed line %q", l)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("tail stopped with exit %d, stderr %q", code, errOut.String())
	}
	select {
	case l := <-out.lines:
		t.Errorf("a line after the last event: %q", l)
	default:
	}
}
