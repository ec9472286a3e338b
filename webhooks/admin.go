package webhooks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"gorm.io/gorm"

	"billing/internal/apierr"
	"billing/internal/audit"
	"billing/internal/auth"
	"billing/internal/database"
)

// EventView is one entry of the admin event log. Its JSON fields, nulls included, are part of
// the admin API.
type EventView struct {
	EventID       string          `json:"event_id"`
	Type          string          `json:"type"`
	Status        string          `json:"status"`
	Livemode      bool            `json:"livemode"`
	APIVersion    *string         `json:"api_version"`
	Attempts      int             `json:"attempts"`
	ReceivedAt    time.Time       `json:"received_at"`
	ProcessedAt   *time.Time      `json:"processed_at"`
	FailureReason *string         `json:"failure_reason"`
	Payload       json.RawMessage `json:"payload,omitempty" gorm:"-"`
}

// DeadLetter is an event that failed all its attempts, for the admin page.
type DeadLetter struct {
	EventID   string
	Type      string
	Livemode  bool
	Attempts  int
	LastError string
	DeadAt    time.Time
}

var eventStatuses = map[string]bool{"received": true, "processed": true, "failed": true, "ignored": true}

const eventColumns = `event_id, type, status, livemode, api_version, attempts, received_at, processed_at, failure_reason`

// MountAdmin registers the event log endpoints on the /admin group.
func (i *Inbox) MountAdmin(admin *echo.Group) {
	admin.GET("/events", i.listEvents)
	admin.GET("/events/:event_id", i.getEvent)
	admin.POST("/events/:event_id/replay", i.replayEvent)
}

func (i *Inbox) listEvents(c echo.Context) error {
	q := c.QueryParams()
	limit := 100
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 1000 {
			return apierr.New(apierr.CodeInvalidRequest, "limit must be an integer from 1 to 1000")
		}
		limit = n
	}
	// The event log is the admin's, over both modes (each row says its mode).
	sql := `/* all modes */ SELECT ` + eventColumns + ` FROM webhook_events WHERE source = 'stripe'`
	args := []any{}
	if s := q.Get("status"); s != "" {
		if !eventStatuses[s] {
			return apierr.New(apierr.CodeInvalidRequest, "status must be one of received, processed, failed, ignored")
		}
		args = append(args, s)
		sql += ` AND status = $` + strconv.Itoa(len(args))
	}
	if t := q.Get("type"); t != "" {
		args = append(args, t)
		sql += ` AND type = $` + strconv.Itoa(len(args))
	}
	args = append(args, limit)
	sql += ` ORDER BY received_at DESC, event_id DESC LIMIT $` + strconv.Itoa(len(args))
	events := []EventView{}
	if err := i.cfg.DB.WithContext(c.Request().Context()).Raw(sql, args...).Scan(&events).Error; err != nil {
		return dbError(err, "list events")
	}
	return c.JSON(http.StatusOK, map[string]any{"events": events})
}

func (i *Inbox) getEvent(c echo.Context) error {
	id, err := eventIDParam(c)
	if err != nil {
		return err
	}
	var rows []struct {
		EventView
		Raw string `gorm:"column:payload"`
	}
	err = i.cfg.DB.WithContext(c.Request().Context()).
		Raw(`/* all modes */ SELECT `+eventColumns+`, payload::text AS payload FROM webhook_events WHERE event_id = $1
			ORDER BY livemode DESC`, id).Scan(&rows).Error
	if err != nil {
		return dbError(err, "load event")
	}
	if len(rows) == 0 {
		return apierr.New(apierr.CodeNotFound, "no event %q", id)
	}
	ev := rows[0].EventView
	ev.Payload = json.RawMessage(rows[0].Raw)
	return c.JSON(http.StatusOK, ev)
}

// ErrNotReplayable is returned by Replay for an event that is not failed.
var ErrNotReplayable = errors.New("event is not failed")

