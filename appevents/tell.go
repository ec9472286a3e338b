// Package appevents tells the app what changed: an event per committed change of what the app
// reads (a user's entitlement answer, a charge, a usage record sent to review), written in the
// transaction of the change, numbered per user without gaps, pushed to app_events.url signed by
// the Standard Webhooks specification, and listed as a feed that a reader pages without ever
// skipping one.
//
// A change is an answer that differs from the one last told about the same subject: the caller
// locks the user (Lock), reads the answer as the app would see it right after the change, and
// hands it over (Tell). The lock comes before the read, so two transactions that change one user
// at once tell in turn, the later with what the earlier committed.
package appevents

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"time"

	"gorm.io/gorm"
)

// The types of app events.
const (
	TypeEntitlementUpdated = "entitlement.updated"
	TypeChargeUpdated      = "charge.updated"
	TypeUsageNeedsReview   = "usage.needs_review"
)

// SubjectEntitlement is the subject of a user's entitlement answer.
const SubjectEntitlement = "entitlement"

// ChargeSubject is the subject of an outbound charge (with its refunds).
func ChargeSubject(orderID string) string { return "charge:" + orderID }

// UsageSubject is the subject of a usage record.
func UsageSubject(usageID string) string { return "usage:" + usageID }

// Body is an app event as it is pushed and listed.
type Body struct {
	ID       string          `json:"id"`
	Type     string          `json:"type"`
	Created  int64           `json:"created"`
	Livemode bool            `json:"livemode"`
	UserID   string          `json:"user_id"`
	Sequence int64           `json:"sequence"`
	Data     json.RawMessage `json:"data"`
}

// Teller writes app events in the callers' transactions.
type Teller struct {
	now func() time.Time
}

// NewTeller returns the writer of app events on the clock now (time.Now when nil).
func NewTeller(now func() time.Time) *Teller {
	if now == nil {
		now = time.Now
	}
	return &Teller{now: now}
}

// Locked is a user locked in a transaction for telling one subject.
type Locked struct {
	UserID   string
	Livemode bool
	Subject  string
	// Told is the answer last told about the subject (nil: none yet).
	Told json.RawMessage
	// NextChangeAt is the user's planned time-driven change (entitlement only).
	NextChangeAt *time.Time
	lastSequence int64
}

// Lock locks the user's row (creating it) in tx and reads what was last told about subject.
// It must come before the caller reads the answer it will tell.
func (t *Teller) Lock(ctx context.Context, tx *gorm.DB, userID string, livemode bool, subject string) (*Locked, error) {
	l := &Locked{UserID: userID, Livemode: livemode, Subject: subject}
	q := tx.Statement.ConnPool
	const lock = `SELECT u.last_sequence, u.next_change_at,
		  (SELECT a.answer FROM app_event_answers a WHERE a.user_id = u.user_id AND a.livemode = u.livemode AND a.subject = $3)
		FROM app_event_users u WHERE u.user_id = $1 AND u.livemode = $2 FOR UPDATE OF u`
	for range 2 {
		var told []byte
		var next sql.NullTime
		err := q.QueryRowContext(ctx, lock, userID, livemode, subject).Scan(&l.lastSequence, &next, &told)
		if errors.Is(err, sql.ErrNoRows) {
			// The user's first event: its row, then the lock (another transaction may insert it
			// first; the INSERT then waits for it and skips).
			if _, err := q.ExecContext(ctx, `INSERT INTO app_event_users (user_id, livemode) VALUES ($1, $2) ON CONFLICT DO NOTHING`,
				userID, livemode); err != nil {
				return nil, fmt.Errorf("app events: add user %s: %w", userID, err)
			}
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("app events: lock user %s: %w", userID, err)
		}
		if told != nil {
			l.Told = json.RawMessage(told)
		}
		if next.Valid {
			at := next.Time
			l.NextChangeAt = &at
		}
		return l, nil
	}
	return nil, fmt.Errorf("app events: lock user %s: row not found after insert", userID)
}

// Change is what a caller tells about a locked subject.
type Change struct {
	Type string
	// Answer is the subject's answer now, as the app reads it (a JSON object).
	Answer any
	// Baseline is what counts as told before anything was (the entitlement of a user with
	// nothing: not entitled, status none); nil: a first answer is a change.
	Baseline json.RawMessage
	// WithPrevious adds "previous": {field: old value} of the fields that changed.
	WithPrevious bool
	// Plan sets the user's next time-driven change to NextChangeAt (nil: none).
	Plan         bool
	NextChangeAt *time.Time
}

