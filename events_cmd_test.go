package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"gorm.io/gorm"

	"billing/appevents"
	"billing/internal/apitest"
	"billing/internal/database"
	"billing/internal/testenv"
)

// tellTest writes an entitlement.updated of user with status in a transaction of its own.
func tellTest(t *testing.T, db *gorm.DB, user, status string) *appevents.Body {
	t.Helper()
	tl := appevents.NewTeller(nil)
	var b *appevents.Body
	err := db.Transaction(func(tx *gorm.DB) error {
		l, err := tl.Lock(context.Background(), tx, user, false, appevents.SubjectEntitlement)
		if err != nil {
			return err
		}
		b, err = tl.Tell(context.Background(), tx, l, appevents.Change{Type: appevents.TypeEntitlementUpdated, WithPrevious: true,
			Baseline: json.RawMessage(`{"user_id":"` + user + `","entitled":false,"status":"none"}`),
			Answer:   map[string]any{"user_id": user, "entitled": status == "active", "status": status}})
		return err
	})
	if err != nil || b == nil {
		t.Fatalf("tell %s %s: %v (%v)", user, status, b, err)
	}
	return b
}

func TestEventsTailPrintsTheFeed(t *testing.T) {
	url := testenv.DatabaseURL(t)
	t.Setenv("BILLING_CONFIG", "")
	t.Setenv("BILLING_DATABASE_URL", url)
	t.Setenv("BILLING_LOG_LEVEL", "error")
	db, err := database.Open(context.Background(), url, apitest.Logger(t, slog.LevelWarn))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = database.SQL(db).Close() })
	first := tellTest(t, db, "u1", "active")
	second := tellTest(t, db, "u2", "trialing")
	third := tellTest(t, db, "u1", "past_due")

	run := func(args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		code := runEventsCommand(context.Background(), args, &out, &errOut)
		return code, out.String(), errOut.String()
	}
	code, out, errOut := run("tail", "--follow=false")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 3 {
		t.Fatalf("tail: exit %d, %d lines:\n%s\nstderr: %s", code, len(lines), out, errOut)
	}
	for k, want := range []string{
		first.ID + " entitlement.updated user=u1 seq=1 entitled=true status=active changed=entitled,status",
		second.ID + " entitlement.updated user=u2 seq=1 entitled=false status=trialing changed=status",
		third.ID + " entitlement.updated user=u1 seq=2 entitled=false status=past_due changed=entitled,status",
	} {
		if !strings.HasSuffix(lines[k], want) {
			t.Errorf("line %d = %q, want it to end with %q", k, lines[k], want)
		}
	}
	if code, out, _ := run("tail", "--follow=false", "--after", first.ID, "--limit", "1", "--json"); code != 0 ||
		!strings.Contains(out, `"id":"`+second.ID+`"`) || strings.Count(out, "\n") != 1 {
		t.Errorf("--after --limit --json: exit %d, %q", code, out)
	}
	if code, _, errOut := run("tail", "--follow=false", "--after", "aevt_nothing"); code != 2 || !strings.Contains(errOut, "names no app event") {
		t.Errorf("an unknown --after: exit %d, stderr %q", code, errOut)
	}
	if code, _, _ := run("list"); code != 2 {
		t.Errorf("an unknown subcommand: exit %d", code)
	}
}

// lineWriter signals each line written.
type lineWriter struct {
	mu    sync.Mutex
	b     bytes.Buffer
	lines chan string
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b.Write(p)
	for _, l := range strings.SplitAfter(string(p), "\n") {
		if strings.HasSuffix(l, "\n") {
			w.lines <- strings.TrimSuffix(l, "\n")
		}
	}
	return len(p), nil
}

func TestEventsTailFollowsNewEvents(t *testing.T) {
	db := testenv.DB(t)
	first := tellTest(t, db, "u1", "active")
	ctx, cancel := context.WithCancel(context.Background())
	w := &lineWriter{lines: make(chan string, 16)}
	done := make(chan error, 1)
	go func() { done <- tailEvents(ctx, db, false, tailOptions{Follow: true}, w) }()
	if l := <-w.lines; !strings.Contains(l, first.ID) {
		t.Fatalf("first line %q, want %s", l, first.ID)
	}
	next := tellTest(t, db, "u1", "canceled")
	if l := <-w.lines; !strings.Contains(l, next.ID) || !strings.Contains(l, "seq=2") {
		t.Fatalf("followed line %q, want %s with seq=2", l, next.ID)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("tail stopped with %v", err)
	}
}
