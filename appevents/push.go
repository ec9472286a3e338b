package appevents

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"gorm.io/gorm"

	"billing/internal/database"
)

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

// PusherConfig is what the push needs.
type PusherConfig struct {
	DB       *gorm.DB
	Livemode bool
	URL      string
	Signer   *Signer
	// Timeout bounds one attempt (app_events.timeout).
	Timeout time.Duration
	// Concurrency is how many users' heads are pushed at once (app_events.concurrency).
	Concurrency int
	// Client sends the pushes; one that follows no redirect when nil.
	Client  *http.Client
	Logger  *slog.Logger
	Now     func() time.Time
	Metrics *Metrics
}

// Pusher is the push loop of one process (Run). Every replica runs one; they share the users
// through leases on app_event_users, claimed with SKIP LOCKED, so a user's events are pushed by
// one process at a time, in sequence, each after the previous one was answered 2xx or given up.
//
// The loop claims the heads of up to Concurrency due users in one statement (their lease taken,
// each head read in the same snapshot as the user's wakes), pushes them at once, and records
// each answer in one statement that also releases the user and sets when it is due next: at the
// next head's time, at this head's retry, or never when nothing is pending. "Nothing" is decided
// against the wakes read in that statement's snapshot: a writer of a pending event bumps them
// under the user's lock, so an event committed after that look makes the user due again at once.
// A pushing process that dies holds its users until their lease (an attempt's timeout and 5 s)
// passes; then another claims them and pushes the head again (the app dedups by id).
type Pusher struct {
	cfg   PusherConfig
	db    *sql.DB
	log   *slog.Logger
	owner int64
	wake  chan struct{}
}

// NewPusher returns the push loop.
func NewPusher(cfg PusherConfig) *Pusher {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 16
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{
			// A redirect is an answer that is not 2xx: following it would send the signed event
			// somewhere app_events.url does not name.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
			Transport: &http.Transport{Proxy: http.ProxyFromEnvironment, MaxIdleConnsPerHost: cfg.Concurrency,
				IdleConnTimeout: 90 * time.Second, TLSHandshakeTimeout: cfg.Timeout, ForceAttemptHTTP2: true},
		}
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	return &Pusher{cfg: cfg, db: database.SQL(cfg.DB), log: cfg.Logger.With("component", "appevents"),
		owner: int64(binary.BigEndian.Uint64(b[:]) >> 1), wake: make(chan struct{}, 1)}
}

// leaseFor is how long a claim holds its user: an attempt and the statements around it.
func (p *Pusher) leaseFor() time.Duration { return p.cfg.Timeout + 5*time.Second }

// pushPoll is how long an idle loop waits before it looks for due users again; pushGather how
// long it lets freed slots gather before it claims for them (a claim a push would be a
// statement a push; gathered, one claims for several).
const (
	pushPoll   = 100 * time.Millisecond
	pushGather = 10 * time.Millisecond
)

// Run pushes until ctx ends, then lets the pushes in flight finish (each bounded by the timeout).
func (p *Pusher) Run(ctx context.Context) {
	p.log.InfoContext(ctx, "app events push started", "concurrency", p.cfg.Concurrency, "timeout", p.cfg.Timeout.String())
	slots := make(chan struct{}, p.cfg.Concurrency)
	var wg sync.WaitGroup
	defer wg.Wait()
	failing := false
	for ctx.Err() == nil {
		free := p.cfg.Concurrency - len(slots)
		heads := []claimed{}
		if free > 0 {
			var err error
			heads, err = p.claim(ctx, free)
			switch {
			case err != nil && ctx.Err() == nil:
				if !failing {
					p.log.ErrorContext(ctx, "app events push: claiming due users failed; retrying", "error", err)
				}
				failing = true
			case err == nil && failing:
				p.log.InfoContext(ctx, "app events push: claiming works again")
				failing = false
			}
		}
		for _, c := range heads {
			slots <- struct{}{}
			wg.Go(func() {
				defer func() { <-slots; p.nudge() }()
				if err := p.push(context.WithoutCancel(ctx), c); err != nil {
					p.log.ErrorContext(ctx, "app events push: recording an answer failed; the user is pushed again after its lease",
						"user_id", c.user, "app_event_id", c.head.id, "error", err)
				}
			})
		}
		if len(heads) > 0 && len(heads) == free {
			// Every free slot found a user: more may be due. Claim again once slots gather.
			p.gather(ctx, slots)
			continue
		}
		t := time.NewTimer(pushPoll)
		select {
		case <-ctx.Done():
		case <-p.wake:
			t.Stop()
			p.gather(ctx, slots)
			continue
		case <-t.C:
		}
		t.Stop()
	}
}

