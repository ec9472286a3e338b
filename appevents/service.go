package appevents

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"gorm.io/gorm"

	"billing/internal/apierr"
	"billing/internal/audit"
	"billing/internal/database"
)

// Recheck tells a user's entitlement again in tx, by the clock: the sweeper's call when the
// user's planned time-driven change is due (billing's TellUser).
type Recheck func(ctx context.Context, tx *gorm.DB, userID string) error

// Deps are what the service needs from main.
type Deps struct {
	DB *gorm.DB
	// Livemode is the deployment's world: only its events are written, pushed and listed.
	Livemode bool
	// Push is nil when app_events.url is empty: nothing is pushed, the feed still fills.
	Push       *PusherConfig
	Logger     *slog.Logger
	Now        func() time.Time
	Registerer prometheus.Registerer
	// SweepInterval is how often due time-driven changes are told; 15 s when zero.
	SweepInterval time.Duration
}

// Service is the app events' outbox, feed, push and sweeper.
type Service struct {
	d       Deps
	log     *slog.Logger
	teller  *Teller
	pusher  *Pusher
	recheck Recheck
	metrics *Metrics
}

// New builds the service.
func New(d Deps) *Service {
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	if d.SweepInterval <= 0 {
		d.SweepInterval = 15 * time.Second
	}
	s := &Service{d: d, log: d.Logger.With("component", "appevents"), metrics: NewMetrics(d.Registerer)}
	s.teller = NewTeller(d.Now)
	if d.Push != nil {
		cfg := *d.Push
		cfg.DB, cfg.Livemode, cfg.Logger, cfg.Now, cfg.Metrics = d.DB, d.Livemode, d.Logger, d.Now, s.metrics
		s.pusher = NewPusher(cfg)
	}
	if d.Registerer != nil {
		s.registerGauges(d.Registerer)
	}
	return s
}

// Teller is the writer that domain packages tell their changes with.
func (s *Service) Teller() *Teller { return s.teller }

// SetRecheck sets the entitlement's re-telling by the clock.
func (s *Service) SetRecheck(r Recheck) { s.recheck = r }

// AddWorkers adds the sweeper's worker.
func (s *Service) AddWorkers(w *river.Workers) {
	river.AddWorker(w, &sweeper{s: s})
}

// RunPush pushes the app events until ctx ends, when app_events.url is set (else it returns at
// once): serve runs it beside River's workers, in every replica.
func (s *Service) RunPush(ctx context.Context) {
	if s.pusher != nil {
		s.pusher.Run(ctx)
	}
}

// SweepJobKind is the kind of the periodic sweep.
const SweepJobKind = "app_events_sweep"

// SweepArgs is the periodic sweep of the time-driven changes that are due.
type SweepArgs struct{}

func (SweepArgs) Kind() string { return SweepJobKind }

// PeriodicJobs is the sweep, every SweepInterval and at start. River runs periodic jobs on its
// leader, so one replica sweeps at a time.
func (s *Service) PeriodicJobs() []*river.PeriodicJob {
	return []*river.PeriodicJob{river.NewPeriodicJob(river.PeriodicInterval(s.d.SweepInterval),
		func() (river.JobArgs, *river.InsertOpts) { return SweepArgs{}, nil }, &river.PeriodicJobOpts{RunOnStart: true})}
}

type sweeper struct {
	river.WorkerDefaults[SweepArgs]
	s *Service
}

func (w *sweeper) Work(ctx context.Context, _ *river.Job[SweepArgs]) error {
	told, err := w.s.TellDue(ctx)
	if err != nil {
		return err
	}
	if told > 0 {
		w.s.log.Info("time-driven entitlement changes told", "users", told)
	}
	return nil
}

// dueBatch bounds the users re-told in one sweep.
const dueBatch = 500