func (i *Inbox) replayEvent(c echo.Context) error {
	id, err := eventIDParam(c)
	if err != nil {
		return err
	}
	status, err := i.Replay(c.Request().Context(), id)
	switch {
	case errors.Is(err, gorm.ErrRecordNotFound):
		return apierr.New(apierr.CodeNotFound, "no event %q", id)
	case errors.Is(err, ErrAmbiguousEvent):
		return apierr.New(apierr.CodeAmbiguousEvent, "event %s is stored in both modes", id)
	case errors.Is(err, ErrNotReplayable) && status == "processed":
		return apierr.New(apierr.CodeEventProcessed, "event %s is already processed", id)
	case errors.Is(err, ErrNotReplayable):
		return apierr.New(apierr.CodeEventNotFailed, "only failed events can be replayed; event %s is %s", id, status)
	case err != nil:
		return dbError(err, "replay event")
	}
	if strings.HasPrefix(c.Request().Header.Get(echo.HeaderContentType), echo.MIMEApplicationForm) {
		// The replay button of the admin page: back to the page.
		return c.Redirect(http.StatusSeeOther, "/admin")
	}
	return c.JSON(http.StatusAccepted, map[string]string{"event_id": id, "status": "received"})
}

// ErrAmbiguousEvent is returned by Replay for an id stored in both modes, neither or both failed.
var ErrAmbiguousEvent = errors.New("event id is stored in both modes")

// Replay puts a failed event back to received with its attempts reset and queues it again, in
// one transaction, which also records the replay in the audit log. It returns the event's status
// before the call; a refusal (the event is not failed) is recorded too. Ids are unique per mode
// only: of an id stored in both modes, the one failed event is replayed; ErrAmbiguousEvent when
// that does not choose one.
func (i *Inbox) Replay(ctx context.Context, eventID string) (string, error) {
	return i.replay(ctx, eventID, audit.ActionReplay, "replayed: queued again")
}

func (i *Inbox) replay(ctx context.Context, eventID, action, result string) (string, error) {
	var status string
	var key EventKey
	err := i.cfg.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var rows []struct {
			Livemode bool
			Status   string
		}
		if err := tx.Raw(`/* all modes */ SELECT livemode, status FROM webhook_events WHERE event_id = $1 ORDER BY livemode FOR UPDATE`,
			eventID).Scan(&rows).Error; err != nil {
			return fmt.Errorf("lock event %s: %w", eventID, err)
		}
		switch {
		case len(rows) == 0:
			return gorm.ErrRecordNotFound
		case len(rows) == 2 && (rows[0].Status == "failed") == (rows[1].Status == "failed"):
			return ErrAmbiguousEvent
		case len(rows) == 2 && rows[1].Status == "failed":
			rows = rows[1:]
		}
		status, key = rows[0].Status, EventKey{eventID, rows[0].Livemode}
		if status != "failed" {
			return ErrNotReplayable
		}
		if err := tx.Exec(`UPDATE webhook_events SET status = 'received', attempts = 0, failure_reason = NULL, processed_at = NULL
			WHERE event_id = $1 AND livemode = $2`, key.ID, key.Livemode).Error; err != nil {
			return fmt.Errorf("reset event %s: %w", eventID, err)
		}
		if err := tx.Exec(`DELETE FROM webhook_dead_letters WHERE event_id = $1 AND livemode = $2`, key.ID, key.Livemode).Error; err != nil {
			return fmt.Errorf("remove dead letter %s: %w", eventID, err)
		}
		if err := audit.Record(ctx, tx, action, eventID, key.Livemode, result); err != nil {
			return err
		}
		return i.enqueue(ctx, tx, key)
	})
	switch {
	case err == nil:
		i.log.Info("webhook event replayed", "event_id", eventID, "livemode", key.Livemode, "actor", auditActor(ctx))
	case errors.Is(err, ErrNotReplayable) && action == audit.ActionReplay:
		// Replay-all passes over events another admin replayed meanwhile: only a replay asked for
		// by name records its refusal.
		if aerr := audit.Record(ctx, i.cfg.DB, action, eventID, key.Livemode, "refused: the event is "+status); aerr != nil {
			i.log.Error("record a refused replay", "event_id", eventID, "error", aerr)
		}
	}
	return status, err
}

