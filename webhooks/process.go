package webhooks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/riverqueue/river"
	"gorm.io/gorm"

	"billing/internal/database"
)

// ProcessEventArgs is the River job that processes one stored event. Event ids are unique per
// mode only, so the job names the mode too; a job queued before modes were part of the key has
// none (nil), and then its id alone names the event, as it did when it was queued.
type ProcessEventArgs struct {
	EventID  string `json:"event_id"`
	Livemode *bool  `json:"livemode,omitempty"`
}

// EventKey names one stored event: an id of one mode.
type EventKey struct {
	ID       string
	Livemode bool
}

func (k EventKey) args() ProcessEventArgs {
	live := k.Livemode
	return ProcessEventArgs{EventID: k.ID, Livemode: &live}
}

func (ProcessEventArgs) Kind() string { return JobKindProcessEvent }

// InsertOpts: River's own attempt limit is a backstop above ours. Dead-lettering is decided by
// webhook_events.attempts (which a replay resets), so River must not discard the job first.
func (ProcessEventArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: QueueWebhooks, MaxAttempts: 25}
}

// QueueWebhooks is the River queue of event processing.
const QueueWebhooks = "webhooks"

type processor struct {
	river.WorkerDefaults[ProcessEventArgs]
	inbox *Inbox
}

func (p *processor) Work(ctx context.Context, job *river.Job[ProcessEventArgs]) error {
	return p.inbox.process(ctx, job)
}

// NextRetry backs off exponentially from worker.retry_delay, capped at an hour.
func (p *processor) NextRetry(job *river.Job[ProcessEventArgs]) time.Time {
	return p.inbox.cfg.Now().Add(backoff(p.inbox.cfg.RetryDelay, job.Attempt))
}

func backoff(base time.Duration, attempt int) time.Duration {
	exp := math.Pow(2, float64(max(attempt-1, 0)))
	d := time.Duration(float64(base) * exp)
	if d > time.Hour || d <= 0 {
		return time.Hour
	}
	return d
}

type storedEvent struct {
	EventID      string
	Type         string
	Livemode     bool
	APIVersion   *string
	Status       string
	Payload      []byte
	Attempts     int
	ReceivedAt   time.Time
	EventCreated *time.Time
	// event is the handler's event when the receive path has read it already (inline): the body
	// is read once.
	event *Event
}

// process runs one attempt in one transaction: it locks the event by its primary key, applies
// the handler's effects and marks the event processed with its attempt count.
//
// The job is completed by River after Work returns (its completer batches many jobs into one
// statement), not inside the transaction: the event's status, not the job's, is what makes
// processing idempotent. A crash between the commit and the completion runs the job again, and
// that run finds the event processed and does nothing.
//
// The attempt number comes from River as well as from the event: River counts job.Attempt
// durably when it hands the job out, so an attempt cut short by a crash still counts (a poison
// event that kills the process is dead-lettered, not retried forever), while a replay (a new job,
// attempts reset to 0) starts again from 1. Counting it here instead of in a separate statement
// before the transaction saves a commit and a row version per event.
func (i *Inbox) process(ctx context.Context, job *river.Job[ProcessEventArgs]) error {
	id := job.Args.EventID
	var ev storedEvent
	attempts := 0
	err := i.cfg.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		// Only the primary key in the predicate: with a status condition as well, the planner may
		// pick the status index and walk every received event of a backlog for each attempt.
		err := tx.Raw(`
			SELECT event_id, type, livemode, api_version, status, payload, attempts, received_at, event_created
			FROM webhook_events WHERE event_id = $1 AND (CAST($2 AS boolean) IS NULL OR livemode = $2)
			LIMIT 1 FOR UPDATE`, id, job.Args.Livemode).Scan(&ev).Error
		if err != nil {
			return fmt.Errorf("lock event %s: %w", id, err)
		}
		if ev.EventID == "" || ev.Status != "received" {
			// Processed, failed, ignored or gone: a stale or duplicate job has nothing to do.
			return nil
		}
		attempts = max(ev.Attempts+1, job.Attempt)
		if err := i.dispatch(ctx, tx, ev); err != nil {
			return err
		}
		if err := tx.Exec(`
			UPDATE webhook_events SET status = 'processed', processed_at = $1, attempts = $2, failure_reason = NULL
			WHERE event_id = $3 AND livemode = $4`, i.cfg.Now(), attempts, id, ev.Livemode).Error; err != nil {
			return fmt.Errorf("mark event %s processed: %w", id, err)
		}
		return nil
	})
	if err == nil {
		if attempts > 0 {
			i.metrics.processed.WithLabelValues(ev.Type).Inc()
			i.metrics.lag.WithLabelValues(ev.Type).Observe(i.cfg.Now().Sub(ev.ReceivedAt).Seconds())
			i.log.Debug("webhook event processed", "event_id", id, "type", ev.Type, "attempt", attempts)
		}
		return nil
	}
	if ctx.Err() != nil {
		// Shutting down or timed out: the job is retried, nothing to record.
		return err
	}
	if attempts == 0 {
		// The event could not even be read (the database is unreachable, typically): nothing
		// ran, so there is nothing to count; River retries the job.
		return err
	}
	i.metrics.failures.WithLabelValues(ev.Type).Inc()
	return i.recordFailure(ctx, job, ev, attempts, err)
}

