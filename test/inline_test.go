package test

import (
	"context"
	"database/sql"
	"errors"
	"net/http"
	"testing"
	"time"

	"billing/internal/stripeevents"
	"billing/internal/testenv"
)

// The service is SIGKILLed while a delivery is inside its receive transaction (the event applied
// inline, blocked on the subscription's row lock, which the test holds). Nothing of it may
// survive and no 200 may have been sent, so Stripe's redelivery after the restart is stored and
// applied once, with its one notice.
func TestServiceKilledInsideTheReceiveTransaction(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	db := openDB(t, url)
	svc := newService(t, "billing", relEnv(t, url))

	created := time.Now().Add(-10 * 24 * time.Hour).Truncate(time.Second)
	sub := stripeevents.Subscription{
		ID: "sub_inline_kill", Customer: "cus_inline_kill", Status: "trialing", PriceID: "price_monthly",
		TrialStart: created, TrialEnd: created.AddDate(0, 0, 14),
		CurrentPeriodStart: created, CurrentPeriodEnd: created.AddDate(0, 0, 14),
	}
	first := stripeevents.SubscriptionEvent("evt_inline_kill_created", evCreated, created, false, sub)
	twe := created.Add(11 * 24 * time.Hour)
	secondID := "evt_inline_kill_twe"
	second := stripeevents.SubscriptionEvent(secondID, evTrialWillEnd, twe, false, sub)
	if _, err := db.Exec(`INSERT INTO customers (user_id, stripe_customer_id, email) VALUES ('user_inline_kill', 'cus_inline_kill', 'inline@example.com')`); err != nil {
		t.Fatal(err)
	}
	if code, status, err := postEvent(context.Background(), http.DefaultClient, svc.url(""), first); err != nil || code != 200 || status != "received" {
		t.Fatalf("deliver the first event: %d %q %v", code, status, err)
	}
	var st string
	if err := db.QueryRow(`SELECT status FROM webhook_events WHERE event_id = 'evt_inline_kill_created'`).Scan(&st); err != nil || st != "processed" {
		t.Fatalf("first event right after its 200: %q %v, want processed", st, err)
	}

	rowLock := lockSubscriptionRow(t, db, sub.ID)
	type answer struct {
		code int
		err  error
	}
	answered := make(chan answer, 1)
	go func() {
		code, _, err := postEvent(context.Background(), http.DefaultClient, svc.url(""), second)
		answered <- answer{code, err}
	}()
	if !waitUntil(time.Minute, rowLock.waitedOn) {
		t.Fatalf("no receive transaction blocked on the subscription row")
	}
	svc.kill()
	a := <-answered
	if a.err == nil && a.code == http.StatusOK {
		t.Fatalf("the delivery killed inside its transaction was answered 200")
	}
	rowLock.release()
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM webhook_events WHERE event_id = $1`, secondID).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d rows of the killed delivery's event (%v), want 0: nothing of it may survive", n, err)
	}

	svc.start()
	if code, status, err := postEvent(context.Background(), http.DefaultClient, svc.url(""), second); err != nil || code != 200 || status != "received" {
		t.Fatalf("redelivery after the restart: %d %q %v, want 200 received", code, status, err)
	}
	var attempts int
	if err := db.QueryRow(`SELECT status, attempts FROM webhook_events WHERE event_id = $1`, secondID).Scan(&st, &attempts); err != nil {
		t.Fatal(err)
	}
	if st != "processed" || attempts != 1 {
		t.Errorf("redelivered event: %s after %d attempts, want processed after 1", st, attempts)
	}
	var twEnd sql.NullTime
	if err := db.QueryRow(`SELECT trial_will_end_at FROM subscriptions WHERE subscription_id = $1`, sub.ID).Scan(&twEnd); err != nil {
		t.Fatal(err)
	}
	if !twEnd.Valid || !twEnd.Time.Equal(twe) {
		t.Errorf("trial_will_end_at %v, want %s", twEnd, twe)
	}
	var notices int
	if err := db.QueryRow(`SELECT count(*) FROM notices WHERE event_id = $1 AND kind = 'trial_will_end'`, secondID).Scan(&notices); err != nil && !errors.Is(err, sql.ErrNoRows) {
		t.Fatal(err)
	}
	if notices != 1 {
		t.Errorf("%d trial_will_end notices, want exactly 1", notices)
	}
}
