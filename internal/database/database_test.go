package database_test

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"billing/internal/database"
	"billing/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// Only failed (or slow) statements reach the log, never a statement's bound values.
func TestOpenLogsOnlyFailedStatements(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&buf, nil))
	db, err := database.Open(context.Background(), testenv.DatabaseURL(t), logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { database.SQL(db).Close() })

	var n int
	if err := db.Raw(`SELECT ?::int + 1`, 41).Scan(&n).Error; err != nil || n != 42 {
		t.Fatalf("select: %d, %v", n, err)
	}
	if buf.Len() != 0 {
		t.Errorf("a successful fast statement was logged: %s", buf.String())
	}
	if err := db.Exec(`SELECT no_such_column FROM pg_class WHERE relname = ?`, "secret-value").Error; err == nil {
		t.Fatal("the failing statement succeeded")
	}
	out := buf.String()
	if !strings.Contains(out, "no_such_column") || !strings.Contains(out, `"level":"ERROR"`) {
		t.Errorf("the failed statement was not logged as an error: %s", out)
	}
	if strings.Contains(out, "secret-value") {
		t.Errorf("a bound value reached the log: %s", out)
	}
}

// The pool holds every share at its bound and FreeConns besides: with each share's connections
// taken (and kept busy in open transactions), a read still gets one, FreeConns of them at once.
func TestPoolKeepsFreeConnectionsBeyondTheShares(t *testing.T) {
	t.Parallel()
	db, err := database.Open(context.Background(), testenv.DatabaseURL(t), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	sqlDB := database.SQL(db)
	t.Cleanup(func() { sqlDB.Close() })
	if got := sqlDB.Stats().MaxOpenConnections; got != database.DefaultPoolSize {
		t.Errorf("Open: max open connections = %d, want %d", got, database.DefaultPoolSize)
	}
	shares := database.PoolShares{StripeCalls: 24, InlineApplies: 16, Workers: 37}
	if got, want := shares.Size(), 24+16+37+database.BackgroundConns+database.FreeConns; got != want {
		t.Fatalf("Size() = %d, want %d", got, want)
	}
	database.SizePool(sqlDB, shares.Size())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var held []*sql.Tx
	defer func() {
		for _, tx := range held {
			_ = tx.Rollback()
		}
	}()
	for range shares.StripeCalls + shares.InlineApplies + shares.Workers + database.BackgroundConns {
		tx, err := sqlDB.BeginTx(ctx, nil)
		if err != nil {
			t.Fatalf("holding the shares: %v", err)
		}
		held = append(held, tx)
		if _, err := tx.ExecContext(ctx, `SELECT 1`); err != nil {
			t.Fatal(err)
		}
	}
	// FreeConns readers at once, each holding its connection until all have one.
	var readers []*sql.Conn
	for range database.FreeConns {
		c, err := sqlDB.Conn(ctx)
		if err != nil {
			t.Fatalf("a read found no connection with every share busy: %v", err)
		}
		readers = append(readers, c)
		var n int
		if err := c.QueryRowContext(ctx, `SELECT 1`).Scan(&n); err != nil || n != 1 {
			t.Fatalf("read: %d, %v", n, err)
		}
	}
	if got := sqlDB.Stats().OpenConnections; got != shares.Size() {
		t.Errorf("%d connections open, want the whole pool of %d", got, shares.Size())
	}
	for _, c := range readers {
		_ = c.Close()
	}
}

// An unreachable database is one error on one line, logged by nobody but the caller, and still
// classified as unavailable.
func TestOpenUnreachableIsOneLine(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&buf, nil))
	_, err := database.Open(context.Background(), "postgres://u:p@127.0.0.1:1/x", logger)
	if err == nil {
		t.Fatal("Open of 127.0.0.1:1 succeeded")
	}
	msg := err.Error()
	if strings.ContainsAny(msg, "\n\t") || !strings.Contains(msg, "connection refused") || strings.Count(msg, "connection refused") != 1 {
		t.Errorf("error %q: want one line naming the refusal once", msg)
	}
	if strings.Contains(msg, ":p@") {
		t.Errorf("error %q shows the password", msg)
	}
	if !database.IsUnavailable(err) {
		t.Errorf("IsUnavailable(%v) = false", err)
	}
	if buf.Len() != 0 {
		t.Errorf("Open logged the failure itself: %s", buf.String())
	}
}

// gorm's own messages are formatted with their arguments, on one line, whatever the arguments.
func TestGormMessagesAreFormatted(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&buf, nil))
	db, err := database.Open(context.Background(), testenv.DatabaseURL(t), logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { database.SQL(db).Close() })
	// An argument JSON cannot encode, like the pgx configuration inside a connect error.
	arg := struct{ Now func() time.Time }{Now: time.Now}
	db.Logger.Error(context.Background(), "failed to initialize database, got error %v\nsecond line", fmt.Errorf("boom %T", arg))
	out := buf.String()
	if !strings.Contains(out, `"msg":"failed to initialize database, got error boom struct { Now func() time.Time }; second line"`) || strings.Contains(out, "!ERROR") || strings.Contains(out, "%v") {
		t.Errorf("gorm message logged as %s", out)
	}
}
