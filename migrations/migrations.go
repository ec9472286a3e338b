// Package migrations holds the service's schema as embedded goose SQL files and applies them,
// together with River's own migrations, under one PostgreSQL advisory lock so that several
// replicas starting at once serialise instead of racing.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/pressly/goose/v3"
	"github.com/riverqueue/river/riverdriver/riverdatabasesql"
	"github.com/riverqueue/river/rivermigrate"
)

//go:embed *.sql
var files embed.FS

// lockKey is an arbitrary constant shared by every replica: pg_advisory_lock(lockKey) serialises
// migration runs across processes.
const lockKey int64 = 0x62696c6c696e67 // "billing"

func provider(db *sql.DB, logger *slog.Logger) (*goose.Provider, error) {
	opts := []goose.ProviderOption{goose.WithDisableGlobalRegistry(true)}
	if logger != nil {
		opts = append(opts, goose.WithSlog(logger))
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, files, opts...)
	if err != nil {
		return nil, fmt.Errorf("load migrations: %w", err)
	}
	return p, nil
}

// Apply applies every pending migration of the service and of River. It is safe to call from
// several processes at once: they take turns on a session-level advisory lock, and the later
// ones find nothing pending.
func Apply(ctx context.Context, db *sql.DB, logger *slog.Logger) error {
	return ApplyWith(ctx, db, Options{Logger: logger})
}

// Options are the inputs of ApplyWith besides the database.
type Options struct {
	// Logger gets a line per applied migration; nil discards them.
	Logger *slog.Logger
	// Progress, if set, is called before and after each migration of the run.
	Progress func(Step)
	// Waiting, if set, is called when another process holds the migration lock, before this one
	// waits for it.
	Waiting func()
}

// Step is one migration of a run, for a progress display.
type Step struct {
	Source  string // "billing" or "river"
	Version int64
	// Index counts from 1 among the Total migrations this run applies.
	Index, Total int
	// Done: the migration is applied (after Duration); otherwise it is about to start.
	Done     bool
	Duration time.Duration
}

// ApplyWith is Apply with a progress report: migrations run one at a time, so a display can say
// which one a long run is in.
func ApplyWith(ctx context.Context, db *sql.DB, opts Options) error {
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	progress := opts.Progress
	if progress == nil {
		progress = func(Step) {}
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("migrate: get connection: %w", err)
	}
	defer conn.Close()
	var locked bool
	if err := conn.QueryRowContext(ctx, "SELECT pg_try_advisory_lock($1)", lockKey).Scan(&locked); err != nil {
		return fmt.Errorf("migrate: take advisory lock: %w", err)
	}
	if !locked {
		if opts.Waiting != nil {
			opts.Waiting()
		}
		logger.Info("waiting for the migration lock: another process is migrating")
		if err := waitForLock(ctx, conn); err != nil {
			return err
		}
	}
	defer func() {
		// A fresh context: the caller's may be canceled, and a lock left on a pooled connection
		// would block every later migration.
		_, _ = conn.ExecContext(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", lockKey)
	}()

	p, err := provider(db, logger)
	if err != nil {
		return err
	}
	statuses, err := p.Status(ctx)
	if err != nil {
		return fmt.Errorf("migrate: read service migrations: %w", err)
	}
	var ours []int64
	for _, st := range statuses {
		if st.State == goose.StatePending {
			ours = append(ours, st.Source.Version)
		}
	}
	rm, err := rivermigrate.New(riverdatabasesql.New(db), &rivermigrate.Config{Logger: logger})
	if err != nil {
		return fmt.Errorf("migrate: load river migrations: %w", err)
	}
	existing, err := rm.ExistingVersions(ctx)
	if err != nil {
		return fmt.Errorf("migrate: read river migrations: %w", err)
	}
	var rivers []int64
	for _, m := range rm.AllVersions() {
		if !slices.ContainsFunc(existing, func(e rivermigrate.Migration) bool { return e.Version == m.Version }) {
			rivers = append(rivers, int64(m.Version))
		}
	}
	total := len(ours) + len(rivers)

	index := 0
	for _, v := range ours {
		index++
		progress(Step{Source: "billing", Version: v, Index: index, Total: total})
		r, err := p.UpByOne(ctx)
		if err != nil {
			return fmt.Errorf("migrate: apply service migration %d: %w", v, err)
		}
		logger.Info("migration applied", "source", "billing", "version", r.Source.Version, "duration", r.Duration)
		progress(Step{Source: "billing", Version: r.Source.Version, Index: index, Total: total, Done: true, Duration: r.Duration})
	}
	for _, v := range rivers {
		index++
		progress(Step{Source: "river", Version: v, Index: index, Total: total})
		res, err := rm.Migrate(ctx, rivermigrate.DirectionUp, &rivermigrate.MigrateOpts{MaxSteps: 1})
		if err != nil {
			return fmt.Errorf("migrate: apply river migration %d: %w", v, err)
		}
		for _, r := range res.Versions {
			logger.Info("migration applied", "source", "river", "version", r.Version, "duration", r.Duration)
			progress(Step{Source: "river", Version: int64(r.Version), Index: index, Total: total, Done: true, Duration: r.Duration})
		}
	}
	return nil
}

// Pending reports whether the database lacks any of the service's or River's migrations;
// /readyz answers 503 while it does.
func Pending(ctx context.Context, db *sql.DB) (bool, error) {
	p, err := provider(db, nil)
	if err != nil {
		return false, err
	}
	pending, err := p.HasPending(ctx)
	if err != nil {
		return false, fmt.Errorf("check service migrations: %w", err)
	}
	if pending {
		return true, nil
	}
	rm, err := rivermigrate.New(riverdatabasesql.New(db), &rivermigrate.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return false, fmt.Errorf("load river migrations: %w", err)
	}
	existing, err := rm.ExistingVersions(ctx)
	if err != nil {
		return false, fmt.Errorf("check river migrations: %w", err)
	}
	all := rm.AllVersions()
	return len(existing) < len(all), nil
}

// ApplyQuietly is Apply without logs: the migrator of the tests' template database.
func ApplyQuietly(ctx context.Context, db *sql.DB) error { return Apply(ctx, db, nil) }

// waitForLock polls for the migration lock instead of blocking in pg_advisory_lock: a statement
// blocked there holds a snapshot, and CREATE INDEX CONCURRENTLY in the holder's migration waits
// for every older snapshot to go away, so the two would wait for each other forever.
func waitForLock(ctx context.Context, conn *sql.Conn) error {
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("migrate: wait for the advisory lock: %w", ctx.Err())
		case <-tick.C:
		}
		var locked bool
		if err := conn.QueryRowContext(ctx, "SELECT pg_try_advisory_lock($1)", lockKey).Scan(&locked); err != nil {
			return fmt.Errorf("migrate: take advisory lock: %w", err)
		}
		if locked {
			return nil
		}
	}
}
