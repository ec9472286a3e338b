package webhooks

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/labstack/echo/v4"
	"github.com/riverqueue/river"
	"gorm.io/gorm"

	"billing/internal/apierr"
	"billing/internal/database"
	"billing/internal/httpserver"
	"billing/internal/jobs"
	"billing/internal/jsonkeys"
)

// MaxBodyBytes caps a delivery. Stripe's events are a few KB; 1 MiB leaves room for large
// invoices without letting a client make us buffer without bound.
const MaxBodyBytes = 1 << 20

// Delivery results, answered as {"status": …}.
const (
	ResultReceived  = "received"
	ResultDuplicate = "duplicate"
	ResultIgnored   = "ignored"
)

// envelope is the part of an event the inbox reads; handlers get the rest.
type envelope struct {
	ID         string     `json:"id"`
	Object     string     `json:"object"`
	Type       string     `json:"type"`
	Livemode   *bool      `json:"livemode"`
	APIVersion *string    `json:"api_version"`
	Created    int64      `json:"created"`
	Data       *eventData `json:"data"`
}

type eventData struct {
	Object             json.RawMessage `json:"object"`
	PreviousAttributes json.RawMessage `json:"previous_attributes"`
}

// checkEnvelope checks that an envelope read from a body is a Stripe event the inbox can store.
func checkEnvelope(env envelope) error {
	switch {
	case env.Object != "event":
		return errors.New(`body is not a Stripe event: "object" is not "event"`)
	case env.ID == "" || len(env.ID) > 255:
		return errors.New(`event has no valid "id"`)
	case env.Type == "" || len(env.Type) > 255:
		return errors.New(`event has no valid "type"`)
	case env.Livemode == nil:
		return errors.New(`event has no "livemode"`)
	case env.Data == nil || len(bytes.TrimSpace(env.Data.Object)) == 0:
		return errors.New(`event has no "data.object"`)
	case env.Created > maxCreated:
		return errors.New(`event has no valid "created"`)
	}
	return nil
}

// readEvent reads a verified body in one walk (jsonkeys.Scan): the duplicate-key verdict, and
// the envelope from the walk's members, with data.object and data.previous_attributes as slices
// of the body, which the handler decodes. The verdict comes first: the envelope's keys match
// case-insensitively (as encoding/json matches them) and PostgreSQL's jsonb keeps the last of
// exact duplicates, so a body with "type" and "TYPE", or two "id", could be checked as one event
// and stored as another.
func readEvent(body []byte) (envelope, apierr.Code, error) {
	members, err := jsonkeys.Scan(body)
	if err != nil {
		if errors.Is(err, jsonkeys.ErrDuplicateKey) {
			return envelope{}, apierr.CodeAmbiguousJSON, fmt.Errorf("body is ambiguous JSON: %w", err)
		}
		return envelope{}, apierr.CodeNotAnEvent, fmt.Errorf("body is not a JSON event: %w", err)
	}
	env, err := envelopeOf(body, members)
	if err == nil {
		err = checkEnvelope(env)
	}
	if err != nil {
		return env, apierr.CodeNotAnEvent, err
	}
	return env, "", nil
}

// envelopeOf reads the envelope from the members of a checked body exactly as json.Unmarshal
// into envelope reads it (FuzzDecodeEnvelope holds them equal): a key takes the field of its
// exact name, else of its name under encoding/json's folding; null leaves a value and clears a
// pointer; a value of another JSON type is an error.
func envelopeOf(body []byte, members []jsonkeys.Member) (envelope, error) {
	var env envelope
	if b := bytes.TrimSpace(body); len(b) == 0 || b[0] != '{' {
		if string(b) == "null" {
			return env, nil
		}
		return env, errors.New("body is not a JSON event: not an object")
	}
	for _, m := range members {
		var ok bool
		switch fieldOf(m.Key, "id", "object", "type", "livemode", "api_version", "created", "data") {
		case "id":
			ok = jsonString(m.Value, &env.ID)
		case "object":
			ok = jsonString(m.Value, &env.Object)
		case "type":
			ok = jsonString(m.Value, &env.Type)
		case "livemode":
			switch string(m.Value) {
			case "true", "false":
				v := m.Value[0] == 't'
				env.Livemode, ok = &v, true
			case "null":
				env.Livemode, ok = nil, true
			}
		case "api_version":
			if string(m.Value) == "null" {
				env.APIVersion, ok = nil, true
			} else {
				var v string
				if ok = jsonString(m.Value, &v); ok {
					env.APIVersion = &v
				}
			}
		case "created":
			ok = jsonInt(m.Value, &env.Created)
		case "data":
			switch m.Value[0] {
			case 'n':
				env.Data, ok = nil, true
			case '{':
				if env.Data == nil {
					env.Data = &eventData{}
				}
				for _, d := range m.Members {
					switch fieldOf(d.Key, "object", "previous_attributes") {
					case "object":
						env.Data.Object = d.Value
					case "previous_attributes":
						env.Data.PreviousAttributes = d.Value
					}
				}
				ok = true
			}
		default:
			ok = true
		}
		if !ok {
			return env, fmt.Errorf("body is not a JSON event: %q has the wrong type", m.Key)
		}
	}
	return env, nil
}