// Tell writes the event of c in tx when its answer differs from the one last told, and
// returns it (nil when nothing changed). The user must be locked by Lock in the same tx.
func (t *Teller) Tell(ctx context.Context, tx *gorm.DB, l *Locked, c Change) (*Body, error) {
	answer, err := json.Marshal(c.Answer)
	if err != nil {
		return nil, fmt.Errorf("app events: encode %s of user %s: %w", c.Type, l.UserID, err)
	}
	told := l.Told
	if told == nil {
		told = c.Baseline
	}
	var prev map[string]any
	changed := true
	if told != nil {
		if prev, changed, err = diff(told, answer); err != nil {
			return nil, fmt.Errorf("app events: compare %s of user %s: %w", c.Type, l.UserID, err)
		}
	}
	planChanged := c.Plan && !sameTime(l.NextChangeAt, c.NextChangeAt)
	if !changed {
		if planChanged {
			if _, err := tx.Statement.ConnPool.ExecContext(ctx,
				`UPDATE app_event_users SET next_change_at = $3 WHERE user_id = $1 AND livemode = $2`,
				l.UserID, l.Livemode, c.NextChangeAt); err != nil {
				return nil, fmt.Errorf("app events: plan user %s: %w", l.UserID, err)
			}
			l.NextChangeAt = c.NextChangeAt
		}
		return nil, nil
	}
	data := answer
	if c.WithPrevious {
		if prev == nil {
			prev = map[string]any{}
		}
		if data, err = withPrevious(answer, prev); err != nil {
			return nil, fmt.Errorf("app events: encode %s of user %s: %w", c.Type, l.UserID, err)
		}
	}
	now := t.now().UTC()
	b := &Body{ID: NewID(), Type: c.Type, Created: now.Unix(), Livemode: l.Livemode, UserID: l.UserID,
		Sequence: l.lastSequence + 1, Data: data}

	// The user is due to be pushed now unless a push is waiting already (its head first).
	const write = `WITH u AS (UPDATE app_event_users SET last_sequence = $9, wakes = wakes + 1,
		  next_change_at = CASE WHEN $10 THEN CAST($11 AS timestamptz) ELSE next_change_at END,
		  push_due_at = coalesce(push_due_at, CAST($7 AS timestamptz))
		WHERE user_id = $1 AND livemode = $2 AND last_sequence = $9 - 1 RETURNING 1),
		a AS (INSERT INTO app_event_answers (user_id, livemode, subject, answer) VALUES ($1, $2, $3, $4)
		  ON CONFLICT (user_id, livemode, subject) DO UPDATE SET answer = EXCLUDED.answer),
		e AS (INSERT INTO app_events (id, user_id, livemode, sequence, type, subject, created_at, data, next_at)
		  SELECT $5, $1, $2, $9, $6, $3, $7, CAST($8 AS jsonb), $7 FROM u RETURNING id),
		q AS (INSERT INTO app_event_queue (livemode, user_id, sequence, id, created_at) SELECT $2, $1, $9, $5, $7 FROM e)
		SELECT count(*) FROM e`
	args := []any{l.UserID, l.Livemode, l.Subject, string(answer), b.ID, c.Type, now, string(data), b.Sequence,
		c.Plan, c.NextChangeAt}
	var n int
	if err := tx.Statement.ConnPool.QueryRowContext(ctx, write, args...).Scan(&n); err != nil {
		return nil, fmt.Errorf("app events: write %s of user %s: %w", c.Type, l.UserID, err)
	}
	if n != 1 {
		// The lock was not Lock's, or another writer numbered past it: never a gap or a repeat.
		return nil, fmt.Errorf("app events: user %s is not locked at sequence %d", l.UserID, l.lastSequence)
	}
	l.lastSequence, l.Told = b.Sequence, answer
	if c.Plan {
		l.NextChangeAt = c.NextChangeAt
	}
	return b, nil
}

// diff compares two JSON objects: prev holds the old value of every field whose value differs.
func diff(oldJSON, newJSON []byte) (prev map[string]any, changed bool, err error) {
	var o, n map[string]any
	if err := json.Unmarshal(oldJSON, &o); err != nil {
		return nil, false, err
	}
	if err := json.Unmarshal(newJSON, &n); err != nil {
		return nil, false, err
	}
	prev = map[string]any{}
	for k, nv := range n {
		if ov, ok := o[k]; !ok || !reflect.DeepEqual(ov, nv) {
			prev[k] = ov
		}
	}
	for k, ov := range o {
		if _, ok := n[k]; !ok {
			prev[k] = ov
		}
	}
	return prev, len(prev) > 0, nil
}

// withPrevious is the object answer with "previous": prev added.
func withPrevious(answer []byte, prev map[string]any) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(answer, &m); err != nil {
		return nil, err
	}
	p, err := json.Marshal(prev)
	if err != nil {
		return nil, err
	}
	m["previous"] = p
	return json.Marshal(m)
}

func sameTime(a, b *time.Time) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	// The column keeps microseconds.
	return a.Truncate(time.Microsecond).Equal(b.Truncate(time.Microsecond))
}

// NewID returns a new event id: "aevt_" and 24 random hex digits.
func NewID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "aevt_" + hex.EncodeToString(b[:])
}