// gather waits until half the slots are free, at most pushGather.
func (p *Pusher) gather(ctx context.Context, slots chan struct{}) {
	t := time.NewTimer(pushGather)
	defer t.Stop()
	for cap(slots)-len(slots) < max(1, cap(slots)/2) {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			return
		case <-p.wake:
		}
	}
}

// nudge wakes the loop: a slot is free.
func (p *Pusher) nudge() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Step claims the due users once and pushes their heads, and returns how many it pushed: the
// loop's one round, for tests and tools.
func (p *Pusher) Step(ctx context.Context) (int, error) {
	heads, err := p.claim(ctx, p.cfg.Concurrency)
	if err != nil {
		return 0, err
	}
	var wg sync.WaitGroup
	errs := make([]error, len(heads))
	for k, c := range heads {
		wg.Go(func() { errs[k] = p.push(ctx, c) })
	}
	wg.Wait()
	return len(heads), errors.Join(errs...)
}

// pending is the head of a user's pending events.
type pending struct {
	id             string
	body           []byte
	attempts       int
	firstAttemptAt *time.Time
	nextAt         *time.Time
}

// claimed is a user claimed for one push: its head (nil: nothing pending as of the claim) and
// its wakes in the same snapshot.
type claimed struct {
	user  string
	wakes int64
	head  *pending
}

// headOf reads, for the users of the CTE u, their first queued event.
const headOf = `LEFT JOIN LATERAL (SELECT e.id, e.type, e.created_at, e.sequence, e.data, e.attempts, e.first_attempt_at, e.next_at
		  FROM app_event_queue q JOIN app_events e ON e.id = q.id
		  WHERE q.livemode = $1 AND q.user_id = u.user_id ORDER BY q.sequence LIMIT 1) h ON true`

