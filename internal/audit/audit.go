// Package audit keeps the admin audit log: who (the admin token's name or fingerprint, never the
// token) did what to which target, when, with what result. An action records itself in its own
// transaction (Record with the transaction's handle), so that the action and its record commit or
// roll back together; an action refused before it changed anything records the refusal alone.
package audit

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"gorm.io/gorm"

	"billing/internal/auth"
)

// Actions recorded.
const (
	ActionReplay         = "replay"
	ActionReplayType     = "replay_type"
	ActionReconcileStart = "reconcile_start"
	// An operator's decision on a usage record past its window (reported or resend).
	ActionUsageReview = "usage_review"
	// An app event pushed again (POST /admin/app-events/{id}/redeliver).
	ActionAppEventRedeliver = "app_event_redeliver"
)

// SystemActor is the actor of an action taken outside an admin request (a command).
const SystemActor = "system"

// Entry is one line of the log, as GET /admin/audit answers it.
type Entry struct {
	ID       int64     `json:"id" gorm:"column:id"`
	At       time.Time `json:"at" gorm:"column:at"`
	Actor    string    `json:"actor" gorm:"column:actor"`
	Action   string    `json:"action" gorm:"column:action"`
	Target   string    `json:"target" gorm:"column:target"`
	Livemode bool      `json:"livemode" gorm:"column:livemode"`
	Result   string    `json:"result" gorm:"column:result"`
}

// Record writes an entry with db, the action's transaction; the actor is the request's
// (auth.Actor), SystemActor outside one.
func Record(ctx context.Context, db *gorm.DB, action, target string, livemode bool, result string) error {
	return RecordBy(ctx, db, auth.Actor(ctx), action, target, livemode, result)
}

// RecordBy is Record with the actor given: for an action that outlives its request (a reconcile
// run started in the background).
func RecordBy(ctx context.Context, db *gorm.DB, actor, action, target string, livemode bool, result string) error {
	if actor == "" {
		actor = SystemActor
	}
	err := db.WithContext(ctx).Exec(`INSERT INTO admin_audit (at, actor, action, target, livemode, result)
		VALUES (clock_timestamp(), $1, $2, $3, $4, $5)`, actor, action, target, livemode, result).Error
	if err != nil {
		return fmt.Errorf("record %s of %s in the audit log: %w", action, target, err)
	}
	return nil
}

// Query selects a page of the log, newest first.
type Query struct {
	// Livemode is the mode of the world acted on; nil for both.
	Livemode *bool
	Actor    string
	Action   string
	// Before is the id of the last entry of the previous page (0: the newest page).
	Before int64
	Limit  int
}

// Page is a page of entries and the cursor of the next one ("" on the last page).
type Page struct {
	Entries []Entry `json:"entries"`
	Next    string  `json:"next_before"`
}

// Log reads the audit log.
type Log struct{ db *gorm.DB }

// NewLog reads the log from db.
func NewLog(db *gorm.DB) *Log { return &Log{db: db} }

// List returns a page of entries, newest first, keyset-paged by id.
func (l *Log) List(ctx context.Context, q Query) (*Page, error) {
	if q.Limit <= 0 {
		q.Limit = 50
	}
	var where []string
	var args []any
	arg := func(v any) string { args = append(args, v); return "$" + strconv.Itoa(len(args)) }
	if q.Livemode != nil {
		where = append(where, "livemode = "+arg(*q.Livemode))
	} else {
		where = append(where, "livemode IN (false, true)")
	}
	if q.Actor != "" {
		where = append(where, "actor = "+arg(q.Actor))
	}
	if q.Action != "" {
		where = append(where, "action = "+arg(q.Action))
	}
	if q.Before > 0 {
		where = append(where, "id < "+arg(q.Before))
	}
	limit := arg(q.Limit + 1)
	entries := []Entry{}
	// Both modes by default: who did what is one story across the deployment's worlds.
	err := l.db.WithContext(ctx).Raw(`SELECT id, at, actor, action, target, livemode, result FROM admin_audit /* all modes */
		WHERE `+strings.Join(where, " AND ")+` ORDER BY id DESC LIMIT `+limit, args...).Scan(&entries).Error
	if err != nil {
		return nil, fmt.Errorf("read the audit log: %w", err)
	}
	p := &Page{Entries: entries}
	if len(entries) > q.Limit {
		p.Entries = entries[:q.Limit]
		p.Next = strconv.FormatInt(p.Entries[q.Limit-1].ID, 10)
	}
	return p, nil
}
