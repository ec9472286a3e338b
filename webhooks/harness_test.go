package webhooks_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"gorm.io/gorm"

	"billing/internal/auth"
	"billing/internal/httpserver"
	"billing/internal/jobs"
	"billing/internal/stripeevents"
	"billing/internal/testenv"
	"billing/migrations"
	"billing/webhooks"
)

func TestMain(m *testing.M) {
	testenv.SetMigrator(migrations.ApplyQuietly)
	testenv.Main(m)
}

const (
	testSecret    = "whsec_test_current"
	testSecretOld = "whsec_test_previous"
	liveSecret    = "whsec_live_current"
	adminToken    = "admin-token"
	appToken      = "app-token"
	effectType    = "customer.subscription.updated"
	failingType   = "invoice.payment_failed"
	// permanentType's handler always fails with an error no retry can mend.
	permanentType = "charge.dispute.created"
	// blockingType's handler, while hold is set, says it arrived and waits for its release.
	blockingType = "charge.refunded"
	// killerType's handler ends its own database connection: a process gone mid-transaction.
	killerType = "charge.dispute.closed"
	// lockingType's handler locks the row 'lock_target' of test_effects as handlers lock theirs.
	lockingType = "charge.dispute.updated"
)

// harness is one inbox on its own database, with two handlers: effectType records its effect in
// test_effects (incrementing a counter, so a double application shows), and failingType fails
// while failures > 0.
type harness struct {
	t        *testing.T
	db       *gorm.DB
	inbox    *webhooks.Inbox
	e        *echo.Echo
	river    *river.Client[*sql.Tx]
	clock    *testenv.Clock
	failures atomic.Int64
	metrics  *prometheus.Registry
	// hold, when set, blocks blockingType's handler: arrived is sent to, then release read.
	hold *holdGate
}

type holdGate struct{ arrived, release chan struct{} }

func newHarness(t *testing.T) *harness {
	t.Helper()
	return build(t, effectsDB(t), []string{testSecret, testSecretOld}, []string{liveSecret})
}

// effectsDB is a test database with the table the harness's handlers write their effects to.
func effectsDB(t *testing.T) *gorm.DB {
	t.Helper()
	db := testenv.DB(t)
	if err := db.Exec(`CREATE TABLE test_effects (event_id text PRIMARY KEY, applied integer NOT NULL)`).Error; err != nil {
		t.Fatalf("create test_effects: %v", err)
	}
	return db
}

// newInlineHarness is a harness whose inbox applies events in their receive transaction, with
// group commit on as the service has it.
func newInlineHarness(t *testing.T, options ...func(*webhooks.Config)) *harness {
	t.Helper()
	return build(t, effectsDB(t), []string{testSecret}, nil, append([]func(*webhooks.Config){func(c *webhooks.Config) {
		c.ApplyInline = true
		c.GroupCommit = 16 // as served
	}}, options...)...)
}

// newHarnessWithSecrets is a harness with other webhook secrets.
func newHarnessWithSecrets(t *testing.T, test, live []string) *harness {
	t.Helper()
	return build(t, testenv.DB(t), test, live)
}

// newHarnessOn is a harness on a given (possibly unreachable) database.
func newHarnessOn(t *testing.T, db *gorm.DB) *harness {
	t.Helper()
	return build(t, db, []string{testSecret}, nil)
}

func build(t *testing.T, db *gorm.DB, testSecrets, liveSecrets []string, options ...func(*webhooks.Config)) *harness {
	t.Helper()
	h := &harness{t: t, db: db, clock: testenv.NewClock(time.Now())}
	logger := slog.New(slog.DiscardHandler)
	reg := webhooks.NewRegistry()
	reg.Register(effectType, webhooks.HandlerFunc(func(ctx context.Context, tx *gorm.DB, ev webhooks.Event) error {
		return tx.Exec(`INSERT INTO test_effects VALUES ($1, 1) ON CONFLICT (event_id) DO UPDATE SET applied = test_effects.applied + 1`, ev.ID).Error
	}))
	reg.Register(failingType, webhooks.HandlerFunc(func(ctx context.Context, tx *gorm.DB, ev webhooks.Event) error {
		if h.failures.Load() > 0 {
			h.failures.Add(-1)
			return errTest
		}
		return tx.Exec(`INSERT INTO test_effects VALUES ($1, 1) ON CONFLICT (event_id) DO UPDATE SET applied = test_effects.applied + 1`, ev.ID).Error
	}))
	reg.Register(permanentType, webhooks.HandlerFunc(func(ctx context.Context, tx *gorm.DB, ev webhooks.Event) error {
		return webhooks.Permanent(errTest)
	}))
	reg.Register(blockingType, webhooks.HandlerFunc(func(ctx context.Context, tx *gorm.DB, ev webhooks.Event) error {
		if g := h.hold; g != nil {
			g.arrived <- struct{}{}
			<-g.release
		}
		return tx.Exec(`INSERT INTO test_effects VALUES ($1, 1) ON CONFLICT (event_id) DO UPDATE SET applied = test_effects.applied + 1`, ev.ID).Error
	}))
	reg.Register(lockingType, webhooks.HandlerFunc(func(ctx context.Context, tx *gorm.DB, ev webhooks.Event) error {
		if err := tx.Exec(`SELECT 1 FROM test_effects WHERE event_id = 'lock_target' ` + webhooks.LockRows(ctx)).Error; err != nil {
			return err
		}
		return tx.Exec(`INSERT INTO test_effects VALUES ($1, 1) ON CONFLICT (event_id) DO UPDATE SET applied = test_effects.applied + 1`, ev.ID).Error
	}))
	reg.Register(killerType, webhooks.HandlerFunc(func(ctx context.Context, tx *gorm.DB, ev webhooks.Event) error {
		return tx.Exec(`SELECT pg_terminate_backend(pg_backend_pid())`).Error
	}))
	cfg := webhooks.Config{
		DB: db, Logger: logger, Registry: reg,
		TestSecrets: testSecrets,
		LiveSecrets: liveSecrets,
		Tolerance:   5 * time.Minute,
		MaxAttempts: 3,
		RetryDelay:  time.Millisecond,
		Now:         h.clock.Now,
	}
	h.metrics = prometheus.NewRegistry()
	cfg.Metrics = webhooks.NewMetrics(h.metrics)
	for _, o := range options {
		o(&cfg)
	}
	h.inbox = webhooks.New(cfg)
	workers := river.NewWorkers()
	h.inbox.AddWorkers(workers)
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	h.river, err = jobs.NewClient(sqlDB, jobs.ClientOptions{
		Workers:      workers,
		Queues:       map[string]int{webhooks.QueueWebhooks: 8},
		PollInterval: 10 * time.Millisecond,
		Logger:       logger,
		TestOnly:     true,
	})
	if err != nil {
		t.Fatalf("river client: %v", err)
	}
	h.inbox.SetJobs(h.river)
	h.e = httpserver.New(httpserver.Options{Logger: logger, Registry: prometheus.NewRegistry(), Ready: func(context.Context) error { return nil }})
	h.inbox.MountWebhook(h.e)
	tokens := auth.New([]string{appToken}, []string{adminToken})
	h.inbox.MountAdmin(h.e.Group("/admin", tokens.Require(auth.RoleAdmin, true)))
	return h
}