// fieldOf is the name among names that key selects, as encoding/json selects a struct field:
// the exact name, else the one equal under its folding; "" for none.
func fieldOf(key string, names ...string) string {
	for _, n := range names {
		if key == n {
			return n
		}
	}
	folded := foldName(key)
	for _, n := range names {
		if folded == foldName(n) {
			return n
		}
	}
	return ""
}

// foldName is encoding/json's folding of field names: ASCII letters upper-cased, other runes
// mapped to the smallest rune of their simple folding orbit (so that foldName(x) == foldName(y)
// exactly when strings.EqualFold(x, y), the equality jsonkeys refuses duplicates by).
func foldName(s string) string {
	b := make([]byte, 0, len(s))
	for _, r := range s {
		switch {
		case 'a' <= r && r <= 'z':
			b = append(b, byte(r-'a'+'A'))
		case r < utf8.RuneSelf:
			b = append(b, byte(r))
		default:
			for {
				f := unicode.SimpleFold(r)
				if f <= r {
					r = f
					break
				}
				r = f
			}
			b = utf8.AppendRune(b, r)
		}
	}
	return string(b)
}

// jsonString decodes a JSON string into *dst (null leaves it); false for another type.
func jsonString(v []byte, dst *string) bool {
	switch v[0] {
	case 'n':
		return true
	case '"':
	default:
		return false
	}
	if bytes.IndexByte(v, '\\') < 0 && isASCII(v) {
		*dst = string(v[1 : len(v)-1])
		return true
	}
	return json.Unmarshal(v, dst) == nil
}

// jsonInt decodes a JSON number that is an int64, as encoding/json does (null leaves *dst).
func jsonInt(v []byte, dst *int64) bool {
	if string(v) == "null" {
		return true
	}
	if v[0] != '-' && (v[0] < '0' || v[0] > '9') {
		return false
	}
	n, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil {
		return false
	}
	*dst = n
	return true
}

