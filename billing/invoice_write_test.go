package billing

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"gorm.io/gorm"

	"billing/webhooks"
)

// The SQL that keeps a hold's start when an invoice fails again agrees with the Go rule the reads
// use, over every combination of what the rule looks at.
func TestHoldInForceIsPaymentHoldInForce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	t1, t2 := at(100), at(200)
	times := []*time.Time{nil, &t1, &t2}
	reasons := []*string{nil, ptr("subscription_create"), ptr("subscription_cycle")}
	statuses := []string{StatusActive, StatusTrialing, StatusPastDue, StatusUnpaid, StatusIncomplete, StatusIncompleteExpired, StatusCanceled}
	checked := 0
	for _, hold := range []bool{false, true} {
		for _, reason := range reasons {
			for _, status := range statuses {
				for _, subAt := range times {
					for _, invAt := range times {
						sub := Subscription{Status: status, PaymentHold: hold, PaymentHoldBillingReason: reason,
							SubEventCreated: subAt, InvEventCreated: invAt}
						var got bool
						err := e.db.WithContext(context.Background()).Raw(`SELECT coalesce((`+holdInForce+`), false)
							FROM (VALUES (CAST($1 AS boolean), CAST($2 AS text), CAST($3 AS text), CAST($4 AS timestamptz), CAST($5 AS timestamptz)))
							  AS v(payment_hold, payment_hold_billing_reason, status, sub_event_created, inv_event_created)`,
							hold, reason, status, subAt, invAt).Row().Scan(&got)
						if err != nil {
							t.Fatal(err)
						}
						if want := sub.paymentHoldInForce(); got != want {
							t.Errorf("%s: SQL says %v, Go %v", describe(sub), got, want)
						}
						checked++
					}
				}
			}
		}
	}
	if checked != 2*3*7*3*3 {
		t.Fatalf("checked %d cases", checked)
	}
}

func describe(s Subscription) string {
	return fmt.Sprintf("hold=%v reason=%s status=%s sub=%s inv=%s", s.PaymentHold, ptrStr(s.PaymentHoldBillingReason), s.Status,
		ptrTime(s.SubEventCreated), ptrTime(s.InvEventCreated))
}

// In a batch of group commit a handler never waits on a row another transaction holds: each
// statement that writes a subscription locks it NOWAIT there, so the batch fails at once (and its
// events are applied alone) instead of holding the lane, whichever path the event takes.
func TestABatchNeverWaitsOnALockedSubscription(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	s := subObj{ID: "sub_lk", Customer: "cus_lk", Status: StatusActive, Price: "p", PeriodStart: 10, PeriodEnd: 30 * 86400}
	inv := invObj{ID: "in_lk", Customer: "cus_lk", Subscription: "sub_lk", Currency: "usd", AmountDue: 500, AttemptCount: 1}
	e.mustHandle(t, created("evt_lk0", 10, s))
	sqlDB, err := e.db.DB()
	if err != nil {
		t.Fatal(err)
	}
	blocker, err := sqlDB.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Rollback()
	if _, err := blocker.Exec(`SELECT 1 FROM subscriptions WHERE subscription_id = 'sub_lk' AND NOT livemode FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	for _, ev := range []webhooks.Event{updated("evt_lk1", 20, s.With(StatusPastDue)), failed("evt_lk2", 30, inv), succeeded("evt_lk3", 40, inv)} {
		h, _ := e.reg.Lookup(ev.Type)
		done := make(chan error, 1)
		go func() {
			done <- e.db.Transaction(func(tx *gorm.DB) error { return h.HandleEvent(webhooks.InBatch(context.Background()), tx, ev) })
		}()
		var got error
	wait:
		for {
			select {
			case got = <-done:
				break wait
			default:
			}
			var waiting int
			if err := e.db.Raw(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).
				Scan(&waiting).Error; err != nil {
				t.Fatal(err)
			}
			if waiting > 0 {
				t.Fatalf("%s in a batch waits on the locked subscription", ev.Type)
			}
		}
		var pgErr *pgconn.PgError
		if !errors.As(got, &pgErr) || pgErr.Code != "55P03" {
			t.Errorf("%s in a batch: %v, want the lock refused (55P03)", ev.Type, got)
		}
	}
}
