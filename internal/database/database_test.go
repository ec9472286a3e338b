package database_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

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

// The pool grows with the workers so that the HTTP path keeps its connections.
func TestSizePoolReservesConnectionsBeyondTheWorkers(t *testing.T) {
	t.Parallel()
	db, err := database.Open(context.Background(), testenv.DatabaseURL(t), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	sqlDB := database.SQL(db)
	t.Cleanup(func() { sqlDB.Close() })
	if got, want := sqlDB.Stats().MaxOpenConnections, database.DefaultWorkers+database.ReservedConns; got != want {
		t.Errorf("Open: max open connections = %d, want %d", got, want)
	}
	for _, workers := range []int{1, 8, 32} {
		n := database.SizePool(sqlDB, workers)
		if got := sqlDB.Stats().MaxOpenConnections; n != workers+database.ReservedConns || got != n {
			t.Errorf("SizePool(%d) = %d, pool max %d; want %d for both", workers, n, got, workers+database.ReservedConns)
		}
	}
}
