package webhooks

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/riverqueue/river"
	"gorm.io/gorm"

	"billing/internal/database"
	"billing/internal/jobs"
)

type storeResult struct{ status, metric string }

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
