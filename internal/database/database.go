// Package database opens the service's PostgreSQL pool through gorm and classifies errors that
// mean "the database is not reachable" (answered 503, so that callers retry).
package database

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	gormlogger "gorm.io/gorm/logger"

	"billing/internal/apierr"
)

// Open connects to url and checks the connection. The pool is shared by gorm and River.
func Open(ctx context.Context, url string, logger *slog.Logger) (*gorm.DB, error) {
	gormLog := logger.With("component", "gorm")
	db, err := gorm.Open(postgres.Open(url), &gorm.Config{
		Logger: quietLogger{log: gormLog, level: gormlogger.Warn, Interface: gormlogger.NewSlogLogger(gormLog, gormlogger.Config{
			SlowThreshold:             slowQuery,
			LogLevel:                  gormlogger.Warn,
			IgnoreRecordNotFoundError: true,
			// Never log bound values: they include emails and payloads.
			ParameterizedQueries: true,
		})},
		// Transactions are always explicit: gorm's implicit per-write transaction only costs
		// round trips here.
		SkipDefaultTransaction: true,
		// The ping below reports an unreachable database once, as one line; gorm's own would
		// log it a second time.
		DisableAutomaticPing: true,
	})
	if err != nil {
		return nil, fmt.Errorf("open database: %w", err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, fmt.Errorf("open database: %w", err)
	}
	SizePool(sqlDB, DefaultPoolSize)
	sqlDB.SetConnMaxIdleTime(5 * time.Minute)
	sqlDB.SetConnMaxLifetime(time.Hour)
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := sqlDB.PingContext(pingCtx); err != nil {
		_ = sqlDB.Close()
		return nil, oneLineError{err}
	}
	return db, nil
}

// oneLineError is a connection error on one line: pgx lists each address it tried on a line of
// its own (often the same refusal twice, with and without TLS), which a log line or a terminal
// shows as a wall of escapes.
type oneLineError struct{ err error }

func (e oneLineError) Error() string { return OneLine(e.err) }
func (e oneLineError) Unwrap() error { return e.err }

// OneLine renders err on one line: its lines joined with "; ", repeated lines once.
func OneLine(err error) string {
	var parts []string
	for _, l := range strings.Split(err.Error(), "\n") {
		if l = strings.TrimSpace(l); l != "" && !slices.Contains(parts, l) {
			parts = append(parts, l)
		}
	}
	var b strings.Builder
	for i, part := range parts {
		if i > 0 {
			if strings.HasSuffix(parts[i-1], ":") {
				b.WriteString(" ")
			} else {
				b.WriteString("; ")
			}
		}
		b.WriteString(part)
	}
	return b.String()
}

// The pool is divided into shares, one per kind of work that can hold a connection for long (a
// call to Stripe, a lock wait), each bounded by its own limit, plus what is kept for the rest:
// whatever the bounded kinds do at once, entitlement reads and webhook receipt find a connection.
type PoolShares struct {
	// StripeCalls: app requests that hold a connection (and a row lock) across a call to Stripe,
	// bounded by httpserver.LimitConcurrency (stripe.max_concurrent_calls).
	StripeCalls int
	// InlineApplies: webhook events applied in their request (the inbox's inline slots).
	InlineApplies int
	// Workers: River workers of every queue, one connection each for its job.
	Workers int
}

// BackgroundConns is the share of River's own work (each queue's fetch, the completer, the
// leader, maintenance) and of the service's loops (the inbox's rescuer, a reconcile run started
// by an admin).
const BackgroundConns = 8

// FreeConns are kept for the work that is brief and unbounded in number: entitlement and
// customer reads, webhook receipt (storing an event), admin pages, readiness checks.
const FreeConns = 8

// Size is the pool that holds every share and FreeConns besides.
func (s PoolShares) Size() int {
	return s.StripeCalls + s.InlineApplies + s.Workers + BackgroundConns + FreeConns
}

// DefaultPoolSize is the pool Open sets until SizePool is told the process's shares.
const DefaultPoolSize = 40

// SizePool sets the pool's size: the most connections the process opens.
func SizePool(sqlDB *sql.DB, size int) {
	sqlDB.SetMaxOpenConns(size)
	sqlDB.SetMaxIdleConns(size)
}

// slowQuery is the duration above which a statement is logged as slow.
const slowQuery = 500 * time.Millisecond

// quietLogger is gorm's slog logger, asked only about statements it will log (failed or slow).
// gorm's own Trace renders every statement's SQL before deciding to drop it: 5% of the CPU of
// event processing, for nothing.
//
// Its Info, Warn and Error format their message with its arguments, as gorm's callers mean them
// (printf style); gorm's slog logger would log the format verbatim and the arguments as a
// "data" attribute that JSON cannot always encode.
type quietLogger struct {
	log   *slog.Logger
	level gormlogger.LogLevel
	gormlogger.Interface
}

func (q quietLogger) LogMode(level gormlogger.LogLevel) gormlogger.Interface {
	return quietLogger{log: q.log, level: level, Interface: q.Interface.LogMode(level)}
}

func (q quietLogger) Info(ctx context.Context, msg string, data ...any) {
	if q.level >= gormlogger.Info {
		q.log.InfoContext(ctx, oneLineText(fmt.Sprintf(msg, data...)))
	}
}

func (q quietLogger) Warn(ctx context.Context, msg string, data ...any) {
	if q.level >= gormlogger.Warn {
		q.log.WarnContext(ctx, oneLineText(fmt.Sprintf(msg, data...)))
	}
}

func (q quietLogger) Error(ctx context.Context, msg string, data ...any) {
	if q.level >= gormlogger.Error {
		q.log.ErrorContext(ctx, oneLineText(fmt.Sprintf(msg, data...)))
	}
}

func oneLineText(s string) string { return OneLine(errors.New(s)) }

// ParamsFilter keeps bound values out of the log (gorm asks the logger through this optional
// interface, which embedding alone would hide).
func (q quietLogger) ParamsFilter(_ context.Context, sql string, _ ...any) (string, []any) {
	return sql, nil
}

func (q quietLogger) Trace(ctx context.Context, begin time.Time, fc func() (string, int64), err error) {
	if err == nil && time.Since(begin) <= slowQuery {
		return
	}
	q.Interface.Trace(ctx, begin, fc, err)
}

// SQL returns the *sql.DB under a gorm handle.
func SQL(db *gorm.DB) *sql.DB {
	sqlDB, err := db.DB()
	if err != nil {
		// Only possible when db was not built on a *sql.DB, which Open never does.
		panic(fmt.Sprintf("database: gorm handle without *sql.DB: %v", err))
	}
	return sqlDB
}

// IsUnavailable reports whether err means the database could not be reached or is shutting
// down, as opposed to a query that is wrong.
func IsUnavailable(err error) bool {
	if err == nil {
		return false
	}
	// A pooled connection to a server that restarted fails with an unexpected EOF.
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, sql.ErrConnDone) || errors.Is(err, io.ErrUnexpectedEOF) {
		return true
	}
	var netErr net.Error
	if errors.As(err, &netErr) {
		return true
	}
	var connErr *pgconn.ConnectError
	if errors.As(err, &connErr) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		// Class 08: connection exception; 57P01-57P03: admin shutdown, crash shutdown, cannot
		// connect now; 53300: too many connections.
		switch {
		case len(pgErr.Code) == 5 && pgErr.Code[:2] == "08",
			pgErr.Code == "57P01", pgErr.Code == "57P02", pgErr.Code == "57P03", pgErr.Code == "53300":
			return true
		}
	}
	return pgconn.SafeToRetry(err) || errors.Is(err, driver.ErrBadConn)
}

// APIError turns a failed query into the client's answer: 503 when the database is unreachable
// (the client should retry), 500 otherwise. what says what failed, for the log. nil stays nil,
// and an error that already is an answer (an *apierr.Error returned from inside a transaction)
// is kept as it is, so that callers can map whatever a transaction returns in one place.
func APIError(err error, what string) error {
	if err == nil {
		return nil
	}
	if _, ok := apierr.As(err); ok {
		return err
	}
	if IsUnavailable(err) {
		return apierr.Wrap(fmt.Errorf("%s: %w", what, err), apierr.CodeDatabaseDown, "the database is unavailable; retry later")
	}
	return apierr.Wrap(fmt.Errorf("%s: %w", what, err), apierr.CodeInternal, "internal error")
}

// Exec runs a statement straight on db's connection (its pool, or the transaction it is bound
// to) and returns the rows it affected. gorm's Exec renders every statement with its values for
// its trace even when nothing is logged, which on the path of every webhook event was a twentieth
// of the CPU; the paths that apply events use this instead. A failed statement is not logged
// here: its error goes back to the caller, who wraps it.
func Exec(ctx context.Context, db *gorm.DB, query string, args ...any) (int64, error) {
	res, err := db.Statement.ConnPool.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}