// dispatch decodes the stored event and calls its handler. A panic in a handler is an error of
// that event, not of the worker.
func (i *Inbox) dispatch(ctx context.Context, tx *gorm.DB, ev storedEvent) (err error) {
	h, ok := i.cfg.Registry.Lookup(ev.Type)
	if !ok {
		return Permanent(fmt.Errorf("no handler is registered for event type %q", ev.Type))
	}
	if ev.APIVersion == nil || *ev.APIVersion != PinnedAPIVersion {
		return Permanent(fmt.Errorf("%s: event api_version %q, this service speaks %q", FailureAPIVersionMismatch, deref(ev.APIVersion), PinnedAPIVersion))
	}
	event, err := decodeEvent(ev)
	if err != nil {
		return Permanent(err)
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("handler for %s panicked: %v", ev.Type, r)
		}
	}()
	if err := h.HandleEvent(ctx, tx, event); err != nil {
		return fmt.Errorf("handle %s %s: %w", ev.Type, ev.EventID, err)
	}
	return nil
}

// decodeEvent is the event a handler gets: the one the receive path read (inline), else read
// from the stored payload.
func decodeEvent(ev storedEvent) (Event, error) {
	if ev.event != nil {
		return *ev.event, nil
	}
	env, _, err := readEvent(ev.Payload)
	if err != nil {
		return Event{}, fmt.Errorf("decode stored event %s: %w", ev.EventID, err)
	}
	return eventOf(ev, env), nil
}

// eventOf is the handler's event of a stored event and its envelope.
func eventOf(ev storedEvent, env envelope) Event {
	out := Event{
		ID:                 ev.EventID,
		Type:               ev.Type,
		Livemode:           ev.Livemode,
		APIVersion:         deref(ev.APIVersion),
		Payload:            json.RawMessage(ev.Payload),
		Object:             env.Data.Object,
		PreviousAttributes: env.Data.PreviousAttributes,
	}
	if env.Created > 0 {
		out.Created = time.Unix(env.Created, 0).UTC()
	}
	return out
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// recordFailure keeps the failure reason, and dead-letters the event when it is out of attempts
// or can never succeed. The job is then cancelled so River stops retrying it.
func (i *Inbox) recordFailure(ctx context.Context, job *river.Job[ProcessEventArgs], ev storedEvent, attempts int, cause error) error {
	reason := failureText(cause)
	id := job.Args.EventID
	permanent := IsPermanent(cause)
	if database.IsUnavailable(cause) {
		// The database went away: not the event's fault, and nothing can be recorded now. River
		// retries with backoff; an outage never dead-letters an event.
		i.log.Warn("webhook event processing interrupted: database unavailable; will retry", "event_id", id, "error", cause)
		return cause
	}
	dead := permanent || attempts >= i.cfg.MaxAttempts
	stillReceived := false
	err := i.cfg.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		// Locked by primary key alone, for the same reason as in process.
		var status []string
		if err := tx.Raw(`SELECT status FROM webhook_events WHERE event_id = $1 AND livemode = $2 FOR UPDATE`, id, ev.Livemode).
			Scan(&status).Error; err != nil {
			return err
		}
		if stillReceived = len(status) == 1 && status[0] == "received"; !stillReceived {
			return nil // finished by another job, or deleted, meanwhile: nothing to record
		}
		if !dead {
			return tx.Exec(`UPDATE webhook_events SET attempts = $1, failure_reason = $2 WHERE event_id = $3 AND livemode = $4`,
				attempts, reason, id, ev.Livemode).Error
		}
		return deadLetter(tx, EventKey{id, ev.Livemode}, attempts, reason, i.cfg.Now())
	})
	switch {
	case err != nil && dead:
		// Could not dead-letter (database trouble): let River retry; the next attempt decides again.
		return errors.Join(cause, fmt.Errorf("dead-letter event %s: %w", id, err))
	case err != nil:
		i.log.Error("record webhook failure", "event_id", id, "error", err)
		return cause
	case !stillReceived:
		return nil
	case !dead:
		i.log.Warn("webhook event processing failed; will retry", "event_id", id, "type", ev.Type,
			"attempt", attempts, "max_attempts", i.cfg.MaxAttempts, "error", cause)
		return cause
	}
	kind := "max_attempts"
	if permanent {
		kind = deadKind(cause)
	}
	i.metrics.dead.WithLabelValues(ev.Type, kind).Inc()
	i.log.Error("webhook event dead-lettered", "event_id", id, "type", ev.Type, "attempts", attempts, "permanent", permanent, "error", cause)
	return river.JobCancel(cause)
}

// deadLetter marks an event failed and writes (or refreshes) its dead letter, in tx.
func deadLetter(tx *gorm.DB, key EventKey, attempts int, reason string, at time.Time) error {
	if err := tx.Exec(`UPDATE webhook_events SET status = 'failed', attempts = $1, failure_reason = $2 WHERE event_id = $3 AND livemode = $4`,
		attempts, reason, key.ID, key.Livemode).Error; err != nil {
		return err
	}
	return tx.Exec(`
		INSERT INTO webhook_dead_letters (event_id, livemode, attempts, last_error, dead_at) VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (event_id, livemode) DO UPDATE SET attempts = EXCLUDED.attempts, last_error = EXCLUDED.last_error, dead_at = EXCLUDED.dead_at`,
		key.ID, key.Livemode, attempts, reason, at).Error
}

// failureText is the failure_reason stored for an error: its classified reason first, bounded.
func failureText(cause error) string {
	reason := cause.Error()
	if r := failureReason(cause); r != "" {
		reason = r + ": " + reason
	}
	if len(reason) > 2000 {
		reason = reason[:2000]
	}
	return reason
}

// deadKind is the dead-letter metric's label for an error that can never succeed.
func deadKind(cause error) string {
	if r := failureReason(cause); r != "" {
		return r
	}
	return "permanent"
}