func auditActor(ctx context.Context) string {
	if a := auth.Actor(ctx); a != "" {
		return a
	}
	return audit.SystemActor
}

// DeadLetters lists dead-lettered events, newest first.
func (i *Inbox) DeadLetters(ctx context.Context, limit int) ([]DeadLetter, error) {
	out := []DeadLetter{}
	err := i.cfg.DB.WithContext(ctx).Raw(`
		SELECT d.event_id, e.type, e.livemode, d.attempts, d.last_error, d.dead_at
		FROM webhook_dead_letters d JOIN webhook_events e USING (event_id, livemode) /* all modes */
		ORDER BY d.dead_at DESC LIMIT $1`, limit).Scan(&out).Error
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	return out, nil
}

// RegisterGauges registers the backlog gauges (billing_webhook_dead_letters,
// billing_webhook_events_pending) with reg, and the periodic River job that counts them. A
// scrape reads the last count and never queries the database: /metrics is unauthenticated and
// may be scraped at any rate. River runs periodic jobs on its elected leader only, so only one
// replica counts. River accepts workers and periodic jobs added after the client is built, as
// long as it has not started.
func (i *Inbox) RegisterGauges(reg prometheus.Registerer, workers *river.Workers, periodic *river.PeriodicJobBundle) {
	reg.MustRegister(&backlogCollector{b: i.metrics.backlog, now: i.cfg.Now})
	reg.MustRegister(i.bodyBudgetGauges()...)
	river.AddWorker(workers, &backlogCounter{inbox: i})
	periodic.Add(river.NewPeriodicJob(river.PeriodicInterval(backlogInterval), func() (river.JobArgs, *river.InsertOpts) {
		return BacklogArgs{}, nil
	}, &river.PeriodicJobOpts{RunOnStart: true}))
}

// BacklogArgs is the periodic job that counts the backlog for the gauges.
type BacklogArgs struct{}

func (BacklogArgs) Kind() string { return "webhook_backlog_count" }

func (BacklogArgs) InsertOpts() river.InsertOpts {
	// A failed count is not retried: the next period counts again.
	return river.InsertOpts{Queue: QueueWebhooks, MaxAttempts: 1}
}

type backlogCounter struct {
	river.WorkerDefaults[BacklogArgs]
	inbox *Inbox
}

func (w *backlogCounter) Work(ctx context.Context, _ *river.Job[BacklogArgs]) error {
	return w.inbox.RefreshGauges(ctx)
}

// RefreshGauges counts the dead letters and the events not yet processed, for the gauges.
func (i *Inbox) RefreshGauges(ctx context.Context) error {
	var n struct {
		DeadLetters int64
		Pending     int64
	}
	err := i.cfg.DB.WithContext(ctx).Raw(`/* all modes */
		SELECT (SELECT count(*) FROM webhook_dead_letters) AS dead_letters,
		       (SELECT count(*) FROM webhook_events WHERE status = 'received') AS pending`).Scan(&n).Error
	if err != nil {
		return fmt.Errorf("count webhook backlog: %w", err)
	}
	i.metrics.backlog.set(float64(n.DeadLetters), float64(n.Pending), i.cfg.Now())
	return nil
}

// eventIDParam is the event id of the URL. echo gives a path parameter as sent (still escaped)
// when the path has escapes that differ from the default encoding, such as %2F; decode it then.
func eventIDParam(c echo.Context) (string, error) {
	id := c.Param("event_id")
	if c.Request().URL.RawPath == "" {
		return id, nil
	}
	decoded, err := url.PathUnescape(id)
	if err != nil {
		return "", apierr.New(apierr.CodeInvalidRequest, "event id in the URL is not a valid percent-encoded path segment")
	}
	return decoded, nil
}

func dbError(err error, what string) error {
	return database.APIError(err, what)
}
