package notices

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	"billing/internal/mail"
	"billing/internal/testenv"
	"billing/migrations"
)

func TestMain(m *testing.M) { testenv.MainWith(m, migrations.ApplyQuietly) }

// at is an instant of the tests' fixed timeline (testenv.Base plus sec seconds).
var at = testenv.At

func ptr[T any](v T) *T { return &v }

type env struct {
	db       *gorm.DB
	enqueuer *Enqueuer
	clock    *testenv.Clock // the enqueuer's and the sender's
}

// newEnv gives a test its own migrated database and an Enqueuer on it, on a clock at at(0).
func newEnv(t *testing.T) *env {
	t.Helper()
	c := testenv.NewClock(at(0))
	return &env{db: testenv.DB(t), clock: c, enqueuer: NewEnqueuer(EnqueuerConfig{Now: c.Now})}
}

// sender is a Sender on the test's database and clock that sends with send (nil: mail not
// configured, so notices are logged).
func (e *env) sender(logger *slog.Logger, send func(ctx context.Context, cfg mail.Config, to string, msg []byte) error) *Sender {
	cfg := mail.Config{}
	if send != nil {
		cfg = mail.Config{SMTPURL: "smtp://127.0.0.1:1", From: "billing@example.com"}
	}
	s := NewSender(SenderConfig{DB: e.db, Mail: cfg, Logger: logger, Now: e.clock.Now})
	if send != nil {
		s.send = send
	}
	return s
}

// sendDue runs one SendDue and returns how many notices it took.
func (e *env) sendDue(t *testing.T, s *Sender) int {
	t.Helper()
	n, err := s.SendDue(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return n
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
	testenv.LinkCustomer(t, e.db, userID, customerID, email, false)
}

// content is what the notice of an event and kind will say, as stored in its row.
func (e *env) content(t *testing.T, eventID, kind string) Args {
	t.Helper()
	var raw []string
	e.db.Raw(`SELECT content::text FROM notices WHERE event_id = $1 AND kind = $2`, eventID, kind).Scan(&raw)
	if len(raw) != 1 {
		t.Fatalf("%d notices for %s/%s", len(raw), eventID, kind)
	}
	var a Args
	if err := json.Unmarshal([]byte(raw[0]), &a); err != nil {
		t.Fatal(err)
	}
	return a
}

// queued is the notice of an event's state in the queue: its due time (nil: not queued),
// attempts and last error.
type queued struct {
	NextAttemptAt *time.Time
	Attempts      int
	LastError     *string
}

func (e *env) queued(t *testing.T, eventID string) queued {
	t.Helper()
	var rows []queued
	e.db.Raw(`SELECT next_attempt_at, attempts, last_error FROM notices WHERE event_id = $1`, eventID).Scan(&rows)
	if len(rows) != 1 {
		t.Fatalf("%d notices for %s", len(rows), eventID)
	}
	return rows[0]
}

// count is the number of notices rows of an event and kind.
func (e *env) count(t *testing.T, eventID, kind string) int {
	t.Helper()
	var n int
	if err := e.db.Raw(`SELECT count(*) FROM notices WHERE event_id = $1 AND kind = $2`, eventID, kind).Scan(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n
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
