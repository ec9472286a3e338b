package webhooks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"gorm.io/gorm"

	"billing/internal/audit"
)

// The reads of the admin console: the event log with filters, search and keyset paging, one
// event with its dead letter, the events that name an object, the backlog, and the dead letters
// by type with their bulk replay.

// LoggedEvent is one entry of the event log with the object it names, read from the payload.
type LoggedEvent struct {
	EventView
	// EventCreated is the event's own created time (Stripe's clock).
	EventCreated *time.Time `gorm:"column:event_created"`
	// ObjectID and ObjectType are data.object.id and data.object.object.
	ObjectID   *string `gorm:"column:object_id"`
	ObjectType *string `gorm:"column:object_type"`
	// SubscriptionID and CustomerID are data.object.subscription and data.object.customer when
	// they are ids (not expanded objects).
	SubscriptionID *string `gorm:"column:object_subscription"`
	CustomerID     *string `gorm:"column:object_customer"`
	// Object is data.object, filled by EventsNaming only.
	Object json.RawMessage `gorm:"-"`
}

// objectColumns read the named object from the payload.
const objectColumns = `e.payload->'data'->'object'->>'id' AS object_id,
	e.payload->'data'->'object'->>'object' AS object_type,
	CASE WHEN jsonb_typeof(e.payload->'data'->'object'->'subscription') = 'string'
	     THEN e.payload->'data'->'object'->>'subscription' END AS object_subscription,
	CASE WHEN jsonb_typeof(e.payload->'data'->'object'->'customer') = 'string'
	     THEN e.payload->'data'->'object'->>'customer' END AS object_customer`

const loggedColumns = `e.event_id, e.type, e.status, e.livemode, e.api_version, e.attempts, e.received_at,
	e.processed_at, e.failure_reason, e.event_created, ` + objectColumns

// namesObject is true for an event whose object, or the object's subscription or customer, is $n.
// ->> of an expanded object is its JSON text, which never equals an id. The array is the
// expression of webhook_events_object_ids_idx, written exactly as there so that the planner
// matches it: without the index, a search reads every payload. Overlap with one id is
// containment, and && has no @, which gorm's Raw would take for a named argument.
func namesObject(n int) string {
	return `ARRAY[e.payload->'data'->'object'->>'id', e.payload->'data'->'object'->>'subscription', ` +
		`e.payload->'data'->'object'->>'customer'] && ARRAY[CAST($` + strconv.Itoa(n) + ` AS text)]`
}

// EventCursor is a position in the log, newest first: (received_at, event_id).
type EventCursor struct {
	ReceivedAt time.Time
	EventID    string
}

// String is the cursor as a URL parameter.
func (c EventCursor) String() string {
	return c.ReceivedAt.UTC().Format(time.RFC3339Nano) + "|" + c.EventID
}

// ParseEventCursor reads EventCursor.String.
func ParseEventCursor(s string) (EventCursor, error) {
	ts, id, ok := strings.Cut(s, "|")
	if !ok {
		return EventCursor{}, errors.New("cursor is not TIME|EVENT_ID")
	}
	t, err := time.Parse(time.RFC3339Nano, ts)
	if err != nil {
		return EventCursor{}, fmt.Errorf("cursor time: %w", err)
	}
	return EventCursor{ReceivedAt: t, EventID: id}, nil
}

// EventQuery selects a page of the log. Zero fields do not filter.
type EventQuery struct {
	Type     string
	Status   string
	Livemode *bool
	// ReceivedFrom (inclusive) and ReceivedTo (exclusive) bound received_at.
	ReceivedFrom, ReceivedTo time.Time
	// Search is an event id, or the id of the object an event names (data.object.id, or its
	// subscription or customer).
	Search string
	// Before pages to older entries, After to newer ones; at most one is set.
	Before, After *EventCursor
	Limit         int
}

// EventPage is a page of the log, newest first.
type EventPage struct {
	Events []LoggedEvent
	// HasOlder and HasNewer say whether entries exist past either end of the page.
	HasOlder, HasNewer bool
}