func isASCII(b []byte) bool {
	for _, c := range b {
		if c >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// maxCreated (9999-12-31T23:59:59Z) bounds an event's "created": beyond, pgx silently wraps the
// timestamp or PostgreSQL refuses it (a 500 that Stripe would retry for days).
const maxCreated = 253402300799

func (e envelope) key() EventKey { return EventKey{ID: e.ID, Livemode: *e.Livemode} }

// duplicate answers a delivery whose id is stored already in its mode. The stored row must be
// the same event: one of another type under the same id is not Stripe's redelivery but a forgery
// or a bug, and is refused rather than acknowledged as something it is not.
func (i *Inbox) duplicate(ctx context.Context, env envelope) (storeResult, error) {
	var stored string
	err := i.cfg.DB.Statement.ConnPool.QueryRowContext(ctx,
		`SELECT type FROM webhook_events WHERE event_id = $1 AND livemode = $2`, env.ID, *env.Livemode).Scan(&stored)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		// Pruned between the conflict and this read: it was stored, so it is a duplicate.
		return storeResult{ResultDuplicate, ResultDuplicate}, nil
	case err != nil:
		return storeResult{}, fmt.Errorf("read stored event %s: %w", env.ID, err)
	case stored != env.Type:
		return storeResult{}, fmt.Errorf("%w: event %s is stored with type %s; this delivery says %s", errEventIDConflict, env.ID, stored, env.Type)
	}
	return storeResult{ResultDuplicate, ResultDuplicate}, nil
}

// errEventIDConflict: a delivery's id is stored, in its mode, with another type.
var errEventIDConflict = errors.New("event id taken by another event")

// storedPayload is what is kept of a delivery: the whole body of a handled event, and only the
// envelope of an ignored one. Nothing reads an ignored event's object, and keeping it would let
// anyone with a signing secret grow the database by a megabyte a request for the retention's
// 90 days.
func storedPayload(env envelope, body []byte, handled bool) string {
	if handled {
		return string(body)
	}
	b, _ := json.Marshal(map[string]any{
		"id": env.ID, "object": "event", "type": env.Type, "livemode": *env.Livemode,
		"created": env.Created, "api_version": env.APIVersion,
		"body_omitted": true, "body_bytes": len(body),
	})
	return string(b)
}

func (e envelope) apiVersion() string {
	if e.APIVersion == nil {
		return ""
	}
	return *e.APIVersion
}

func (i *Inbox) reject(code apierr.Code, err error, format string, args ...any) error {
	i.metrics.rejected.WithLabelValues(string(code)).Inc()
	return apierr.Wrap(err, code, format, args...)
}

// MountWebhook registers POST /webhooks/stripe.
func (i *Inbox) MountWebhook(e *echo.Echo) {
	e.POST("/webhooks/stripe", i.receive)
}

// receive verifies, stores and acknowledges one delivery. Its durable effects commit together
// before the 200: the event row and either its applied effects or its processing job.
func (i *Inbox) receive(c echo.Context) error {
	// The header first: a request that cannot be signed costs no read of its body.
	header := c.Request().Header.Get("Stripe-Signature")
	if header == "" {
		return i.reject(apierr.CodeMissingSignature, nil, "the Stripe-Signature header is missing")
	}
	if _, err := parseSignatureHeader(header); err != nil {
		return i.reject(apierr.CodeMalformedSignature, err, "the Stripe-Signature header is malformed: expected t=<timestamp>,v1=<hex signature>")
	}
	// The raw body, read whole before anything can parse it (the signature covers these exact
	// bytes), under the byte budget shared by every delivery not yet verified.
	body, release, err := i.bodies.ReadBody(c.Request(), MaxBodyBytes)
	defer release()
	switch {
	case errors.Is(err, httpserver.ErrBodyTooLarge):
		return i.reject(apierr.CodeBodyTooLarge, nil, "body exceeds %d bytes", MaxBodyBytes)
	case errors.Is(err, httpserver.ErrBudgetSpent):
		c.Response().Header().Set("Retry-After", "1")
		return i.reject(apierr.CodeBusy, nil, "too many deliveries are being received right now; retry later")
	case err != nil:
		return i.reject(apierr.CodeInvalidRequest, err, "could not read the request body")
	}
	// Verify before reading anything of the body, with the secrets of both modes: an unsigned
	// caller learns neither how a parser reads its body nor which modes have secrets.
	modes, err := VerifySignatureModes(body, header, i.secrets(false), i.secrets(true), i.cfg.Tolerance, i.cfg.Now())
	switch {
	case errors.Is(err, ErrStaleTimestamp):
		return i.reject(apierr.CodeStaleTimestamp, err, "the signature timestamp is more than %s from the current time", i.cfg.Tolerance)
	case errors.Is(err, ErrBadSignature):
		return i.reject(apierr.CodeInvalidSignature, err, "no signature matches a configured webhook secret")
	case err != nil:
		return i.reject(apierr.CodeMalformedSignature, err, "the Stripe-Signature header is malformed")
	}
	env, code, err := readEvent(body)
	if err != nil {
		return i.reject(code, err, "%s", err.Error())
	}
	// The mode is the signer's: a secret of one mode never gets an event of the other stored.
	if !modes.Has(*env.Livemode) {
		return i.reject(apierr.CodeLivemodeMismatch, nil, "the event has livemode %t but is signed with a %s-mode webhook secret",
			*env.Livemode, mode(!*env.Livemode))
	}

	result, err := i.store(c.Request().Context(), env, body)
	if errors.Is(err, errEventIDConflict) {
		return i.reject(apierr.CodeEventIDConflict, err, "%s", err.Error())
	}
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "22") {
			// A data exception: jsonb refuses some JSON that Go accepts (\u0000, invalid UTF-8,
			// numbers out of range). No retry could ever store it, so it must not be a 5xx.
			return i.reject(apierr.CodeNotAnEvent, err, "the event cannot be stored: %s", pgErr.Message)
		}
		if database.IsUnavailable(err) {
			return apierr.Wrap(err, apierr.CodeDatabaseDown, "the event could not be stored; retry later")
		}
		return apierr.Wrap(err, apierr.CodeInternal, "the event could not be stored; retry later")
	}
	i.metrics.received.WithLabelValues(i.typeLabel(env.Type), mode(*env.Livemode), result.metric).Inc()
	return c.JSON(http.StatusOK, map[string]string{"status": result.status, "event_id": env.ID})
}

