package migrations_test

import (
	"context"
	"io/fs"
	"os"
	"testing"

	"billing/migrations"
)

// A run reports every migration it applies, in order, each started then done, numbered out of
// the run's total; a run with nothing pending reports nothing.
func TestApplyWithReportsEachMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := open(t)
	var steps []migrations.Step
	if err := migrations.ApplyWith(ctx, db, migrations.Options{Progress: func(s migrations.Step) { steps = append(steps, s) }}); err != nil {
		t.Fatal(err)
	}
	entries, err := fs.Glob(os.DirFS("."), "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	ours := len(entries)
	if len(steps) == 0 || len(steps)%2 != 0 {
		t.Fatalf("%d steps: want a start and a done per migration", len(steps))
	}
	total := len(steps) / 2
	if total <= ours {
		t.Errorf("%d migrations reported, want the %d of the service and River's", total, ours)
	}
	billing := 0
	for i, s := range steps {
		want := i/2 + 1
		if s.Index != want || s.Total != total || s.Done != (i%2 == 1) {
			t.Errorf("step %d = %+v, want index %d of %d, done %v", i, s, want, total, i%2 == 1)
		}
		if i%2 == 1 && (s.Source != steps[i-1].Source || s.Version != steps[i-1].Version) {
			t.Errorf("step %d finished %s %d, started %s %d", i, s.Source, s.Version, steps[i-1].Source, steps[i-1].Version)
		}
		if s.Source == "billing" && s.Done {
			billing++
		}
	}
	if billing != ours {
		t.Errorf("%d service migrations reported, want %d", billing, ours)
	}
	var again []migrations.Step
	if err := migrations.ApplyWith(ctx, db, migrations.Options{Progress: func(s migrations.Step) { again = append(again, s) }}); err != nil {
		t.Fatal(err)
	}
	if len(again) != 0 {
		t.Errorf("second run reported %+v", again)
	}
}

// A run that finds the lock taken says so before it waits, and applies once the lock is free.
func TestApplyWithSaysWhenItWaitsForTheLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := open(t)
	holder, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	// The package's lock key ("billing"); if it moved, the run below does not wait and fails.
	if _, err := holder.ExecContext(ctx, "SELECT pg_advisory_lock(x'62696c6c696e67'::bigint)"); err != nil {
		t.Fatal(err)
	}
	waiting := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- migrations.ApplyWith(ctx, db, migrations.Options{Waiting: func() { close(waiting) }})
	}()
	select {
	case <-waiting:
	case err := <-done:
		t.Fatalf("applied while the lock was held (err %v)", err)
	}
	if _, err := holder.ExecContext(ctx, "SELECT pg_advisory_unlock(x'62696c6c696e67'::bigint)"); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if pending, err := migrations.Pending(ctx, db); err != nil || pending {
		t.Errorf("after the wait: pending=%v err=%v", pending, err)
	}
}
