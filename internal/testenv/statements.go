package testenv

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// Statements counts the statements a pool sends to the server, BEGIN, COMMIT and SAVEPOINT
// included (a pgx query tracer): each is a round trip, the cost that benchmarks of the
// database paths count rather than time on a shared machine.
type Statements struct{ n atomic.Int64 }

// TraceQueryStart counts one statement.
func (s *Statements) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	s.n.Add(1)
	return ctx
}

// TraceQueryEnd is part of pgx.QueryTracer.
func (*Statements) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// Count is the number of statements sent so far.
func (s *Statements) Count() int64 { return s.n.Load() }

// CountedDB is DB with every statement of its pool counted, and gorm configured as the service
// configures it (no implicit transaction per write), so that counts are the service's.
func CountedDB(t testing.TB) (*gorm.DB, *Statements) {
	t.Helper()
	dsn := DatabaseURL(t)
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("testenv: parse %s: %v", redact(dsn), err)
	}
	st := &Statements{}
	cfg.Tracer = st
	sqlDB := stdlib.OpenDB(*cfg)
	t.Cleanup(func() { sqlDB.Close() })
	db, err := gorm.Open(postgres.New(postgres.Config{Conn: sqlDB}), &gorm.Config{
		Logger: logger.Default.LogMode(logger.Silent), SkipDefaultTransaction: true})
	if err != nil {
		t.Fatalf("testenv: opening %s: %v", redact(dsn), err)
	}
	return db, st
}