type storeResult struct{ status, metric string }

// typeLabel is an event type as a metric label: the handled types by name, every other one as
// "other", so that signed events of made-up types cannot add series without bound.
func (i *Inbox) typeLabel(typ string) string {
	if _, ok := i.cfg.Registry.Lookup(typ); ok {
		return typ
	}
	return "other"
}

// store inserts the event and, for a handled type, its processing job (or, for an event of
// another API version, its dead letter), atomically. ON CONFLICT DO NOTHING makes concurrent
// deliveries of one event wait for each other on the primary key: exactly one inserts, the others
// answer duplicate.
//
// It is one statement (data-modifying CTEs, so one implicit transaction) instead of
// BEGIN / INSERT / River's InsertTx / COMMIT: one round trip to PostgreSQL instead of four, which
// on the hot path of every delivery is most of the cost. The job row is written the way River's
// own clients for other languages insert jobs, by processJobInsert; River picks it up like any
// other job, and a test checks that it is the row River's InsertTx writes.
func (i *Inbox) store(ctx context.Context, env envelope, body []byte) (storeResult, error) {
	status, res := "received", storeResult{ResultReceived, ResultReceived}
	var failure, deadMsg *string
	_, handled := i.cfg.Registry.Lookup(env.Type)
	mismatch := env.apiVersion() != PinnedAPIVersion
	switch {
	case !handled:
		status, res = "ignored", storeResult{ResultIgnored, ResultIgnored}
	case mismatch:
		// Stored, not processed: a payload of another version may not mean what our handlers
		// think it means. An admin sees it in the dead letters and decides.
		status, res = "failed", storeResult{ResultReceived, "dead_lettered"}
		reason := FailureAPIVersionMismatch
		failure = &reason
		msg := fmt.Sprintf("%s: event api_version %q, this service speaks %q", FailureAPIVersionMismatch, env.apiVersion(), PinnedAPIVersion)
		deadMsg = &msg
	}
	var created *time.Time
	if env.Created > 0 {
		t := time.Unix(env.Created, 0).UTC()
		created = &t
	}
	now := i.cfg.Now()
	timedOut := false
	if i.cfg.ApplyInline && handled && !mismatch {
		res, err := i.storeAndApply(ctx, env, body, created, now)
		if !errors.Is(err, errInlineTimeout) {
			return res, err
		}
		timedOut = true
		// Too slow to apply now (a lock held elsewhere, or no free slot): acknowledge it through
		// the queue instead, as a fresh event; the timeout was no fault of the event's.
		if errors.Is(err, errNoInlineSlot) {
			i.metrics.slotWaits.Inc()
			i.log.Warn("webhook event queued: every inline slot is taken", "event_id", env.ID, "type", env.Type,
				"slots", i.cfg.InlineConcurrency, "waited", i.cfg.InlineSlotWait)
		} else {
			i.log.Warn("webhook event not applied within the inline budget; queued", "event_id", env.ID, "type", env.Type,
				"budget", i.cfg.InlineTimeout)
		}
	}
	// The job's placeholders come last, after the event's ($1 to $9) and the dead letter's ($10).
	jobSQL, jobArgs, err := processJobInsert(env.key().args(), 11)
	if err != nil {
		return storeResult{}, err
	}
	// Straight to the connection pool: gorm's Raw().Scan would render the statement with its
	// values (the whole payload) for its trace, a tenth of this path's CPU.
	var stored string
	err = i.cfg.DB.Statement.ConnPool.QueryRowContext(ctx, `
		WITH event AS (
		  INSERT INTO webhook_events (event_id, source, type, livemode, api_version, status, payload, received_at, failure_reason, event_created)
		  VALUES ($1, 'stripe', $2, $3, $4, $5, $6, $7, $8, $9)
		  ON CONFLICT (event_id, livemode) DO NOTHING
		  RETURNING event_id, livemode, status
		), dead AS (
		  INSERT INTO webhook_dead_letters (event_id, livemode, attempts, last_error, dead_at)
		  SELECT event_id, livemode, 0, CAST($10 AS text), $7 FROM event WHERE status = 'failed'
		), job AS (
		  `+jobSQL+` FROM event WHERE status = 'received'
		)
		SELECT event_id FROM event`,
		append([]any{env.ID, env.Type, *env.Livemode, env.APIVersion, status, storedPayload(env, body, handled), now, failure, created, deadMsg},
			jobArgs...)...).Scan(&stored)
	if errors.Is(err, sql.ErrNoRows) {
		if timedOut {
			// The budget can run out while the inline COMMIT is under way: the event may be
			// stored by this very delivery, so it is not called a duplicate.
			return res, nil
		}
		return i.duplicate(ctx, env)
	}
	if err != nil {
		return storeResult{}, fmt.Errorf("store event %s: %w", env.ID, err)
	}
	switch res.metric {
	case ResultIgnored:
		i.log.Info("webhook event ignored: type not handled", "event_id", env.ID, "type", env.Type, "livemode", *env.Livemode)
	case "dead_lettered":
		i.metrics.dead.WithLabelValues(env.Type, FailureAPIVersionMismatch).Inc()
		i.log.Error("webhook event dead-lettered: api_version mismatch", "event_id", env.ID, "type", env.Type,
			"api_version", env.apiVersion(), "pinned", PinnedAPIVersion)
	}
	return res, nil
}

