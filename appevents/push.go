package appevents

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"gorm.io/gorm"
)

// Queue is the River queue of the push jobs: its workers are the users pushed at once, apart
// from the default queue's, so that a slow app never delays notices or re-reads.
const Queue = "app_events"

// PushJobKind is the kind of the push job.
const PushJobKind = "app_event_push"

// pushJobAttempts bounds a push job's errors (the database failing): its events' own attempts
// and their schedule are in app_events, so a job is snoozed, not failed, by an app that fails.
const pushJobAttempts = 25

// PushArgs is the job that pushes one user's pending events, in sequence order. One is queued
// per user at a time (app_event_users.push_queued).
type PushArgs struct {
	UserID   string `json:"user_id"`
	Livemode bool   `json:"livemode"`
}

func (PushArgs) Kind() string { return PushJobKind }

// InsertOpts puts the job on the app events queue also when River inserts it.
func (PushArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: Queue, MaxAttempts: pushJobAttempts}
}

// Retry is the schedule of a push that failed: the delay after the nth failed attempt (the
// last repeats), and how long after its first attempt an event is given up (failed).
var Retry = struct {
	Delays []time.Duration
	GiveUp time.Duration
}{
	Delays: []time.Duration{5 * time.Second, 30 * time.Second, 2 * time.Minute, 10 * time.Minute, time.Hour, 6 * time.Hour},
	GiveUp: 72 * time.Hour,
}

// RetryDelay is the wait after the nth failed attempt (n ≥ 1).
func RetryDelay(n int) time.Duration {
	if n < 1 {
		n = 1
	}
	if n > len(Retry.Delays) {
		n = len(Retry.Delays)
	}
	return Retry.Delays[n-1]
}

// Signer signs pushes by the Standard Webhooks specification with every configured secret.
type Signer struct {
	hooks []*standardwebhooks.Webhook
}

// NewSigner takes the secrets, each "whsec_" and base64 (checked by config).
func NewSigner(secrets []string) (*Signer, error) {
	s := &Signer{}
	for k, sec := range secrets {
		if !strings.HasPrefix(sec, "whsec_") {
			return nil, fmt.Errorf("app events: secret %d does not start with whsec_", k+1)
		}
		h, err := standardwebhooks.NewWebhook(sec)
		if err != nil {
			return nil, fmt.Errorf("app events: secret %d is not base64", k+1)
		}
		s.hooks = append(s.hooks, h)
	}
	if len(s.hooks) == 0 {
		return nil, errors.New("app events: no secret to sign with")
	}
	return s, nil
}

// Signature is the webhook-signature header of a push: "v1,…" per secret, space separated.
func (s *Signer) Signature(id string, at time.Time, body []byte) string {
	sigs := make([]string, 0, len(s.hooks))
	for _, h := range s.hooks {
		sig, _ := h.Sign(id, at, body) // signing cannot fail once the secret decoded
		sigs = append(sigs, sig)
	}
	return strings.Join(sigs, " ")
}

// PusherConfig is what the push worker needs.
type PusherConfig struct {
	DB     *gorm.DB
	URL    string
	Signer *Signer
	// Timeout bounds one attempt (app_events.timeout).
	Timeout time.Duration
	// Client sends the pushes; one that follows no redirect when nil.
	Client  *http.Client
	Logger  *slog.Logger
	Now     func() time.Time
	Metrics *Metrics
}

// Pusher is the River worker of PushArgs.
type Pusher struct {
	river.WorkerDefaults[PushArgs]
	cfg PusherConfig
	log *slog.Logger
}