// TellDue re-tells the entitlement of every user whose planned change is due, each in its own
// transaction, and returns how many it checked.
func (s *Service) TellDue(ctx context.Context) (int, error) {
	if s.recheck == nil {
		return 0, nil
	}
	var users []string
	if err := s.d.DB.WithContext(ctx).Raw(`SELECT user_id FROM app_event_users
		WHERE livemode = $1 AND next_change_at <= $2 ORDER BY next_change_at LIMIT $3`,
		s.d.Livemode, s.d.Now(), dueBatch).Scan(&users).Error; err != nil {
		return 0, fmt.Errorf("app events: due changes: %w", err)
	}
	failed := 0
	var last error
	for _, u := range users {
		if err := s.d.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error { return s.recheck(ctx, tx, u) }); err != nil {
			// One user's failure must not keep the others' news waiting: the next sweep tries again.
			s.log.ErrorContext(ctx, "time-driven entitlement change not told; the next sweep tries again", "user_id", u, "error", err)
			failed, last = failed+1, err
		}
	}
	if failed > 0 && failed == len(users) {
		return 0, fmt.Errorf("app events: no time-driven change could be told: %w", last)
	}
	return len(users) - failed, nil
}

// Mount serves the feed on the app's group (/v1).
func (s *Service) Mount(v1 *echo.Group) {
	v1.GET("/app-events", s.getFeed)
}

func (s *Service) getFeed(c echo.Context) error {
	limit := 100
	if v := c.QueryParam("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 500 {
			return apierr.New(apierr.CodeInvalidRequest, "limit must be an integer from 1 to 500")
		}
		limit = n
	}
	after := c.QueryParam("after")
	p, err := Feed(c.Request().Context(), s.d.DB, s.d.Livemode, after, limit)
	if errors.Is(err, ErrUnknownCursor) {
		return apierr.New(apierr.CodeUnknownAppEvent, "after names no app event of this mode: pass the id of an event the feed gave, or none to start from the first")
	}
	if err != nil {
		return database.APIError(err, "read the app events")
	}
	return c.JSON(http.StatusOK, p)
}

// AdminEvent is one entry of GET /admin/app-events.
type AdminEvent struct {
	ID          string     `json:"id"`
	Type        string     `json:"type"`
	UserID      string     `json:"user_id"`
	Sequence    int64      `json:"sequence"`
	Status      string     `json:"status"`
	Attempts    int        `json:"attempts"`
	LastError   *string    `json:"last_error"`
	NextAt      *time.Time `json:"next_at"`
	Created     time.Time  `json:"created"`
	DeliveredAt *time.Time `json:"delivered_at"`
	Livemode    bool       `json:"livemode"`
}

// AdminQuery filters the admin's list.
type AdminQuery struct {
	Status, UserID string
	Limit          int
}

// List reads the mode's events, newest first.
func (s *Service) List(ctx context.Context, q AdminQuery) ([]AdminEvent, error) {
	sql := `SELECT id, type, user_id, sequence, status, attempts, last_error,
		  CASE WHEN status = 'pending' THEN next_at END AS next_at, created_at, delivered_at, livemode
		FROM app_events WHERE livemode = $1`
	args := []any{s.d.Livemode}
	if q.Status != "" {
		args = append(args, q.Status)
		sql += ` AND status = $` + strconv.Itoa(len(args))
	}
	if q.UserID != "" {
		args = append(args, q.UserID)
		sql += ` AND user_id = $` + strconv.Itoa(len(args))
	}
	if q.Limit <= 0 {
		q.Limit = 100
	}
	args = append(args, q.Limit)
	sql += ` ORDER BY n DESC LIMIT $` + strconv.Itoa(len(args))
	rows, err := s.d.DB.WithContext(ctx).Raw(sql, args...).Rows()
	if err != nil {
		return nil, fmt.Errorf("app events: list: %w", err)
	}
	defer rows.Close()
	out := []AdminEvent{}
	for rows.Next() {
		var e AdminEvent
		if err := rows.Scan(&e.ID, &e.Type, &e.UserID, &e.Sequence, &e.Status, &e.Attempts, &e.LastError, &e.NextAt,
			&e.Created, &e.DeliveredAt, &e.Livemode); err != nil {
			return nil, fmt.Errorf("app events: list: %w", err)
		}
		e.Created = e.Created.UTC()
		out = append(out, e)
	}
	return out, rows.Err()
}

// MountAdmin serves the admin's list and redelivery on the admin group (/admin).
func (s *Service) MountAdmin(admin *echo.Group) {
	admin.GET("/app-events", s.listAdmin)
	admin.POST("/app-events/:id/redeliver", s.redeliverAdmin)
}

