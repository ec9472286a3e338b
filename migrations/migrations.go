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
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("migrate: get connection: %w", err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "SELECT pg_advisory_lock($1)", lockKey); err != nil {
		return fmt.Errorf("migrate: take advisory lock: %w", err)
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
	results, err := p.Up(ctx)
	if err != nil {
		return fmt.Errorf("migrate: apply service migrations: %w", err)
	}
	for _, r := range results {
		logger.Info("migration applied", "source", "billing", "version", r.Source.Version, "duration", r.Duration)
	}

	rm, err := rivermigrate.New(riverdatabasesql.New(db), &rivermigrate.Config{Logger: logger})
	if err != nil {
		return fmt.Errorf("migrate: load river migrations: %w", err)
	}
	res, err := rm.Migrate(ctx, rivermigrate.DirectionUp, nil)
	if err != nil {
		return fmt.Errorf("migrate: apply river migrations: %w", err)
	}
	for _, v := range res.Versions {
		logger.Info("migration applied", "source", "river", "version", v.Version, "duration", v.Duration)
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