// NewPusher returns the push worker.
func NewPusher(cfg PusherConfig) *Pusher {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{
			// A redirect is an answer that is not 2xx: following it would send the signed event
			// somewhere app_events.url does not name.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	return &Pusher{cfg: cfg, log: cfg.Logger.With("component", "appevents")}
}

// runBudget is how long one run of a push job pushes before it hands its place back (River
// bounds a job's run time; a user with thousands of pending events is pushed over several runs).
const runBudget = 20 * time.Second

// leaseFor is how long a run holds its user: an attempt and the statements around it, renewed
// at each attempt. A run that dies (kill -9) holds its user that long after River rescues it.
func (p *Pusher) leaseFor() time.Duration { return p.cfg.Timeout + 5*time.Second }

// Timeout lets a run last its budget and one attempt more.
func (p *Pusher) Timeout(*river.Job[PushArgs]) time.Duration {
	return runBudget + p.cfg.Timeout + 5*time.Second
}

// pending is the head of a user's pending events.
type pending struct {
	id             string
	body           []byte
	attempts       int
	firstAttemptAt *time.Time
	nextAt         *time.Time
}

// Work pushes the user's pending events in sequence order, each after the previous one was
// answered 2xx or given up, until none is due, and then lets the next event queue a job.
//
// Three statements an event: the claim (or the previous event's record) reads the next head;
// the push is recorded with the lease renewed; the run ends with a compare-and-set of the
// user's wakes, which every writer of a pending event bumps under the user's lock. The wakes
// compared are read in the same snapshot as "nothing pending": an event committed after that
// snapshot moved them, so the run goes on instead of leaving it without a job.
func (p *Pusher) Work(ctx context.Context, job *river.Job[PushArgs]) error {
	a := job.Args
	db := p.cfg.DB.WithContext(ctx)
	start := p.cfg.Now()
	head, wakes, held, err := p.claim(ctx, db, a, job.ID)
	if err != nil {
		return err
	}
	if !held {
		// Another run holds the user (a rescued job whose first run is still going): after its
		// lease, this one pushes what is left.
		return river.JobSnooze(p.leaseFor())
	}
	for {
		if head == nil {
			done, lost, err := p.finish(ctx, db, a, job.ID, wakes)
			switch {
			case err != nil:
				return err
			case lost:
				return river.JobSnooze(p.leaseFor())
			case done:
				return nil
			}
			// An event was written (or redelivered) meanwhile.
			if head, wakes, err = p.head(ctx, db, a); err != nil {
				return err
			}
			continue
		}
		now := p.cfg.Now()
		if head.nextAt != nil && head.nextAt.After(now) {
			return p.release(ctx, db, a, job.ID, river.JobSnooze(head.nextAt.Sub(now)))
		}
		if now.Sub(start) > runBudget {
			return p.release(ctx, db, a, job.ID, river.JobSnooze(0))
		}
		if ctx.Err() != nil {
			return p.release(context.WithoutCancel(ctx), p.cfg.DB, a, job.ID, river.JobSnooze(0))
		}
		next, nextWakes, retryAt, err := p.attempt(ctx, db, a, job.ID, head)
		if err != nil {
			return err
		}
		if retryAt != nil {
			return p.release(ctx, db, a, job.ID, river.JobSnooze(retryAt.Sub(p.cfg.Now())))
		}
		head, wakes = next, nextWakes
	}
}

// headQuery reads the head of the user's pending events ($1, $2) and, in the same snapshot,
// the user's wakes; idCond ("" or "AND id <> $n") leaves out the event just recorded.
func headQuery(idCond string) string {
	return `SELECT s.wakes, e.id, e.type, e.created_at, e.sequence, e.data, e.attempts, e.first_attempt_at, e.next_at
		FROM (SELECT wakes FROM app_event_users WHERE user_id = $1 AND livemode = $2) s
		LEFT JOIN LATERAL (SELECT id, type, created_at, sequence, data, attempts, first_attempt_at, next_at FROM app_events
		  WHERE user_id = $1 AND livemode = $2 AND status = 'pending' ` + idCond + ` ORDER BY sequence LIMIT 1) e ON true`
}

// scanHead scans a headQuery row (after the columns in pre).
func (p *Pusher) scanHead(row interface{ Scan(...any) error }, a PushArgs, pre ...any) (*pending, int64, error) {
	var wakes int64
	var id, typ sql.NullString
	var created, first, next sql.NullTime
	var seq sql.NullInt64
	var data []byte
	var attempts sql.NullInt64
	if err := row.Scan(append(pre, &wakes, &id, &typ, &created, &seq, &data, &attempts, &first, &next)...); err != nil {
		return nil, 0, err
	}
	if !id.Valid {
		return nil, wakes, nil
	}
	h := &pending{id: id.String, attempts: int(attempts.Int64)}
	b := Body{ID: id.String, Type: typ.String, Created: created.Time.Unix(), Livemode: a.Livemode, UserID: a.UserID,
		Sequence: seq.Int64, Data: data}
	var err error
	if h.body, err = json.Marshal(b); err != nil {
		return nil, 0, err
	}
	if first.Valid {
		h.firstAttemptAt = &first.Time
	}
	if next.Valid {
		h.nextAt = &next.Time
	}
	return h, wakes, nil
}

// claim takes the user's lease for this job and reads the head.
func (p *Pusher) claim(ctx context.Context, db *gorm.DB, a PushArgs, jobID int64) (*pending, int64, bool, error) {
	now := p.cfg.Now()
	row := db.Raw(`WITH c AS (UPDATE app_event_users SET push_lease_until = $3, push_lease_owner = $4
		  WHERE user_id = $1 AND livemode = $2 AND (push_lease_until IS NULL OR push_lease_until < $5 OR push_lease_owner = $4) RETURNING 1)
		SELECT h.* FROM (`+headQuery("")+`) h WHERE EXISTS (SELECT 1 FROM c)`,
		a.UserID, a.Livemode, now.Add(p.leaseFor()), jobID, now).Row()
	h, wakes, err := p.scanHead(row, a)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, 0, false, nil
	}
	if err != nil {
		return nil, 0, false, fmt.Errorf("app events: claim user %s: %w", a.UserID, err)
	}
	return h, wakes, true, nil
}