// SearchEvents reads a page of the event log. The paging is by keyset on (received_at,
// event_id), so a page costs the same however deep it is and entries arriving meanwhile do not
// shift it.
func (i *Inbox) SearchEvents(ctx context.Context, q EventQuery) (*EventPage, error) {
	if q.Limit < 1 {
		q.Limit = 50
	}
	if q.Status != "" && !eventStatuses[q.Status] {
		return nil, fmt.Errorf("unknown status %q", q.Status)
	}
	where := []string{`e.source = 'stripe'`}
	args := []any{}
	add := func(cond string, v any) {
		args = append(args, v)
		where = append(where, strings.ReplaceAll(cond, "$?", "$"+strconv.Itoa(len(args))))
	}
	if q.Type != "" {
		add(`e.type = $?`, q.Type)
	}
	if q.Status != "" {
		add(`e.status = $?`, q.Status)
	}
	if q.Livemode != nil {
		add(`e.livemode = $?`, *q.Livemode)
	}
	if !q.ReceivedFrom.IsZero() {
		add(`e.received_at >= $?`, q.ReceivedFrom)
	}
	if !q.ReceivedTo.IsZero() {
		add(`e.received_at < $?`, q.ReceivedTo)
	}
	// The events naming an object are found first, through the GIN index (and the key for an event
	// id), then ordered: a condition on the ordered scan made the planner walk received_at through
	// every payload for a page of 50 when it guessed that 0.5% of the rows match and one did.
	named := ""
	if q.Search != "" {
		args = append(args, q.Search)
		n := strconv.Itoa(len(args))
		named = `WITH named AS MATERIALIZED ( /* all modes: the mode filter, if any, applies below */
			SELECT event_id, livemode FROM webhook_events WHERE event_id = $` + n + `
			UNION SELECT e.event_id, e.livemode FROM webhook_events e WHERE ` + namesObject(len(args)) + `)
		`
	}
	order := `DESC`
	switch {
	case q.Before != nil:
		args = append(args, q.Before.ReceivedAt, q.Before.EventID)
		where = append(where, fmt.Sprintf(`(e.received_at, e.event_id COLLATE "C") < ($%d, $%d COLLATE "C")`, len(args)-1, len(args)))
	case q.After != nil:
		args = append(args, q.After.ReceivedAt, q.After.EventID)
		where = append(where, fmt.Sprintf(`(e.received_at, e.event_id COLLATE "C") > ($%d, $%d COLLATE "C")`, len(args)-1, len(args)))
		order = `ASC`
	}
	args = append(args, q.Limit+1)
	from := ` FROM webhook_events e /* all modes, unless filtered */`
	if named != "" {
		from += ` JOIN named ON named.event_id = e.event_id AND named.livemode = e.livemode`
	}
	sql := `/* all modes */ ` + named + `SELECT ` + loggedColumns + from + ` WHERE ` + strings.Join(where, ` AND `) +
		` ORDER BY e.received_at ` + order + `, e.event_id COLLATE "C" ` + order + ` LIMIT $` + strconv.Itoa(len(args))
	rows := []LoggedEvent{}
	if err := i.cfg.DB.WithContext(ctx).Raw(sql, args...).Scan(&rows).Error; err != nil {
		return nil, fmt.Errorf("search events: %w", err)
	}
	more := len(rows) > q.Limit
	if more {
		rows = rows[:q.Limit]
	}
	page := &EventPage{Events: rows}
	switch {
	case q.After != nil:
		slices.Reverse(page.Events)
		page.HasNewer, page.HasOlder = more, true
	case q.Before != nil:
		page.HasOlder, page.HasNewer = more, true
	default:
		page.HasOlder = more
	}
	return page, nil
}

// EventDetail is one event with its payload and, when dead-lettered, its dead letter.
type EventDetail struct {
	LoggedEvent
	DeadLetter *DeadLetter
}

// EventDetail returns an event, or nil when there is none with that id.
func (i *Inbox) EventDetail(ctx context.Context, eventID string) (*EventDetail, error) {
	var rows []struct {
		LoggedEvent
		PayloadText string     `gorm:"column:payload_text"`
		LastError   *string    `gorm:"column:last_error"`
		DeadAt      *time.Time `gorm:"column:dead_at"`
		DeadTries   *int       `gorm:"column:dead_attempts"`
	}
	err := i.cfg.DB.WithContext(ctx).Raw(`
		SELECT `+loggedColumns+`, e.payload::text AS payload_text,
		       d.last_error, d.dead_at, d.attempts AS dead_attempts
		FROM webhook_events e LEFT JOIN webhook_dead_letters d ON d.event_id = e.event_id AND d.livemode = e.livemode
		WHERE e.event_id = $1 /* all modes: the live one first when an id is in both */
		ORDER BY e.livemode DESC`, eventID).Scan(&rows).Error
	if err != nil {
		return nil, fmt.Errorf("load event %s: %w", eventID, err)
	}
	if len(rows) == 0 {
		return nil, nil
	}
	r := rows[0]
	d := &EventDetail{LoggedEvent: r.LoggedEvent}
	d.Payload = json.RawMessage(r.PayloadText)
	if r.DeadAt != nil {
		d.DeadLetter = &DeadLetter{EventID: r.EventID, Type: r.Type, Livemode: r.Livemode, DeadAt: *r.DeadAt}
		if r.LastError != nil {
			d.DeadLetter.LastError = *r.LastError
		}
		if r.DeadTries != nil {
			d.DeadLetter.Attempts = *r.DeadTries
		}
	}
	return d, nil
}