// storeAndApply applies a handled event and stores it in one transaction, before the 200: the
// handler runs first, then the row is inserted already processed (attempt 1), and the effects
// commit with it or not at all, the same promise as a worker's. What a user waits for is the
// applied event, and this path spends one transaction per event where the queue spends two plus
// River's fetch and completion.
//
// At most InlineConcurrency attempts run at once; a delivery waits for a slot within the budget.
// With GroupCommit, the attempt shares a transaction with the others that arrived with it
// (groupcommit.go), and is made alone, as below, when that transaction is rolled back.
//
// The row comes last so that processed_at is taken while the handler's row locks are held: it
// orders the applies of one subscription, as a worker's mark does. A redelivery runs the handler
// too, then finds the event stored and rolls everything back (duplicate); concurrent deliveries
// of one event are serialized by the handler's locks and the primary key, so exactly one commits.
//
// When the handler fails, the transaction is rolled back whole and the event is stored as the
// queue's path stores it, with this first attempt counted: a worker retries it after the retry
// delay, and an error that can never succeed dead-letters it at once.
func (i *Inbox) storeAndApply(ctx context.Context, env envelope, body []byte, created *time.Time, now time.Time) (storeResult, error) {
	ev := storedEvent{EventID: env.ID, Type: env.Type, Livemode: *env.Livemode, APIVersion: env.APIVersion,
		Status: "received", Payload: body, ReceivedAt: now, EventCreated: created}
	event := eventOf(ev, env)
	ev.event = &event
	var applyErr error
	var appliedAt time.Time
	outer := ctx
	ctx, cancel := context.WithTimeout(ctx, i.cfg.InlineTimeout)
	defer cancel()
	select {
	case i.inlineSlots <- struct{}{}:
		defer func() { <-i.inlineSlots }()
	default:
		// Every slot taken: wait a little, not the whole budget, behind work that may be stuck.
		wait := time.NewTimer(i.cfg.InlineSlotWait)
		defer wait.Stop()
		select {
		case i.inlineSlots <- struct{}{}:
			defer func() { <-i.inlineSlots }()
		case <-wait.C:
			return storeResult{}, errNoInlineSlot
		case <-ctx.Done():
			if outer.Err() != nil {
				return storeResult{}, outer.Err()
			}
			return storeResult{}, errInlineTimeout
		}
	}
	var err error
	alone := true
	if i.commit != nil {
		o, werr := i.applyBatched(ctx, ev)
		switch {
		case werr != nil && outer.Err() != nil:
			return storeResult{}, outer.Err() // the request is gone: Stripe delivers again
		case werr != nil:
			return storeResult{}, errInlineTimeout
		}
		alone = o.alone
		appliedAt, applyErr, err = o.appliedAt, o.applyErr, o.err
	}
	if alone {
		err = i.cfg.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			at, aerr, err := i.applyInTx(ctx, tx, []storedEvent{ev})
			if appliedAt, applyErr = at[0], aerr; applyErr != nil {
				return applyErr
			}
			return err
		})
	}
	switch {
	case err == nil:
		i.metrics.processed.WithLabelValues(env.Type).Inc()
		i.metrics.lag.WithLabelValues(env.Type).Observe(appliedAt.Sub(now).Seconds())
		return storeResult{ResultReceived, ResultReceived}, nil
	case errors.Is(err, errDuplicate):
		return i.duplicate(outer, env)
	case outer.Err() != nil:
		// The request is gone: Stripe gets no 200 and delivers again.
		return storeResult{}, err
	case ctx.Err() != nil:
		return storeResult{}, errInlineTimeout
	case applyErr == nil || database.IsUnavailable(applyErr):
		// Not stored: Stripe gets a 5xx and delivers again.
		return storeResult{}, err
	}
	return i.storeFailed(outer, env, body, created, now, applyErr)
}