// head reads the head again.
func (p *Pusher) head(ctx context.Context, db *gorm.DB, a PushArgs) (*pending, int64, error) {
	h, wakes, err := p.scanHead(db.Raw(headQuery(""), a.UserID, a.Livemode).Row(), a)
	if err != nil {
		return nil, 0, fmt.Errorf("app events: read pending of user %s: %w", a.UserID, err)
	}
	return h, wakes, nil
}

// release gives the lease back and returns then.
func (p *Pusher) release(ctx context.Context, db *gorm.DB, a PushArgs, jobID int64, then error) error {
	if err := db.WithContext(ctx).Exec(`UPDATE app_event_users SET push_lease_until = NULL, push_lease_owner = NULL
		WHERE user_id = $1 AND livemode = $2 AND push_lease_owner = $3`, a.UserID, a.Livemode, jobID).Error; err != nil {
		return fmt.Errorf("app events: release user %s: %w", a.UserID, err)
	}
	return then
}

// finish ends the user's push when its wakes are still those read with "nothing pending": a
// writer of a pending event bumps them under the user's lock and queues a job only when none is
// queued, so either it sees push_queued false after this, or this sees its wakes and goes on.
// lost: the lease is another run's.
func (p *Pusher) finish(ctx context.Context, db *gorm.DB, a PushArgs, jobID, wakes int64) (done, lost bool, err error) {
	var ended []bool
	if err := db.Raw(`UPDATE app_event_users SET push_queued = (wakes <> $3),
		  push_lease_until = CASE WHEN wakes = $3 THEN NULL ELSE push_lease_until END,
		  push_lease_owner = CASE WHEN wakes = $3 THEN NULL ELSE push_lease_owner END
		WHERE user_id = $1 AND livemode = $2 AND push_lease_owner = $4 RETURNING wakes = $3`,
		a.UserID, a.Livemode, wakes, jobID).Scan(&ended).Error; err != nil {
		return false, false, fmt.Errorf("app events: finish user %s: %w", a.UserID, err)
	}
	if len(ended) == 0 {
		return false, true, nil
	}
	return ended[0], false, nil
}