var adminStatuses = map[string]bool{"pending": true, "delivered": true, "failed": true}

func (s *Service) listAdmin(c echo.Context) error {
	q := AdminQuery{Status: c.QueryParam("status"), UserID: c.QueryParam("user_id"), Limit: 100}
	if q.Status != "" && !adminStatuses[q.Status] {
		return apierr.New(apierr.CodeInvalidRequest, "status must be one of pending, delivered, failed")
	}
	if v := c.QueryParam("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			return apierr.New(apierr.CodeInvalidRequest, "limit must be an integer from 1 to 1000")
		}
		q.Limit = n
	}
	evs, err := s.List(c.Request().Context(), q)
	if err != nil {
		return database.APIError(err, "list the app events")
	}
	return c.JSON(http.StatusOK, map[string]any{"events": evs})
}

// ErrAlreadyPending: a redelivery of an event that is waiting for its push anyway.
var ErrAlreadyPending = errors.New("app events: the event is pending already")

// ErrNotFound: no event of the mode has the id.
var ErrNotFound = errors.New("app events: no such event")

// Redeliver pushes a delivered or failed event again (with a fresh 3-day window), audited.
func (s *Service) Redeliver(ctx context.Context, id string) error {
	return s.d.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var user, status string
		if err := tx.Raw(`SELECT user_id, status FROM app_events WHERE id = $1 AND livemode = $2 FOR UPDATE`, id, s.d.Livemode).
			Row().Scan(&user, &status); err != nil {
			if errors.Is(err, sql.ErrNoRows) {
				return ErrNotFound
			}
			return err
		}
		if status == "pending" {
			return ErrAlreadyPending
		}
		now := s.d.Now()
		if err := tx.Exec(`UPDATE app_events SET status = 'pending', first_attempt_at = NULL, next_at = $2, failed_at = NULL
			WHERE id = $1 AND livemode = $3`, id, now, s.d.Livemode).Error; err != nil {
			return err
		}
		if err := tx.Exec(`INSERT INTO app_event_queue (livemode, user_id, sequence, id, created_at)
			SELECT livemode, user_id, sequence, id, created_at FROM app_events WHERE id = $1 AND livemode = $2 ON CONFLICT DO NOTHING`,
			id, s.d.Livemode).Error; err != nil {
			return err
		}
		// Due now: the redelivered event is the user's head (the lowest sequence queued).
		if err := tx.Exec(`UPDATE app_event_users SET push_due_at = $3, wakes = wakes + 1 WHERE user_id = $1 AND livemode = $2`,
			user, s.d.Livemode, now).Error; err != nil {
			return err
		}
		return audit.Record(ctx, tx, audit.ActionAppEventRedeliver, id, s.d.Livemode, "queued (was "+status+")")
	})
}

func (s *Service) redeliverAdmin(c echo.Context) error {
	id := c.Param("id")
	err := s.Redeliver(c.Request().Context(), id)
	switch {
	case errors.Is(err, ErrNotFound):
		return apierr.New(apierr.CodeNotFound, "no app event %q in this mode", id)
	case errors.Is(err, ErrAlreadyPending):
		return apierr.New(apierr.CodeConflict, "app event %s is pending: it is pushed at its next attempt", id)
	case err != nil:
		return database.APIError(err, "redeliver the app event")
	}
	return c.JSON(http.StatusAccepted, map[string]string{"id": id, "status": "pending"})
}

func (s *Service) registerGauges(reg prometheus.Registerer) {
	read := func(query string) float64 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		var v float64
		if err := s.d.DB.WithContext(ctx).Raw(query, s.d.Livemode).Row().Scan(&v); err != nil {
			return -1
		}
		return v
	}
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "billing_app_events_pending",
			Help: "App events of the deployment's mode not yet delivered nor failed (-1: the database did not answer).",
		}, func() float64 {
			return read(`SELECT count(*) FROM app_event_queue WHERE livemode = $1`)
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "billing_app_event_oldest_pending_seconds",
			Help: "Age of the oldest pending app event (0: none pending; -1: the database did not answer).",
		}, func() float64 {
			return read(`SELECT coalesce(extract(epoch FROM now() - min(created_at)), 0) FROM app_event_queue WHERE livemode = $1`)
		}),
	)
}