var errTest = &testError{}

type testError struct{}

func (*testError) Error() string { return "handler failed on purpose" }

// start runs the workers until the test ends.
func (h *harness) start() {
	h.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	if err := h.river.Start(ctx); err != nil {
		h.t.Fatalf("start river: %v", err)
	}
	h.t.Cleanup(func() {
		stopCtx, stop := context.WithTimeout(context.Background(), 10*time.Second)
		defer stop()
		_ = h.river.Stop(stopCtx)
		cancel()
	})
}

type answer struct {
	Status int
	Body   map[string]any
}

func (a answer) errorCode() string {
	e, _ := a.Body["error"].(map[string]any)
	s, _ := e["code"].(string)
	return s
}

func (h *harness) post(payload []byte, header string) answer {
	h.t.Helper()
	req := httptest.NewRequest(http.MethodPost, "/webhooks/stripe", bytes.NewReader(payload))
	if header != "" {
		req.Header.Set("Stripe-Signature", header)
	}
	rec := httptest.NewRecorder()
	h.e.ServeHTTP(rec, req)
	var body map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		h.t.Fatalf("answer is not JSON (%d): %q", rec.Code, rec.Body.String())
	}
	return answer{rec.Code, body}
}

// deliver signs payload with the current test secret at the harness's clock and posts it.
func (h *harness) deliver(payload []byte) answer {
	h.t.Helper()
	return h.post(payload, stripeevents.SignatureHeader(payload, testSecret, h.clock.Now()))
}

func (h *harness) admin(method, path, token string) answer {
	h.t.Helper()
	req := httptest.NewRequest(method, path, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	h.e.ServeHTTP(rec, req)
	var body map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		h.t.Fatalf("answer is not JSON (%d): %q", rec.Code, rec.Body.String())
	}
	return answer{rec.Code, body}
}

type eventRow struct {
	Status        string
	Attempts      int
	FailureReason *string
}

func (h *harness) event(id string) (eventRow, bool) {
	h.t.Helper()
	var rows []eventRow
	if err := h.db.Raw(`SELECT status, attempts, failure_reason FROM webhook_events WHERE event_id = $1`, id).Scan(&rows).Error; err != nil {
		h.t.Fatalf("load event: %v", err)
	}
	if len(rows) == 0 {
		return eventRow{}, false
	}
	return rows[0], true
}

// waitStatus polls until the event has status want; the deadline only bounds a failing test.
func (h *harness) waitStatus(id, want string) eventRow {
	h.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		row, _ := h.event(id)
		if row.Status == want {
			return row
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("event %s: status %q, want %q", id, row.Status, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitCount polls until the count query returns want; the deadline only bounds a failing test.
func (h *harness) waitCount(sql string, want int) {
	h.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		n := h.count(sql)
		if n == want {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("%s: %d, want %d", sql, n, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (h *harness) count(sql string, args ...any) int {
	h.t.Helper()
	var n int
	if err := h.db.Raw(sql, args...).Scan(&n).Error; err != nil {
		h.t.Fatalf("count: %v", err)
	}
	return n
}

func (h *harness) applied(id string) int {
	return h.count(`SELECT coalesce(sum(applied), 0) FROM test_effects WHERE event_id = $1`, id)
}

func subEvent(id string, created time.Time) []byte {
	return stripeevents.SubscriptionEvent(id, effectType, created, false, stripeevents.Subscription{
		ID: "sub_" + id, Customer: "cus_1", Status: "active", PriceID: "price_1",
	})
}

// deliverConcurrently posts payload n times at once and counts the answers: received, duplicate,
// and any other answer, each reported as an error.
func (h *harness) deliverConcurrently(payload []byte, n int) (received, duplicate int) {
	h.t.Helper()
	results := make(chan answer, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			results <- h.deliver(payload)
		}()
	}
	close(start)
	wg.Wait()
	close(results)
	for r := range results {
		switch {
		case r.Status == 200 && r.Body["status"] == "received":
			received++
		case r.Status == 200 && r.Body["status"] == "duplicate":
			duplicate++
		default:
			h.t.Errorf("unexpected answer %d %v", r.Status, r.Body)
		}
	}
	return received, duplicate
}