// applyInTx applies handled events in turn and then inserts their rows, processed, in one
// statement, in tx: the work of an inline attempt, alone or in a batch of group commit. The rows
// come last, while every handler's locks are held. appliedAt has an entry per event (zero unless
// all were applied); applyErr is a handler's failure; err is the rows' (errDuplicate when an
// event is stored already: the handlers' effects must be rolled back).
func (i *Inbox) applyInTx(ctx context.Context, tx *gorm.DB, evs []storedEvent) (appliedAt []time.Time, applyErr, err error) {
	appliedAt = make([]time.Time, len(evs))
	for k, ev := range evs {
		if applyErr = i.dispatch(ctx, tx, ev); applyErr != nil {
			return appliedAt, applyErr, nil
		}
		appliedAt[k] = i.cfg.Now()
	}
	return appliedAt, nil, i.storeProcessed(ctx, tx, evs, appliedAt)
}

// storeProcessed inserts the rows of events applied in tx, processed at the times in at, in one
// statement: a batch of group commit stores its events in one round trip. errDuplicate when any
// of them is stored already (or twice among them): its effects are there, these are rolled back.
func (i *Inbox) storeProcessed(ctx context.Context, tx *gorm.DB, evs []storedEvent, at []time.Time) error {
	const columns = 8
	var q strings.Builder
	q.WriteString(`INSERT INTO webhook_events (event_id, source, type, livemode, api_version, status, payload, received_at, event_created, processed_at, attempts) VALUES `)
	args := make([]any, 0, columns*len(evs))
	for k, ev := range evs {
		if k > 0 {
			q.WriteString(", ")
		}
		n := k * columns
		fmt.Fprintf(&q, "($%d, 'stripe', $%d, $%d, $%d, 'processed', $%d, $%d, $%d, $%d, 1)", n+1, n+2, n+3, n+4, n+5, n+6, n+7, n+8)
		args = append(args, ev.EventID, ev.Type, ev.Livemode, ev.APIVersion, string(ev.Payload), ev.ReceivedAt, ev.EventCreated, at[k])
	}
	q.WriteString(` ON CONFLICT (event_id, livemode) DO NOTHING RETURNING event_id`)
	// Straight to the connection, for the reason given in store.
	rows, err := tx.Statement.ConnPool.QueryContext(ctx, q.String(), args...)
	if err != nil {
		return fmt.Errorf("store event %s: %w", evs[0].EventID, err)
	}
	defer rows.Close()
	stored := 0
	for rows.Next() {
		stored++
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("store event %s: %w", evs[0].EventID, err)
	}
	if stored < len(evs) {
		return errDuplicate
	}
	return nil
}

