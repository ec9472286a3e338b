// Package webhooks is the service's inbox for Stripe events: it verifies each delivery on the
// raw body and, in one transaction before answering, stores it and applies its effects (or, when
// that fails or ApplyInline is off, stores it with its processing job, which a River worker runs
// later the same way). It also keeps the dead letters and serves the admin event API. It imports
// no domain package: domain packages register Handlers.
package webhooks

import (
	"log/slog"
	"time"

	"github.com/riverqueue/river"
	"gorm.io/gorm"

	"billing/internal/httpserver"
	"billing/internal/jobs"
)

// Config is what the inbox needs from main.
// DefaultInlineSlotWait is how long a delivery waits for a free inline slot before its event is
// stored and queued: far above a free slot's wait (microseconds), far below Stripe's patience.
const DefaultInlineSlotWait = 100 * time.Millisecond

type Config struct {
	DB       *gorm.DB
	Logger   *slog.Logger
	Registry *Registry
	// Secrets returns the webhook secrets of a mode, newest first.
	TestSecrets []string
	LiveSecrets []string
	Tolerance   time.Duration
	// MaxAttempts is how many processing attempts an event gets before it is dead-lettered.
	MaxAttempts int
	// RetryDelay is the base of the exponential backoff between attempts.
	RetryDelay time.Duration
	Metrics    *Metrics
	Now        func() time.Time
	// Retention is how long processed and ignored events are kept (0: forever).
	Retention time.Duration
	// ApplyInline applies handled events in their receive transaction; the River worker then
	// only retries the ones whose first attempt failed (and replays).
	ApplyInline bool
	// InlineTimeout bounds an inline attempt (5 s if zero; well within Stripe's patience, far
	// above an attempt's milliseconds even on a saturated machine, where a shorter budget would
	// throw work away); past it the event is rolled back and queued, so a delivery never waits
	// long on a lock held elsewhere.
	InlineTimeout time.Duration
	// InlineConcurrency bounds the inline attempts in flight (16 if zero). Each holds a pooled
	// connection for its transaction: a burst of deliveries must leave connections to the
	// entitlement reads and the workers. A delivery waits for a slot within InlineSlotWait, then
	// goes to the queue.
	InlineConcurrency int
	// InlineSlotWait bounds the wait for a free inline slot (100 ms if zero): when every slot is
	// held by slow transactions, an unrelated delivery is stored and queued for the workers
	// instead of waiting behind them for the whole InlineTimeout.
	InlineSlotWait time.Duration
	// GroupCommit is how many inline applies that arrive together may share a transaction and
	// its COMMIT (0 or 1: each has its own). See groupcommit.go for the promise it keeps.
	GroupCommit int
	// BodyBudget bounds the bytes of delivery bodies held at once before their signature is
	// verified (DefaultBodyBudget if zero): memory stays bounded whatever the number of
	// connections; a delivery over it is answered 503 busy and Stripe delivers it again.
	BodyBudget int64
}

// DefaultBodyBudget is the bytes of delivery bodies held at once when Config.BodyBudget is zero:
// 32 bodies of the largest size, thousands of Stripe's usual few KB.
const DefaultBodyBudget = 32 << 20

// Inbox receives, stores, processes and replays Stripe events.
type Inbox struct {
	cfg     Config
	log     *slog.Logger
	jobs    jobs.Inserter
	metrics *Metrics
	// inlineSlots holds a token per inline attempt in flight.
	inlineSlots chan struct{}
	// commit gathers inline applies into shared transactions; nil when GroupCommit is off.
	commit *committer
	// bodies is the byte budget of the bodies being read and verified.
	bodies *httpserver.ByteBudget
}

// New returns an inbox. SetJobs must be called before it receives events.
func New(cfg Config) *Inbox {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.MaxAttempts < 1 {
		cfg.MaxAttempts = 3
	}
	if cfg.RetryDelay <= 0 {
		cfg.RetryDelay = 30 * time.Second
	}
	if cfg.InlineTimeout <= 0 {
		cfg.InlineTimeout = 5 * time.Second
	}
	if cfg.InlineConcurrency <= 0 {
		cfg.InlineConcurrency = 16
	}
	if cfg.InlineSlotWait <= 0 {
		cfg.InlineSlotWait = DefaultInlineSlotWait
	}
	if cfg.BodyBudget <= 0 {
		cfg.BodyBudget = DefaultBodyBudget
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	i := &Inbox{cfg: cfg, log: cfg.Logger.With("component", "webhooks"), metrics: cfg.Metrics,
		inlineSlots: make(chan struct{}, cfg.InlineConcurrency), bodies: httpserver.NewByteBudget(cfg.BodyBudget)}
	if cfg.ApplyInline && cfg.GroupCommit > 1 {
		i.commit = &committer{i: i, max: cfg.GroupCommit, lanes: groupLanes}
	}
	return i
}

// SetJobs gives the inbox the River client it enqueues with. River's client is built after the
// workers are registered, hence this second step.
func (i *Inbox) SetJobs(j jobs.Inserter) { i.jobs = j }

// AddWorkers registers the inbox's River workers.
func (i *Inbox) AddWorkers(w *river.Workers) {
	river.AddWorker(w, &processor{inbox: i})
	river.AddWorker(w, &sweeper{inbox: i})
	river.AddWorker(w, &pruner{inbox: i})
}

func (i *Inbox) secrets(livemode bool) []string {
	if livemode {
		return i.cfg.LiveSecrets
	}
	return i.cfg.TestSecrets
}
