package billingtest

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"gorm.io/gorm"

	"billing/notices"
	"billing/webhooks"
)

// Handle applies ev with its handler in reg in a transaction of its own, as the webhook worker
// does.
func Handle(t testing.TB, db *gorm.DB, reg *webhooks.Registry, ev webhooks.Event) error {
	t.Helper()
	h, ok := reg.Lookup(ev.Type)
	if !ok {
		t.Fatalf("no handler registered for %s", ev.Type)
	}
	return db.Transaction(func(tx *gorm.DB) error { return h.HandleEvent(context.Background(), tx, ev) })
}

// MustHandle applies events in order and stops the test on any error.
func MustHandle(t testing.TB, db *gorm.DB, reg *webhooks.Registry, evs ...webhooks.Event) {
	t.Helper()
	for _, ev := range evs {
		if err := Handle(t, db, reg, ev); err != nil {
			t.Fatalf("handle %s %s: %v", ev.Type, ev.ID, err)
		}
	}
}

// CountSubscriptions counts the subscriptions rows of both modes.
func CountSubscriptions(t testing.TB, db *gorm.DB) int {
	t.Helper()
	var n int64
	if err := db.Raw(`SELECT count(*) FROM subscriptions /* all modes */`).Scan(&n).Error; err != nil {
		t.Fatal(err)
	}
	return int(n)
}

// Link links userID to the test-mode Stripe customer customerID ("": no customer yet), or
// re-links it: unlike testenv.LinkCustomer, the state machine's tests move a user between
// customers and link users before they have one.
func Link(t testing.TB, db *gorm.DB, userID, customerID, email string) {
	t.Helper()
	var customer *string
	if customerID != "" {
		customer = &customerID
	}
	if err := db.Exec(`INSERT INTO customers (user_id, stripe_customer_id, email, livemode) VALUES ($1, $2, $3, false)
		ON CONFLICT (user_id, livemode) DO UPDATE SET stripe_customer_id = EXCLUDED.stripe_customer_id, email = EXCLUDED.email`,
		userID, customer, email).Error; err != nil {
		t.Fatalf("link %s: %v", userID, err)
	}
}

// NoticeCounts counts the notices rows that where selects, and those of them still to send.
func NoticeCounts(t testing.TB, db *gorm.DB, where string, args ...any) (rows, due int) {
	t.Helper()
	var n struct{ Rows, Due int }
	if err := db.Raw(`/* all modes: the caller's where chooses */
		SELECT count(*) AS rows, count(*) FILTER (WHERE delivery IS NULL AND next_attempt_at IS NOT NULL) AS due
		FROM notices `+where, args...).Scan(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n.Rows, n.Due
}

// NoticeContent is what the one notice of an event and kind will say.
func NoticeContent(t testing.TB, db *gorm.DB, eventID, kind string) notices.Args {
	t.Helper()
	var raw []string
	if err := db.Raw(`/* all modes: an event's notice, whichever its mode */
		SELECT content::text FROM notices WHERE event_id = $1 AND kind = $2`, eventID, kind).Scan(&raw).Error; err != nil {
		t.Fatal(err)
	}
	if len(raw) != 1 {
		t.Fatalf("%d notices for %s/%s", len(raw), eventID, kind)
	}
	var a notices.Args
	if err := json.Unmarshal([]byte(raw[0]), &a); err != nil {
		t.Fatal(err)
	}
	return a
}

// RereadJob is a River job row of the re-read kind.
type RereadJob struct {
	ID          int64     `gorm:"column:id"`
	State       string    `gorm:"column:state"`
	ScheduledAt time.Time `gorm:"column:scheduled_at"`
	Due         int64     `gorm:"column:due"`
	Tie         int64     `gorm:"column:tie"`
	MaxAttempts int       `gorm:"column:max_attempts"`
}

// RereadJobs are the River jobs of kind (billing.RereadJobKind) queued for a subscription, oldest
// first.
func RereadJobs(t testing.TB, db *gorm.DB, kind, subscriptionID string) []RereadJob {
	t.Helper()
	var rows []RereadJob
	if err := db.Raw(`SELECT id, state, scheduled_at, max_attempts,
		  coalesce((args->>'due')::bigint, 0) AS due, coalesce((args->>'tie')::bigint, 0) AS tie
		FROM river_job WHERE kind = $1 AND args->>'subscription_id' = $2 ORDER BY id`, kind, subscriptionID).Scan(&rows).Error; err != nil {
		t.Fatalf("re-read jobs of %s: %v", subscriptionID, err)
	}
	return rows
}