// errDuplicate rolls back the inline attempt of an event that is stored already.
var errDuplicate = errors.New("inline apply: event stored already")

// errInlineTimeout: the inline attempt ran out of its budget and was rolled back.
var errInlineTimeout = errors.New("inline apply: budget exceeded")

// errNoInlineSlot: no inline slot came free within InlineSlotWait; the event goes to the queue as
// on a timeout.
var errNoInlineSlot = fmt.Errorf("%w: no free slot", errInlineTimeout)

// storeFailed stores an event whose first attempt, in the receive transaction, failed: with that
// attempt counted and its reason, and either a job scheduled after the retry delay or, for an
// error no retry can mend, its dead letter.
func (i *Inbox) storeFailed(ctx context.Context, env envelope, body []byte, created *time.Time, now time.Time, cause error) (storeResult, error) {
	reason := failureText(cause)
	permanent := IsPermanent(cause) || i.cfg.MaxAttempts <= 1
	status, res := "received", storeResult{ResultReceived, ResultReceived}
	if permanent {
		status, res = "failed", storeResult{ResultReceived, "dead_lettered"}
	}
	inserted := false
	err := i.cfg.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var stored string
		err := tx.Statement.ConnPool.QueryRowContext(ctx, `
			INSERT INTO webhook_events (event_id, source, type, livemode, api_version, status, payload, received_at, event_created, attempts, failure_reason)
			VALUES ($1, 'stripe', $2, $3, $4, $5, $6, $7, $8, 1, $9)
			ON CONFLICT (event_id, livemode) DO NOTHING
			RETURNING event_id`,
			env.ID, env.Type, *env.Livemode, env.APIVersion, status, string(body), now, created, reason).Scan(&stored)
		if errors.Is(err, sql.ErrNoRows) {
			return nil // another delivery of this event stored it meanwhile
		}
		if err != nil {
			return fmt.Errorf("store event %s: %w", env.ID, err)
		}
		inserted = true
		if permanent {
			return tx.Exec(`INSERT INTO webhook_dead_letters (event_id, livemode, attempts, last_error, dead_at) VALUES ($1, $2, 1, $3, $4)`,
				env.ID, *env.Livemode, reason, now).Error
		}
		return i.enqueueAt(ctx, tx, env.key(), now.Add(backoff(i.cfg.RetryDelay, 1)))
	})
	switch {
	case err != nil:
		return storeResult{}, err
	case !inserted:
		return i.duplicate(ctx, env)
	}
	i.metrics.failures.WithLabelValues(env.Type).Inc()
	switch {
	case permanent:
		i.metrics.dead.WithLabelValues(env.Type, deadKind(cause)).Inc()
		i.log.Error("webhook event dead-lettered", "event_id", env.ID, "type", env.Type, "attempts", 1, "permanent", true, "error", cause)
	default:
		i.log.Warn("webhook event processing failed; will retry", "event_id", env.ID, "type", env.Type,
			"attempt", 1, "max_attempts", i.cfg.MaxAttempts, "error", cause)
	}
	return res, nil
}

// FailureAPIVersionMismatch is the failure reason of an event of another API version.
const FailureAPIVersionMismatch = "api_version_mismatch"

func (i *Inbox) enqueue(ctx context.Context, tx *gorm.DB, key EventKey) error {
	return i.enqueueAt(ctx, tx, key, time.Time{})
}

// enqueueAt inserts the processing job of an event in tx, to run at the given time (zero: now).
func (i *Inbox) enqueueAt(ctx context.Context, tx *gorm.DB, key EventKey, at time.Time) error {
	sqlTx, err := jobs.SQLTx(tx)
	if err != nil {
		return err
	}
	var opts *river.InsertOpts
	if !at.IsZero() {
		opts = &river.InsertOpts{ScheduledAt: at}
	}
	if _, err := i.jobs.InsertTx(ctx, sqlTx, key.args(), opts); err != nil {
		return fmt.Errorf("enqueue processing of event %s: %w", key.ID, err)
	}
	return nil
}