// attempt pushes one event and records the answer with the lease renewed, reading the next head
// in the same statement. retryAt: the push failed and is retried then (the run ends).
func (p *Pusher) attempt(ctx context.Context, db *gorm.DB, a PushArgs, jobID int64, h *pending) (next *pending, wakes int64, retryAt *time.Time, err error) {
	at := p.cfg.Now()
	status, perr := p.send(ctx, h, at)
	done := p.cfg.Now()
	attempts := h.attempts + 1
	first := at
	if h.firstAttemptAt != nil {
		first = *h.firstAttemptAt
	}
	result, state, errText := "delivered", "delivered", ""
	var nextAt *time.Time
	if perr != nil {
		errText = perr.Error()
		result = failureKind(perr)
		if done.Sub(first) >= Retry.GiveUp {
			state = "failed"
		} else {
			state = "pending"
			n := done.Add(RetryDelay(attempts))
			nextAt = &n
		}
	}
	var recorded int
	row := db.Raw(`WITH lease AS (
		  UPDATE app_event_users SET push_lease_until = $9 WHERE user_id = $1 AND livemode = $2 AND push_lease_owner = $8 RETURNING 1),
		done AS (UPDATE app_events SET attempts = $4, first_attempt_at = $5, last_attempt_at = CAST($6 AS timestamptz),
		  status = CAST($7 AS text), next_at = $10, last_error = nullif(CAST($11 AS text), ''),
		  delivered_at = CASE WHEN CAST($7 AS text) = 'delivered' THEN CAST($6 AS timestamptz) END,
		  failed_at = CASE WHEN CAST($7 AS text) = 'failed' THEN CAST($6 AS timestamptz) END
		  WHERE id = $3 AND livemode = $2 AND status = 'pending' AND EXISTS (SELECT 1 FROM lease) RETURNING 1)
		SELECT (SELECT count(*) FROM done), h.* FROM (`+headQuery("AND id <> $3")+`) h`,
		a.UserID, a.Livemode, h.id, attempts, first, done, state, jobID, done.Add(p.leaseFor()), nextAt, errText).Row()
	next, wakes, err = p.scanHead(row, a, &recorded)
	if err != nil {
		return nil, 0, nil, fmt.Errorf("app events: record push of %s: %w", h.id, err)
	}
	if recorded == 0 {
		// The lease was lost (this run outlived it): the run that holds it pushes from here.
		return nil, 0, nil, river.JobSnooze(p.leaseFor())
	}
	p.cfg.Metrics.deliveries.WithLabelValues(result).Inc()
	log := p.log.With("app_event_id", h.id, "user_id", a.UserID, "attempt", attempts)
	switch state {
	case "delivered":
		log.Debug("app event delivered", "status", status)
		return next, wakes, nil, nil
	case "failed":
		p.cfg.Metrics.deliveries.WithLabelValues("dead_lettered").Inc()
		log.Error("app event failed: the app did not accept it for 3 days; the user's next event goes", "error", errText)
		return next, wakes, nil, nil
	}
	log.Warn("app event push failed; will retry", "error", errText, "next_at", nextAt.UTC())
	return nil, 0, nextAt, nil
}

// pushError is an answer that is not a delivery.
type pushError struct {
	kind string // timeout, unreachable, status, redirect
	msg  string
}

func (e *pushError) Error() string { return e.msg }

func failureKind(err error) string {
	var pe *pushError
	if errors.As(err, &pe) {
		return pe.kind
	}
	return "error"
}

// send POSTs the event and returns the app's status: nil error only for a 2xx.
func (p *Pusher) send(ctx context.Context, h *pending, at time.Time) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.cfg.URL, bytes.NewReader(h.body))
	if err != nil {
		return 0, &pushError{"unreachable", "build request: " + err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "billing-app-events/1")
	req.Header.Set(standardwebhooks.HeaderWebhookID, h.id)
	req.Header.Set(standardwebhooks.HeaderWebhookTimestamp, strconv.FormatInt(at.Unix(), 10))
	req.Header.Set(standardwebhooks.HeaderWebhookSignature, p.cfg.Signer.Signature(h.id, at, h.body))
	resp, err := p.cfg.Client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return 0, &pushError{"timeout", fmt.Sprintf("no answer within %s", p.cfg.Timeout)}
		}
		return 0, &pushError{"unreachable", redactURL(err.Error(), p.cfg.URL)}
	}
	defer resp.Body.Close()
	// The body is read (a little) so that the connection can be reused; its content is not
	// the answer: the status is.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		return resp.StatusCode, nil
	case resp.StatusCode >= 300 && resp.StatusCode < 400:
		return resp.StatusCode, &pushError{"redirect", fmt.Sprintf("answered %d (a redirect is not followed)", resp.StatusCode)}
	}
	return resp.StatusCode, &pushError{"status", fmt.Sprintf("answered %d", resp.StatusCode)}
}

// redactURL keeps the url's query (it may carry a token) out of an error text.
func redactURL(msg, url string) string {
	if i := strings.IndexByte(url, '?'); i >= 0 {
		msg = strings.ReplaceAll(msg, url[i:], "?…")
	}
	return msg
}

// Metrics are the push's and the outbox's metrics.
type Metrics struct {
	deliveries *prometheus.CounterVec
}

// NewMetrics makes the metrics and registers them with reg (when not nil).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "billing_app_event_deliveries_total",
		Help: "Push attempts of app events by result: delivered, status (a non-2xx answer), redirect, timeout, unreachable; dead_lettered counts events given up after 3 days.",
	}, []string{"result"})}
	for _, r := range []string{"delivered", "status", "redirect", "timeout", "unreachable", "dead_lettered"} {
		m.deliveries.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.deliveries)
	}
	return m
}
