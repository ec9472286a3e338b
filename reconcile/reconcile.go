// Package reconcile keeps the local subscription state true to Stripe when webhooks were not
// enough: it lists every subscription of the account (one mode: the secret key's), compares each
// with the local row field by field, and repairs what differs by applying the subscription as a
// snapshot through the code that applies events (billing.Service.ApplySnapshot), so that holds,
// terminal states and the entitlement behave as if the missed event had arrived. Customers whose
// metadata.user_id names a user are linked to that user. On an empty database a run is the
// backfill of an existing account.
//
// A run is `billing reconcile`, the periodic job of `serve` (reconcile.interval), or
// POST /admin/reconcile. One run per mode at a time across every process: a run holds a
// PostgreSQL advisory lock for its whole length. Runs and what they found are recorded in
// reconcile_runs and reconcile_drift, and counted in Prometheus metrics.
package reconcile

import (
	"context"
	"crypto/rand"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stripe/stripe-go/v79/client"
	"gorm.io/gorm"

	"billing/billing"
	"billing/entitlements"
	"billing/internal/audit"
	"billing/internal/database"
	"billing/internal/stripeclient"
)

// Subscriptions is the local subscription state: billing.Service.
type Subscriptions interface {
	// Subscriptions reads the local rows of a page's ids in one query.
	Subscriptions(ctx context.Context, subscriptionIDs []string, livemode bool) (map[string]*billing.Subscription, error)
	ApplySnapshot(ctx context.Context, tx *gorm.DB, snap billing.Snapshot) (billing.SnapshotOutcome, error)
}

// Entitlements is the local features and the app's answers: entitlements.Service.
type Entitlements interface {
	// CustomerFeaturesOf reads the stored features of a page's customers in one query.
	CustomerFeaturesOf(ctx context.Context, stripeCustomerIDs []string, livemode bool) (map[string]entitlements.CustomerFeatures, error)
	ApplyFeatureRead(ctx context.Context, tx *gorm.DB, r entitlements.FeatureRead) (bool, error)
	// TellUser tells the app, in tx, of the user's entitlement after a link changed it.
	TellUser(ctx context.Context, tx *gorm.DB, userID string) error
}

// Deps are what a reconciler needs.
type Deps struct {
	DB *gorm.DB
	// Stripe is the client of internal/stripeclient; its key decides the mode listed.
	Stripe *client.API
	// Billing and Entitlements may be set later with SetBilling (they are built after the River
	// client, which needs this package's worker).
	Billing      Subscriptions
	Entitlements Entitlements
	// Catalog is the local catalog the runs also compare and repair (products, prices, product
	// features); nil: the runs leave the catalog alone. May be set later with SetCatalog.
	Catalog  Catalog
	Livemode bool
	Logger   *slog.Logger
	// Registerer receives the metrics; optional.
	Registerer prometheus.Registerer
	// Interval is how often serve reconciles (reconcile.interval); 0 turns the periodic run off.
	Interval time.Duration
	// Limits of the calls to Stripe; zero fields take DefaultLimits of the mode.
	Limits Limits
	// Now is the clock of fetch times and records; time.Now when nil.
	Now func() time.Time
	// Sleep waits between calls (rate limit, backoff); a context-aware sleep when nil. Tests
	// replace it to see the delays asked for.
	Sleep func(ctx context.Context, d time.Duration) error
}