// EventsNaming returns the newest limit events whose object is objectID or whose object's
// subscription or customer is, with their objects, oldest first (by created, then receipt).
func (i *Inbox) EventsNaming(ctx context.Context, objectID string, limit int) ([]LoggedEvent, error) {
	var rows []struct {
		LoggedEvent
		ObjectText *string `gorm:"column:object_text"`
	}
	err := i.cfg.DB.WithContext(ctx).Raw(`/* all modes */
		SELECT `+loggedColumns+`, (e.payload->'data'->'object')::text AS object_text
		FROM webhook_events e
		WHERE e.source = 'stripe' AND `+namesObject(1)+`
		ORDER BY coalesce(e.event_created, e.received_at) DESC, e.received_at DESC, e.event_id DESC
		LIMIT $2`, objectID, limit).Scan(&rows).Error
	if err != nil {
		return nil, fmt.Errorf("load events naming %s: %w", objectID, err)
	}
	out := make([]LoggedEvent, len(rows))
	for k, r := range rows {
		out[len(rows)-1-k] = r.LoggedEvent
		if r.ObjectText != nil {
			out[len(rows)-1-k].Object = json.RawMessage(*r.ObjectText)
		}
	}
	return out, nil
}

// InboxStats is the backlog as the console's overview shows it.
type InboxStats struct {
	DeadLetters int64 `gorm:"column:dead_letters"`
	// Waiting are the events stored and not processed yet; OldestWaiting the receipt of the oldest.
	Waiting       int64      `gorm:"column:waiting"`
	OldestWaiting *time.Time `gorm:"column:oldest_waiting"`
	// The processing lag (receipt to commit) of the events received since the given moment and
	// processed: how many, the median and the longest, in seconds.
	LagEvents int64    `gorm:"column:lag_events"`
	LagMedian *float64 `gorm:"column:lag_median"`
	LagMax    *float64 `gorm:"column:lag_max"`
}

// Stats counts the backlog and measures the lag of the events received since since.
func (i *Inbox) Stats(ctx context.Context, since time.Time) (*InboxStats, error) {
	var s InboxStats
	err := i.cfg.DB.WithContext(ctx).Raw(`/* all modes */
		SELECT (SELECT count(*) FROM webhook_dead_letters) AS dead_letters,
		       w.waiting, w.oldest_waiting, l.lag_events, l.lag_median, l.lag_max
		FROM (SELECT count(*) AS waiting, min(received_at) AS oldest_waiting
		      FROM webhook_events WHERE status = 'received') w,
		     (SELECT count(*) AS lag_events,
		             percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM processed_at - received_at)) AS lag_median,
		             max(extract(epoch FROM processed_at - received_at))::float8 AS lag_max
		      FROM webhook_events WHERE status = 'processed' AND received_at >= $1 AND processed_at IS NOT NULL) l`,
		since).Scan(&s).Error
	if err != nil {
		return nil, fmt.Errorf("count webhook backlog: %w", err)
	}
	return &s, nil
}

// DeadLetterQuery selects dead letters, newest first. Zero fields do not filter.
type DeadLetterQuery struct {
	Type string
	// DeadAtOrBefore leaves out events dead-lettered later (again, after a replay).
	DeadAtOrBefore time.Time
	// Before pages: only dead letters older than this (dead_at, event_id).
	Before *EventCursor
	Limit  int
}

