package appevents

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"
)

// The feed's order. Event rows are numbered (n) when they are written, but transactions commit
// in another order than they took their numbers: a reader paging by "n > last" would skip a row
// that commits after a higher one was read. So an event gets its place in the feed (feed_pos)
// only once it is visible, from a placer that runs before each page is read: under the mode's
// row of app_event_feed, it takes the events not yet placed that its statement sees, in n
// order, and numbers them after the last place given. Placers run one at a time and commit in
// that order, so the places a reader sees are always 1…K without a hole, and a row that commits
// late is placed late. A user's events are placed in sequence order: the next one is written
// under the user's lock, after the previous one committed.

// ErrUnknownCursor: the feed's after names no event of the mode.
var ErrUnknownCursor = errors.New("app events: after names no event")

// placeBatch bounds the events placed at once.
const placeBatch = 5000

// place gives feed places to the visible events of the mode that have none.
func place(ctx context.Context, db *gorm.DB, livemode bool) error {
	var unplaced bool
	if err := db.WithContext(ctx).Raw(`SELECT EXISTS (SELECT 1 FROM app_events WHERE livemode = $1 AND feed_pos IS NULL)`,
		livemode).Row().Scan(&unplaced); err != nil {
		return fmt.Errorf("app events: feed: %w", err)
	}
	if !unplaced {
		return nil
	}
	return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var last int64
		// The lock first, and the events in the next statement: its snapshot is taken after
		// the previous placer committed, so it never places again what that one placed.
		if err := tx.Raw(`SELECT last_pos FROM app_event_feed WHERE livemode = $1 FOR UPDATE`, livemode).Row().Scan(&last); err != nil {
			return fmt.Errorf("app events: feed lock: %w", err)
		}
		var placed int64
		if err := tx.Raw(`WITH c AS (
			  SELECT id, row_number() OVER (ORDER BY n) AS rn FROM app_events
			  WHERE livemode = $1 AND feed_pos IS NULL ORDER BY n LIMIT $3),
			u AS (UPDATE app_events e SET feed_pos = $2 + c.rn FROM c WHERE e.id = c.id AND e.feed_pos IS NULL RETURNING 1)
			SELECT count(*) FROM u`, livemode, last, placeBatch).Row().Scan(&placed); err != nil {
			return fmt.Errorf("app events: feed place: %w", err)
		}
		return tx.Exec(`UPDATE app_event_feed SET last_pos = last_pos + $2 WHERE livemode = $1`, livemode, placed).Error
	})
}

// Page is one page of the feed.
type Page struct {
	Events  []Body `json:"events"`
	HasMore bool   `json:"has_more"`
}

// Feed reads the mode's events after the one named by after ("" from the start), at most limit.
func Feed(ctx context.Context, db *gorm.DB, livemode bool, after string, limit int) (*Page, error) {
	if err := place(ctx, db, livemode); err != nil {
		return nil, err
	}
	var from int64
	if after != "" {
		var pos sql.NullInt64
		err := db.WithContext(ctx).Raw(`SELECT feed_pos FROM app_events WHERE id = $1 AND livemode = $2`, after, livemode).Row().Scan(&pos)
		if errors.Is(err, sql.ErrNoRows) {
			return nil, ErrUnknownCursor
		}
		if err != nil {
			return nil, fmt.Errorf("app events: feed cursor: %w", err)
		}
		if !pos.Valid {
			// Written after this page's placing began: nothing after it is placed yet.
			return &Page{Events: []Body{}}, nil
		}
		from = pos.Int64
	}
	rows, err := db.WithContext(ctx).Raw(`SELECT id, type, created_at, user_id, sequence, data FROM app_events
		WHERE livemode = $1 AND feed_pos > $2 ORDER BY feed_pos LIMIT $3`, livemode, from, limit+1).Rows()
	if err != nil {
		return nil, fmt.Errorf("app events: feed: %w", err)
	}
	defer rows.Close()
	p := &Page{Events: make([]Body, 0, limit)}
	for rows.Next() {
		var b Body
		var created time.Time
		var data []byte
		if err := rows.Scan(&b.ID, &b.Type, &created, &b.UserID, &b.Sequence, &data); err != nil {
			return nil, fmt.Errorf("app events: feed: %w", err)
		}
		if len(p.Events) == limit {
			p.HasMore = true
			break
		}
		b.Created, b.Livemode, b.Data = created.Unix(), livemode, data
		p.Events = append(p.Events, b)
	}
	return p, rows.Err()
}