// Service runs reconciliations.
type Service struct {
	db       *gorm.DB
	stripe   *client.API
	billing  Subscriptions
	features Entitlements
	catalog  Catalog
	livemode bool
	log      *slog.Logger
	interval time.Duration
	limits   Limits
	now      func() time.Time
	sleep    func(ctx context.Context, d time.Duration) error
	bucket   *stripeclient.Bucket
	metrics  *metrics

	// Runs started by Start belong to the service: Stop cancels and waits for them.
	baseCtx context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// New builds a reconciler. It panics on a wiring bug (no database or Stripe client).
func New(d Deps) *Service {
	if d.DB == nil || d.Stripe == nil {
		panic("reconcile: Deps.DB and Deps.Stripe are required")
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.Sleep == nil {
		d.Sleep = sleepCtx
	}
	limits := d.Limits.withDefaults(d.Livemode)
	ctx, cancel := context.WithCancel(context.Background())
	return &Service{
		db:       d.DB,
		stripe:   d.Stripe,
		billing:  d.Billing,
		features: d.Entitlements,
		catalog:  d.Catalog,
		livemode: d.Livemode,
		log:      d.Logger.With("component", "reconcile"),
		interval: d.Interval,
		limits:   limits,
		now:      d.Now,
		sleep:    d.Sleep,
		bucket:   stripeclient.NewBucket(limits.ReadsPerSecond, limits.Burst, d.Now),
		metrics:  newMetrics(d.Registerer),
		baseCtx:  ctx,
		cancel:   cancel,
	}
}

// SetBilling sets the local state the runs compare with and repair.
func (s *Service) SetBilling(b Subscriptions, e Entitlements) { s.billing, s.features = b, e }

// ErrRunning means a run of the same mode is going (in this process or another).
var ErrRunning = errors.New("a reconcile run of this mode is already going")

// Who started a run.
const (
	TriggerCommand  = "command"
	TriggerPeriodic = "periodic"
	TriggerAdmin    = "admin"
)

// RunOptions say how to run.
type RunOptions struct {
	// DryRun compares and records what differs, and changes no subscription or customer.
	DryRun  bool
	Trigger string
	// Progress receives a line per page (the command's stderr); nil: the log only.
	Progress io.Writer
	// Actor is the admin who asked for the run (auth.Actor of the request), "" for none: the
	// start, or its refusal, is then recorded in the audit log, with the run's own record.
	Actor string
}

// Summary is the outcome of a run.
type Summary struct {
	RunID           string
	DryRun          bool
	Objects         int
	Drifted         int
	Repaired        int
	MissingAtStripe int
	Errors          int
	// Catalog: the run compared the catalog too (a catalog was set); Line then adds its counts.
	// Its drift counts in Drifted and Repaired as well, so that the exit code covers it.
	Catalog         bool
	CatalogObjects  int
	CatalogDrifted  int
	CatalogRepaired int
	// Err stopped the run before the end; nil when it went through.
	Err error
}

// Line is the command's summary line. Its fields only ever grow at the end: scripts parse it.
func (s Summary) Line() string {
	line := fmt.Sprintf("reconcile: objects=%d drifted=%d repaired=%d missing_at_stripe=%d errors=%d",
		s.Objects, s.Drifted, s.Repaired, s.MissingAtStripe, s.Errors)
	if s.Catalog {
		line += fmt.Sprintf(" catalog_objects=%d catalog_drifted=%d catalog_repaired=%d",
			s.CatalogObjects, s.CatalogDrifted, s.CatalogRepaired)
	}
	return line
}

// Exit codes of `billing reconcile`.
const (
	ExitClean   = 0 // nothing differs, or everything that did was repaired
	ExitDrift   = 1 // something still differs: a dry run's drift, drift that could not be repaired, subscriptions missing at Stripe, errors on single objects
	ExitStopped = 2 // an error stopped the run (or it could not start)
)

// ExitCode is the command's exit code for the summary.
func (s Summary) ExitCode() int {
	switch {
	case s.Err != nil:
		return ExitStopped
	case s.Drifted > s.Repaired || s.MissingAtStripe > 0 || s.Errors > 0:
		return ExitDrift
	}
	return ExitClean
}

// Run runs a reconciliation now and returns when it is over. It returns ErrRunning, and runs
// nothing, while another run of the mode is going. A run that stops early is recorded with its
// error, and its summary says so (Err); the error returned is only for a run that never started.
func (s *Service) Run(ctx context.Context, opts RunOptions) (Summary, error) {
	lk, err := s.lock(ctx)
	if err != nil {
		return Summary{}, err
	}
	defer lk.release()
	r, err := s.begin(ctx, lk, opts)
	if err != nil {
		return Summary{}, err
	}
	return r.execute(ctx), nil
}

// Start starts a run in the background and returns its id; ErrRunning while one is going. The
// run belongs to the service: Stop ends it.
func (s *Service) Start(opts RunOptions) (string, error) {
	ctx := s.baseCtx
	if ctx.Err() != nil {
		return "", errors.New("reconcile: stopping")
	}
	lk, err := s.lock(ctx)
	if err != nil {
		if errors.Is(err, ErrRunning) && opts.Actor != "" {
			if aerr := audit.RecordBy(ctx, s.db, opts.Actor, audit.ActionReconcileStart, "reconcile "+modeName(s.livemode)+" mode",
				s.livemode, "refused: a run is going"); aerr != nil {
				s.log.Error("record a refused reconcile start", "error", aerr)
			}
		}
		return "", err
	}
	r, err := s.begin(ctx, lk, opts)
	if err != nil {
		lk.release()
		return "", err
	}
	s.wg.Go(func() {
		defer lk.release()
		r.execute(ctx)
	})
	return r.sum.RunID, nil
}

// Stop cancels the runs Start started (each records that it was interrupted) and waits for them
// until ctx ends.
func (s *Service) Stop(ctx context.Context) error {
	s.cancel()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("reconcile: run still going at shutdown: %w", ctx.Err())
	}
}

// lockKey is the advisory lock of a mode's runs ("reconcile" plus the mode).
func lockKey(livemode bool) int64 {
	const base int64 = 0x7265636f6e63696c // "reconcil"
	if livemode {
		return base + 1
	}
	return base
}

// runLock is the advisory lock of a run, held on one connection of the pool for the run's
// length: if the process dies, PostgreSQL ends the session and the lock with it. The run's
// temporary table lives in that session too.
type runLock struct {
	livemode bool
	conn     *sql.Conn
}

func (s *Service) lock(ctx context.Context) (*runLock, error) {
	conn, err := database.SQL(s.db).Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("reconcile: get a connection: %w", err)
	}
	var ok bool
	if err := conn.QueryRowContext(ctx, `SELECT pg_try_advisory_lock($1)`, lockKey(s.livemode)).Scan(&ok); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("reconcile: take the run lock: %w", err)
	}
	if !ok {
		_ = conn.Close()
		return nil, ErrRunning
	}
	return &runLock{livemode: s.livemode, conn: conn}, nil
}

// release drops the run's table and lock, and gives the connection back to the pool.
func (l *runLock) release() {
	// A fresh context: the run's may be canceled, and a lock left on a pooled connection would
	// refuse every later run of the mode.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _ = l.conn.ExecContext(ctx, `DROP TABLE IF EXISTS pg_temp.reconcile_seen`)
	if _, err := l.conn.ExecContext(ctx, `SELECT pg_advisory_unlock($1)`, lockKey(l.livemode)); err != nil {
		// The session may be gone (and its lock with it); if not, closing the driver connection
		// ends it.
		_ = l.conn.Raw(func(any) error { return driver.ErrBadConn })
	}
	_ = l.conn.Close()
}

func newRunID(now time.Time) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "rr_" + now.UTC().Format("20060102T150405Z") + "_" + hex.EncodeToString(b[:])
}
