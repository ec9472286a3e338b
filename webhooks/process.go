package webhooks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverdatabasesql"
	"gorm.io/gorm"

	"billing/internal/database"
	"billing/internal/jobs"
)

// ProcessEventArgs is the River job that processes one stored event.
type ProcessEventArgs struct {
	EventID string `json:"event_id"`
}

func (ProcessEventArgs) Kind() string { return "webhook_event" }

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
}

// process runs one attempt. The attempt is counted first, in its own statement, so that even an
// attempt that dies with the process is counted; then one transaction locks the event, applies
// the handler's effects, marks the event processed and completes the job.
func (i *Inbox) process(ctx context.Context, job *river.Job[ProcessEventArgs]) error {
	id := job.Args.EventID
	var counted []struct{ Attempts int }
	res := i.cfg.DB.WithContext(ctx).Raw(`
		UPDATE webhook_events SET attempts = attempts + 1
		WHERE event_id = ? AND status = 'received'
		RETURNING attempts`, id).Scan(&counted)
	if res.Error != nil {
		return fmt.Errorf("count attempt of event %s: %w", id, res.Error)
	}
	if len(counted) == 0 {
		// Processed, failed, ignored or gone: a stale or duplicate job has nothing to do.
		return nil
	}
	attempts := counted[0].Attempts

	var ev storedEvent
	err := i.cfg.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		err := tx.Raw(`
			SELECT event_id, type, livemode, api_version, status, payload, attempts, received_at, event_created
			FROM webhook_events WHERE event_id = ? FOR UPDATE`, id).Scan(&ev).Error
		if err != nil {
			return fmt.Errorf("lock event %s: %w", id, err)
		}
		if ev.EventID == "" || ev.Status != "received" {
			// Another job got here first while we waited for the lock.
			return i.completeJob(ctx, tx, job)
		}
		if err := i.dispatch(ctx, tx, ev); err != nil {
			return err
		}
		now := i.cfg.Now()
		if err := tx.Exec(`
			UPDATE webhook_events SET status = 'processed', processed_at = ?, failure_reason = NULL
			WHERE event_id = ?`, now, id).Error; err != nil {
			return fmt.Errorf("mark event %s processed: %w", id, err)
		}
		return i.completeJob(ctx, tx, job)
	})
	if err == nil {
		if ev.Status == "received" {
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
	i.metrics.failures.WithLabelValues(ev.Type).Inc()
	return i.recordFailure(ctx, job, ev, attempts, err)
}

func (i *Inbox) completeJob(ctx context.Context, tx *gorm.DB, job *river.Job[ProcessEventArgs]) error {
	sqlTx, err := jobs.SQLTx(tx)
	if err != nil {
		return err
	}
	if _, err := river.JobCompleteTx[*riverdatabasesql.Driver](ctx, sqlTx, job); err != nil {
		return fmt.Errorf("complete job of event %s: %w", job.Args.EventID, err)
	}
	return nil
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

func decodeEvent(ev storedEvent) (Event, error) {
	env, err := decodeEnvelope(ev.Payload)
	if err != nil {
		return Event{}, fmt.Errorf("decode stored event %s: %w", ev.EventID, err)
	}
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
	return out, nil
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
	reason := cause.Error()
	if len(reason) > 2000 {
		reason = reason[:2000]
	}
	id := job.Args.EventID
	permanent := IsPermanent(cause)
	if database.IsUnavailable(cause) {
		// The database went away: not the event's fault, and nothing can be recorded now. River
		// retries with backoff; an outage never dead-letters an event.
		i.log.Warn("webhook event processing interrupted: database unavailable; will retry", "event_id", id, "error", cause)
		return cause
	}
	if !permanent && attempts < i.cfg.MaxAttempts {
		i.log.Warn("webhook event processing failed; will retry", "event_id", id, "type", ev.Type,
			"attempt", attempts, "max_attempts", i.cfg.MaxAttempts, "error", cause)
		if err := i.cfg.DB.WithContext(ctx).Exec(`UPDATE webhook_events SET failure_reason = ? WHERE event_id = ? AND status = 'received'`,
			reason, id).Error; err != nil {
			i.log.Error("record webhook failure reason", "event_id", id, "error", err)
		}
		return cause
	}
	err := i.cfg.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		res := tx.Exec(`UPDATE webhook_events SET status = 'failed', failure_reason = ? WHERE event_id = ? AND status = 'received'`, reason, id)
		if res.Error != nil {
			return res.Error
		}
		if res.RowsAffected == 0 {
			return nil
		}
		return tx.Exec(`
			INSERT INTO webhook_dead_letters (event_id, attempts, last_error, dead_at) VALUES (?, ?, ?, ?)
			ON CONFLICT (event_id) DO UPDATE SET attempts = EXCLUDED.attempts, last_error = EXCLUDED.last_error, dead_at = EXCLUDED.dead_at`,
			id, attempts, reason, i.cfg.Now()).Error
	})
	if err != nil {
		// Could not dead-letter (database trouble): let River retry; the next attempt decides again.
		return errors.Join(cause, fmt.Errorf("dead-letter event %s: %w", id, err))
	}
	kind := "max_attempts"
	if permanent {
		kind = "permanent"
	}
	i.metrics.dead.WithLabelValues(ev.Type, kind).Inc()
	i.log.Error("webhook event dead-lettered", "event_id", id, "type", ev.Type, "attempts", attempts, "permanent", permanent, "error", cause)
	return river.JobCancel(cause)
}
