package migrations_test

import (
	"context"
	"database/sql"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib"

	"billing/internal/testenv"
	"billing/migrations"
)

// No migrator: every test database starts empty, as a new deployment's does.
func TestMain(m *testing.M) { testenv.Main(m) }

func open(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func TestApplyTwiceIsANoOp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := open(t)
	if pending, err := migrations.Pending(ctx, db); err != nil || !pending {
		t.Fatalf("empty database: pending=%v err=%v, want pending", pending, err)
	}
	if err := migrations.Apply(ctx, db, nil); err != nil {
		t.Fatalf("first apply: %v", err)
	}
	var versions int
	if err := db.QueryRow(`SELECT count(*) FROM goose_db_version`).Scan(&versions); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Apply(ctx, db, nil); err != nil {
		t.Fatalf("second apply: %v", err)
	}
	var again int
	if err := db.QueryRow(`SELECT count(*) FROM goose_db_version`).Scan(&again); err != nil {
		t.Fatal(err)
	}
	if again != versions {
		t.Errorf("second apply recorded %d more versions", again-versions)
	}
	if pending, err := migrations.Pending(ctx, db); err != nil || pending {
		t.Errorf("after apply: pending=%v err=%v", pending, err)
	}
	for _, table := range []string{"webhook_events", "webhook_dead_letters", "customers", "subscriptions", "river_job"} {
		var exists bool
		if err := db.QueryRow(`SELECT to_regclass($1) IS NOT NULL`, table).Scan(&exists); err != nil || !exists {
			t.Errorf("table %s missing after apply (err %v)", table, err)
		}
	}
}

// Replicas starting at once all run Apply: they must take turns, and all succeed.
func TestConcurrentApply(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testenv.DatabaseURL(t)
	const n = 4
	errs := make(chan error, n)
	for range n {
		go func() {
			db, err := sql.Open("pgx", url)
			if err != nil {
				errs <- err
				return
			}
			defer db.Close()
			errs <- migrations.Apply(ctx, db, nil)
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Errorf("concurrent apply: %v", err)
		}
	}
	check, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer check.Close()
	if pending, err := migrations.Pending(ctx, check); err != nil || pending {
		t.Errorf("after concurrent apply: pending=%v err=%v", pending, err)
	}
}
