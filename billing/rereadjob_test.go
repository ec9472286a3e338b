package billing

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/riverqueue/river"

	"billing/internal/jobs"
	"billing/internal/testenv"
)

// The re-read's jobs are written by jobs.UniqueInsert's statement, not River: the row must be the
// one River's InsertTx writes with the same options, column by column (every column River has, so
// that one it adds later is compared too), and each must see the other's row as a duplicate.
func TestUniqueInsertWritesRiversRow(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	// Never started: it only inserts (River checks the kind has a worker).
	workers := river.NewWorkers()
	river.AddWorker(workers, &rereadWorker{})
	rc, err := jobs.NewClient(sqlDB, jobs.ClientOptions{Workers: workers, Logger: slog.New(slog.DiscardHandler), TestOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	inTx := func(f func(tx *sql.Tx) error) {
		t.Helper()
		tx, err := sqlDB.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := f(tx); err != nil {
			_ = tx.Rollback()
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	at := time.Now().Add(time.Hour).UTC().Truncate(time.Microsecond)
	type jobCase struct {
		name        string
		args, other river.JobArgs // other differs in a field that is not unique
		opts        *river.InsertOpts
		at          time.Time
		maxAttempts int
		sub         string
	}
	rereadOpts := &river.InsertOpts{MaxAttempts: 3, ScheduledAt: at, UniqueOpts: river.UniqueOpts{ByArgs: true}}
	for _, c := range []jobCase{
		{"renewal", RereadArgs{SubscriptionID: "sub_eq_due", Due: 1719792000}, RereadArgs{SubscriptionID: "sub_eq_due", Due: 1719792000, Livemode: true},
			rereadOpts, at, 3, "sub_eq_due"},
		{"tie", RereadArgs{SubscriptionID: "sub_eq_tie", Livemode: true, Tie: 1719792001}, RereadArgs{SubscriptionID: "sub_eq_tie", Tie: 1719792001},
			rereadOpts, at, 3, "sub_eq_tie"},
	} {
		byRiver := func(args river.JobArgs) (skipped bool) {
			t.Helper()
			inTx(func(tx *sql.Tx) error {
				res, err := rc.InsertTx(ctx, tx, args, c.opts)
				if err == nil {
					skipped = res.UniqueSkippedAsDuplicate
				}
				return err
			})
			return skipped
		}
		ours := func(args river.JobArgs) (skipped bool) {
			t.Helper()
			inTx(func(tx *sql.Tx) (err error) {
				skipped, err = uniqueInsert(ctx, rc, tx, args, c.at, c.maxAttempts)
				return err
			})
			return skipped
		}
		row := func() map[string]any {
			t.Helper()
			var cols []string
			// scheduled_at is compared only for a scheduled job: an available one's is the
			// insert's now().
			if err := db.Raw(`SELECT CAST(to_jsonb(j) - 'id' - 'created_at' - CASE WHEN state = 'available' THEN 'scheduled_at' ELSE '' END AS text)
				FROM river_job j WHERE kind = $1 AND args->>'subscription_id' = $2`, c.args.Kind(), c.sub).Scan(&cols).Error; err != nil || len(cols) != 1 {
				t.Fatalf("%s: jobs: %v, %v; want one", c.name, cols, err)
			}
			var m map[string]any
			if err := json.Unmarshal([]byte(cols[0]), &m); err != nil {
				t.Fatal(err)
			}
			return m
		}
		if byRiver(c.args) {
			t.Fatalf("%s: skipped on an empty table", c.name)
		}
		want := row()
		for _, col := range []string{"args", "kind", "max_attempts", "metadata", "priority", "queue", "state", "tags",
			"unique_key", "unique_states", "attempt", "errors"} {
			if _, ok := want[col]; !ok {
				t.Errorf("River's row has no column %s", col)
			}
		}
		if !ours(c.args) {
			t.Errorf("%s: our insert did not see River's row as a duplicate", c.name)
		}
		if err := db.Exec(`DELETE FROM river_job WHERE args->>'subscription_id' = $1`, c.sub).Error; err != nil {
			t.Fatal(err)
		}
		if ours(c.args) {
			t.Fatalf("%s: skipped on an empty table", c.name)
		}
		if got := row(); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s:\nours  %v\nRiver %v", c.name, got, want)
		}
		if !byRiver(c.args) || !ours(c.args) {
			t.Errorf("%s: a second insert was not skipped", c.name)
		}
		// A field outside the unique ones: River calls the job a duplicate, so must we.
		if !ours(c.other) || !byRiver(c.other) {
			t.Errorf("%s: %+v is not a duplicate, as River sees it", c.name, c.other)
		}
		// Through the Discard inserter (billing verify's replay), nothing is written.
		if err := db.Exec(`DELETE FROM river_job WHERE args->>'subscription_id' = $1`, c.sub).Error; err != nil {
			t.Fatal(err)
		}
		inTx(func(tx *sql.Tx) error {
			_, err := uniqueInsert(ctx, jobs.Discard{}, tx, c.args, c.at, c.maxAttempts)
			return err
		})
		var n int64
		if err := db.Raw(`SELECT count(*) FROM river_job WHERE args->>'subscription_id' = $1`, c.sub).Scan(&n).Error; err != nil || n != 0 {
			t.Errorf("%s: %d jobs written through Discard (%v)", c.name, n, err)
		}
	}
}

// uniqueInsert runs jobs.UniqueInsert's statement alone in tx; skipped reports a duplicate.
func uniqueInsert(ctx context.Context, ins jobs.Inserter, tx *sql.Tx, args river.JobArgs, at time.Time, maxAttempts int) (skipped bool, err error) {
	query, params, err := jobs.UniqueInsert(ins, args, at, maxAttempts, 1, jobs.Within{})
	if err != nil || query == "" {
		return false, err
	}
	res, err := tx.ExecContext(ctx, query, params...)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 0, err
}
