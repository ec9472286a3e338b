package appevents

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// asyncQuery runs one statement of the push in a transaction that commits without waiting for
// its WAL to reach the disk (synchronous_commit off for that transaction only), in one round
// trip: set_config and the statement are one pipelined batch, one implicit transaction.
//
// Why: a push's records are many small commits beside the webhooks' own, and each waited for a
// flush of the WAL that the applies wait for too. What a crash of PostgreSQL may lose of them is
// harmless by construction: an attempt's record (the event is pushed again: at least once, which
// the app's dedup on id absorbs) or a lease (it runs out). The events, their sequence and the
// user's due time are written by the change's own transaction, which commits durably.
func asyncQuery(ctx context.Context, db *sql.DB, query string, args []any, scan func(pgx.Rows) error) error {
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	return conn.Raw(func(dc any) error {
		pc, ok := dc.(interface{ Conn() *pgx.Conn })
		if !ok {
			return fmt.Errorf("database driver %T is not pgx", dc)
		}
		b := &pgx.Batch{}
		b.Queue(`SELECT set_config('synchronous_commit', 'off', true)`)
		b.Queue(query, args...)
		br := pc.Conn().SendBatch(ctx, b)
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return err
		}
		rows, err := br.Query()
		if err != nil {
			_ = br.Close()
			return err
		}
		err = scan(rows)
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		return err
	})
}
