package notices

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverdatabasesql"
	"github.com/riverqueue/river/rivertype"
	"gorm.io/gorm"

	"billing/internal/testenv"
	"billing/migrations"
)

func TestMain(m *testing.M) {
	testenv.SetMigrator(migrations.ApplyQuietly)
	testenv.Main(m)
}

// base is an arbitrary instant (2024-06-01T00:00:00Z) that times count from.
const base int64 = 1717200000

func at(sec int64) time.Time { return time.Unix(base+sec, 0).UTC() }

func ptr[T any](v T) *T { return &v }

type env struct {
	db       *gorm.DB
	enqueuer *Enqueuer
}

// newEnv gives a test its own migrated database and an Enqueuer on it with an insert-only River
// client.
func newEnv(t *testing.T) *env {
	t.Helper()
	db := testenv.DB(t)
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	rc, err := river.NewClient(riverdatabasesql.New(sqlDB), &river.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatalf("river client: %v", err)
	}
	return &env{db: db, enqueuer: NewEnqueuer(EnqueuerConfig{Jobs: rc, Now: func() time.Time { return at(0) }})}
}

// enqueue runs Enqueue in its own transaction, as an event handler does.
func (e *env) enqueue(t *testing.T, in Input) {
	t.Helper()
	if err := e.db.Transaction(func(tx *gorm.DB) error {
		return e.enqueuer.Enqueue(context.Background(), tx, in)
	}); err != nil {
		t.Fatalf("enqueue %s/%s: %v", in.EventID, in.Kind, err)
	}
}

// link makes userID a test-mode user of customerID with the given email.
func (e *env) link(t *testing.T, userID, customerID, email string) {
	t.Helper()
	err := e.db.Exec(`INSERT INTO customers (user_id, stripe_customer_id, email) VALUES ($1, $2, $3)
		ON CONFLICT (user_id, livemode) DO UPDATE SET stripe_customer_id = EXCLUDED.stripe_customer_id, email = EXCLUDED.email`,
		userID, customerID, email).Error
	if err != nil {
		t.Fatalf("link %s: %v", userID, err)
	}
}

// jobArgs are the arguments of the one queued job of an event and kind. The kind is spelled out,
// not JobKind: jobs queued by earlier builds carry it, and it must not change.
func (e *env) jobArgs(t *testing.T, eventID, kind string) Args {
	t.Helper()
	var raw []string
	e.db.Raw(`SELECT args::text FROM river_job WHERE kind = 'billing_notice' AND args->>'event_id' = $1 AND args->>'kind' = $2`,
		eventID, kind).Scan(&raw)
	if len(raw) != 1 {
		t.Fatalf("%d jobs for %s/%s", len(raw), eventID, kind)
	}
	var a Args
	if err := json.Unmarshal([]byte(raw[0]), &a); err != nil {
		t.Fatal(err)
	}
	return a
}

// counts are the notices rows and River jobs of an event and kind.
func (e *env) counts(t *testing.T, eventID, kind string) (rows, jobs int) {
	t.Helper()
	var n struct {
		NoticeRows int64
		JobRows    int64
	}
	if err := e.db.Raw(`SELECT
		  (SELECT count(*) FROM notices WHERE event_id = $1 AND kind = $2) AS notice_rows,
		  (SELECT count(*) FROM river_job WHERE kind = 'billing_notice' AND args->>'event_id' = $1 AND args->>'kind' = $2) AS job_rows`,
		eventID, kind).Scan(&n).Error; err != nil {
		t.Fatal(err)
	}
	return int(n.NoticeRows), int(n.JobRows)
}

func (e *env) work(t *testing.T, w *Worker, eventID, kind string) error {
	t.Helper()
	args := e.jobArgs(t, eventID, kind)
	return w.Work(context.Background(), &river.Job[Args]{JobRow: &rivertype.JobRow{}, Args: args})
}

func (e *env) delivery(t *testing.T, eventID string) (delivery, recipient string, sent bool) {
	t.Helper()
	var rows []struct {
		Delivery  *string
		Recipient string
		Sent      bool
	}
	e.db.Raw(`SELECT delivery, recipient, sent_at IS NOT NULL AS sent FROM notices WHERE event_id = $1`, eventID).Scan(&rows)
	if len(rows) != 1 {
		t.Fatalf("%d notices for %s", len(rows), eventID)
	}
	if rows[0].Delivery != nil {
		delivery = *rows[0].Delivery
	}
	return delivery, rows[0].Recipient, rows[0].Sent
}

// lockWaiters counts the backends of this test's database that wait on a lock.
func (e *env) lockWaiters(t *testing.T) int {
	t.Helper()
	var n int
	if err := e.db.Raw(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).
		Scan(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Notices as billing's handlers enqueue them.
var (
	trialNotice = Input{EventID: "evt_t", Kind: KindTrialWillEnd, SubscriptionID: "sub_t", StripeCustomerID: "cus_t",
		TrialEnd: ptr(at(3 * 86400))}
	paymentNotice = Input{EventID: "evt_f", Kind: KindPaymentFailed, SubscriptionID: "sub_1", StripeCustomerID: "cus_1",
		InvoiceID: "in_1", AmountDue: ptr(int64(2000)), Currency: "usd", HostedInvoiceURL: "https://invoice.stripe.com/i/in_1",
		NextPaymentAttempt: ptr(at(86400)), AttemptCount: 1}
)