// DeadLetterList lists dead letters, newest first.
func (i *Inbox) DeadLetterList(ctx context.Context, q DeadLetterQuery) ([]DeadLetter, error) {
	sql, args := deadLetterWhere(q)
	if q.Limit < 1 {
		q.Limit = 100
	}
	args = append(args, q.Limit)
	out := []DeadLetter{}
	err := i.cfg.DB.WithContext(ctx).Raw(`
		SELECT d.event_id, e.type, e.livemode, d.attempts, d.last_error, d.dead_at
		FROM webhook_dead_letters d JOIN webhook_events e USING (event_id, livemode) /* all modes */`+sql+`
		ORDER BY d.dead_at DESC, d.event_id DESC LIMIT $`+strconv.Itoa(len(args)), args...).Scan(&out).Error
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	return out, nil
}

func deadLetterWhere(q DeadLetterQuery) (string, []any) {
	var where []string
	var args []any
	if q.Type != "" {
		args = append(args, q.Type)
		where = append(where, `e.type = $`+strconv.Itoa(len(args)))
	}
	if !q.DeadAtOrBefore.IsZero() {
		args = append(args, q.DeadAtOrBefore)
		where = append(where, `d.dead_at <= $`+strconv.Itoa(len(args)))
	}
	if q.Before != nil {
		args = append(args, q.Before.ReceivedAt, q.Before.EventID)
		where = append(where, `(d.dead_at, d.event_id) < ($`+strconv.Itoa(len(args)-1)+`, $`+strconv.Itoa(len(args))+`)`)
	}
	if len(where) == 0 {
		return "", nil
	}
	return ` WHERE ` + strings.Join(where, ` AND `), args
}

// DeadLetterType is how many dead letters one event type has.
type DeadLetterType struct {
	Type   string    `gorm:"column:type"`
	Count  int64     `gorm:"column:count"`
	Newest time.Time `gorm:"column:newest"`
}

// DeadLetterTypes counts the dead letters by event type, the most numerous first.
func (i *Inbox) DeadLetterTypes(ctx context.Context) ([]DeadLetterType, error) {
	out := []DeadLetterType{}
	err := i.cfg.DB.WithContext(ctx).Raw(`
		SELECT e.type, count(*) AS count, max(d.dead_at) AS newest
		FROM webhook_dead_letters d JOIN webhook_events e USING (event_id, livemode) /* all modes */
		GROUP BY e.type ORDER BY count(*) DESC, e.type`).Scan(&out).Error
	if err != nil {
		return nil, fmt.Errorf("count dead letters: %w", err)
	}
	return out, nil
}

// CountDeadLetters counts the dead letters q selects (its Limit aside).
func (i *Inbox) CountDeadLetters(ctx context.Context, q DeadLetterQuery) (int64, error) {
	sql, args := deadLetterWhere(q)
	var n int64
	err := i.cfg.DB.WithContext(ctx).Raw(`/* all modes */ SELECT count(*) FROM webhook_dead_letters d JOIN webhook_events e USING (event_id, livemode)`+sql, args...).
		Scan(&n).Error
	if err != nil {
		return 0, fmt.Errorf("count dead letters: %w", err)
	}
	return n, nil
}

// ReplayDeadLetters replays, one transaction each (Replay), at most limit of the dead letters q
// selects, and returns how many it replayed and how many q still selects. An event that is no
// longer failed when its turn comes (another admin replayed it) is passed over. Bounding q by
// DeadAtOrBefore keeps an event that fails again at once from being replayed in a loop.
func (i *Inbox) ReplayDeadLetters(ctx context.Context, q DeadLetterQuery, limit int) (replayed int, remaining int64, err error) {
	const batch = 100
	for replayed < limit {
		q.Limit = min(batch, limit-replayed)
		list, err := i.DeadLetterList(ctx, q)
		if err != nil {
			return replayed, 0, err
		}
		if len(list) == 0 {
			break
		}
		progress := false
		for _, d := range list {
			_, err := i.replay(ctx, d.EventID, audit.ActionReplayType, "replayed with every dead letter of type "+q.Type)
			switch {
			case errors.Is(err, ErrNotReplayable), errors.Is(err, gorm.ErrRecordNotFound):
				continue
			case err != nil:
				return replayed, 0, err
			}
			replayed++
			progress = true
		}
		if !progress {
			break
		}
	}
	remaining, err = i.CountDeadLetters(ctx, q)
	return replayed, remaining, err
}

// HandledTypes lists the event types that have a handler, sorted.
func (i *Inbox) HandledTypes() []string {
	if i.cfg.Registry == nil {
		return nil
	}
	return i.cfg.Registry.Types()
}