// claim takes the lease of up to n due users and reads their heads.
func (p *Pusher) claim(ctx context.Context, n int) ([]claimed, error) {
	now := p.cfg.Now()
	var out []claimed
	err := asyncQuery(ctx, p.db, `WITH c AS (
		  SELECT user_id FROM app_event_users
		  WHERE livemode = $1 AND push_due_at <= $2 AND (push_lease_until IS NULL OR push_lease_until < $2)
		  ORDER BY push_due_at LIMIT $3 FOR UPDATE SKIP LOCKED),
		u AS (UPDATE app_event_users a SET push_lease_until = $4, push_lease_owner = $5 FROM c
		  WHERE a.user_id = c.user_id AND a.livemode = $1 RETURNING a.user_id)
		SELECT u.user_id, (SELECT s.wakes FROM app_event_users s WHERE s.user_id = u.user_id AND s.livemode = $1),
		  h.id, h.type, h.created_at, h.sequence, h.data, h.attempts, h.first_attempt_at, h.next_at
		FROM u `+headOf, []any{p.cfg.Livemode, now, n, now.Add(p.leaseFor()), p.owner}, func(rows pgx.Rows) error {
		for rows.Next() {
			var c claimed
			var id, typ sql.NullString
			var created, first, next sql.NullTime
			var seq, attempts sql.NullInt64
			var data []byte
			if err := rows.Scan(&c.user, &c.wakes, &id, &typ, &created, &seq, &data, &attempts, &first, &next); err != nil {
				return err
			}
			if id.Valid {
				h := &pending{id: id.String, attempts: int(attempts.Int64)}
				b := Body{ID: id.String, Type: typ.String, Created: created.Time.Unix(), Livemode: p.cfg.Livemode, UserID: c.user,
					Sequence: seq.Int64, Data: data}
				var err error
				if h.body, err = json.Marshal(b); err != nil {
					return err
				}
				if first.Valid {
					h.firstAttemptAt = &first.Time
				}
				if next.Valid {
					h.nextAt = &next.Time
				}
				c.head = h
			}
			out = append(out, c)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("app events: claim due users: %w", err)
	}
	return out, nil
}

// push pushes a claimed user's head and records the answer (or, with no head, ends the user's
// push when nothing is pending).
func (p *Pusher) push(ctx context.Context, c claimed) error {
	now := p.cfg.Now()
	if c.head == nil {
		return p.settle(ctx, c, "", nil, nil)
	}
	if c.head.nextAt != nil && c.head.nextAt.After(now) {
		// Due by the user's row but not by its head (a redelivery moved it): wait for the head.
		return p.settle(ctx, c, "", nil, c.head.nextAt)
	}
	h := c.head
	status, perr := p.send(ctx, h, now)
	done := p.cfg.Now()
	attempts := h.attempts + 1
	first := now
	if h.firstAttemptAt != nil {
		first = *h.firstAttemptAt
	}
	rec := &record{attempts: attempts, first: first, at: done, state: "delivered"}
	result := "delivered"
	var retryAt *time.Time
	if perr != nil {
		rec.errText = perr.Error()
		result = failureKind(perr)
		if done.Sub(first) >= Retry.GiveUp {
			rec.state = "failed"
		} else {
			rec.state = "pending"
			n := done.Add(RetryDelay(attempts))
			retryAt, rec.nextAt = &n, &n
		}
	}
	if err := p.settle(ctx, c, h.id, rec, retryAt); err != nil {
		return err
	}
	p.cfg.Metrics.deliveries.WithLabelValues(result).Inc()
	log := p.log.With("app_event_id", h.id, "user_id", c.user, "attempt", attempts)
	switch rec.state {
	case "delivered":
		log.Debug("app event delivered", "status", status)
	case "failed":
		p.cfg.Metrics.deliveries.WithLabelValues("dead_lettered").Inc()
		log.Error("app event failed: the app did not accept it for 3 days; the user's next event goes", "error", rec.errText)
	default:
		log.Warn("app event push failed; will retry", "error", rec.errText, "next_at", retryAt.UTC())
	}
	return nil
}

// record is the outcome of one attempt.
type record struct {
	attempts int
	first    time.Time
	at       time.Time
	state    string // delivered, pending (retried at nextAt), failed
	nextAt   *time.Time
	errText  string
}

// settle records an attempt (when rec is set) of event id and releases the user, due again at
// dueAt when set (a retry, or a head not yet due), else at the next head's time, else never —
// unless its wakes moved since this statement's snapshot (an event written meanwhile): then now.
func (p *Pusher) settle(ctx context.Context, c claimed, id string, rec *record, dueAt *time.Time) error {
	if rec == nil {
		rec = &record{}
	}
	now := p.cfg.Now()
	var settled int
	err := asyncQuery(ctx, p.db, `WITH held AS (
		  SELECT 1 FROM app_event_users WHERE user_id = $2 AND livemode = $1 AND push_lease_owner = $3),
		done AS (UPDATE app_events SET attempts = $5, first_attempt_at = $6, last_attempt_at = CAST($7 AS timestamptz),
		  status = CAST($8 AS text), next_at = $9, last_error = nullif(CAST($10 AS text), ''),
		  delivered_at = CASE WHEN CAST($8 AS text) = 'delivered' THEN CAST($7 AS timestamptz) END,
		  failed_at = CASE WHEN CAST($8 AS text) = 'failed' THEN CAST($7 AS timestamptz) END
		  WHERE id = $4 AND livemode = $1 AND status = 'pending' AND CAST($8 AS text) <> '' AND EXISTS (SELECT 1 FROM held) RETURNING 1),
		gone AS (DELETE FROM app_event_queue WHERE livemode = $1 AND user_id = $2 AND id = $4
		  AND CAST($8 AS text) IN ('delivered', 'failed') AND EXISTS (SELECT 1 FROM held)),
		nxt AS (SELECT e.next_at FROM app_event_queue q JOIN app_events e ON e.id = q.id
		  WHERE q.livemode = $1 AND q.user_id = $2 AND q.id <> $4 ORDER BY q.sequence LIMIT 1),
		s AS (SELECT wakes FROM app_event_users WHERE user_id = $2 AND livemode = $1),
		u AS (UPDATE app_event_users SET push_lease_until = NULL, push_lease_owner = NULL,
		  push_due_at = CASE WHEN CAST($11 AS timestamptz) IS NOT NULL THEN CAST($11 AS timestamptz)
		    WHEN EXISTS (SELECT 1 FROM nxt) THEN greatest((SELECT next_at FROM nxt), CAST($12 AS timestamptz))
		    WHEN wakes = (SELECT wakes FROM s) THEN NULL ELSE CAST($12 AS timestamptz) END
		  WHERE user_id = $2 AND livemode = $1 AND push_lease_owner = $3 RETURNING 1)
		SELECT (SELECT count(*) FROM u)`,
		[]any{p.cfg.Livemode, c.user, p.owner, id, rec.attempts, rec.first, rec.at, rec.state, rec.nextAt, rec.errText, dueAt, now},
		func(rows pgx.Rows) error {
			for rows.Next() {
				if err := rows.Scan(&settled); err != nil {
					return err
				}
			}
			return nil
		})
	if err != nil {
		return fmt.Errorf("app events: record push of %s: %w", id, err)
	}
	if settled == 0 {
		// The lease passed before this answer (a stalled process): another claim pushes on.
		p.log.WarnContext(ctx, "app events push: a user's lease passed before its answer was recorded", "user_id", c.user, "app_event_id", id)
	}
	return nil
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
