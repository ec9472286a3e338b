package webhooks

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"gorm.io/gorm"
)

// Group commit: inline applies that arrive together share a transaction. The events' handlers
// run in turn in one transaction, their rows are inserted last in one statement, and one COMMIT
// makes them all durable; only then is any of their deliveries answered 200. The promise is the one of a transaction per event:
// an event is stored processed together with its effects, or neither is. A process killed
// inside a batch commits none of it, and no delivery of the batch has had its 200, so Stripe
// delivers every one of them again.
//
// There are no savepoints (they would cost the round trips the batch saves): when any event of
// a batch fails (its handler, its row found stored already, a row locked by another
// transaction), the whole batch is rolled back and each of its events is applied again in a
// transaction of its own, the path of a single delivery, so that one event's failure is handled
// exactly as it would be alone and costs the others only the retry.
//
// Batches form by themselves, without waiting: a lane takes every apply queued, up to the
// batch's size, while the previous batch was on its way; a delivery that arrives to an idle
// lane is a batch of one. No goroutine stays behind once the queue is empty.

// Lanes never wait on a row lock held elsewhere: in a batch, a handler locks with LockRows, which
// is FOR UPDATE NOWAIT there, so a locked row fails the batch at once and its events are applied
// alone, where each waits in a slot of its own as a single delivery does. A lane held by a lock
// would hold every event queued behind it.

// batchKey marks the context of a batch's handlers.
type batchKey struct{}

// LockRows is the clause a handler locks its rows with: FOR UPDATE, and FOR UPDATE NOWAIT in a
// batch of group commit (see above).
func LockRows(ctx context.Context) string {
	if ctx.Value(batchKey{}) != nil {
		return "FOR UPDATE NOWAIT"
	}
	return "FOR UPDATE"
}

// InBatch is ctx as group commit hands it to a batch's handlers, in which LockRows is NOWAIT:
// for the tests of handlers, which must never wait on a row lock in a batch.
func InBatch(ctx context.Context) context.Context { return context.WithValue(ctx, batchKey{}, true) }

// lockNotAvailable reports whether err is a NOWAIT lock that found its row locked.
func lockNotAvailable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

// groupLanes is how many batches are applied at once.
const groupLanes = 4

// pendingApply is a delivery waiting for its event to be applied in a batch.
type pendingApply struct {
	ctx  context.Context // the delivery's: once done, the delivery has given up
	ev   storedEvent
	done chan applyOutcome // buffered: a lane never waits for a delivery
}

// applyOutcome is a batch's word to one of its deliveries. A batch of one reports the attempt's
// outcome as a transaction of its own would (applyErr, the handler's failure; err, the
// transaction's); a larger batch reports success, or alone: it was rolled back, apply the event
// in a transaction of its own.
type applyOutcome struct {
	appliedAt     time.Time
	applyErr, err error
	alone         bool
}

// committer queues the inline applies and runs their batches.
type committer struct {
	i     *Inbox
	max   int // events per batch
	lanes int // batches at once: groupLanes

	mu      sync.Mutex
	queue   []*pendingApply
	running int // lanes at work
}

// submit queues p and starts a lane if one is free.
func (c *committer) submit(p *pendingApply) {
	c.mu.Lock()
	c.queue = append(c.queue, p)
	if c.running >= c.lanes {
		c.mu.Unlock()
		return
	}
	c.running++
	c.mu.Unlock()
	go c.lane()
}

// lane applies batches until the queue is empty.
func (c *committer) lane() {
	for {
		c.mu.Lock()
		n := min(len(c.queue), c.max)
		if n == 0 {
			c.running--
			c.mu.Unlock()
			return
		}
		batch := make([]*pendingApply, n)
		copy(batch, c.queue)
		c.queue = append(c.queue[:0], c.queue[n:]...)
		c.mu.Unlock()
		c.run(batch)
	}
}

// run applies a batch in one transaction and tells each delivery how it went.
func (c *committer) run(batch []*pendingApply) {
	live := batch[:0]
	for _, p := range batch {
		if p.ctx.Err() == nil { // a delivery that gave up has gone to the queue's path
			live = append(live, p)
		}
	}
	if len(live) == 0 {
		return
	}
	// The budget of a batch of one is its delivery's, as if it ran alone; a larger batch has its
	// own, so that no single delivery's request cuts it short for the others.
	ctx := live[0].ctx
	if len(live) > 1 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.Background(), c.i.cfg.InlineTimeout)
		defer cancel()
	}
	ctx = InBatch(ctx)
	evs := make([]storedEvent, len(live))
	for k, p := range live {
		evs[k] = p.ev
	}
	applied := make([]time.Time, len(live)) // zero if the transaction never began
	var applyErr error
	err := c.i.cfg.DB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var err error
		if applied, applyErr, err = c.i.applyInTx(ctx, tx, evs); applyErr != nil {
			return applyErr
		}
		return err
	})
	switch {
	case len(live) == 1 && !lockNotAvailable(err):
		live[0].done <- applyOutcome{appliedAt: applied[0], applyErr: applyErr, err: err}
	case err != nil:
		c.i.metrics.batchRetries.Add(float64(len(live)))
		for _, p := range live {
			p.done <- applyOutcome{alone: true}
		}
	default:
		c.i.metrics.batches.Observe(float64(len(live)))
		for k, p := range live {
			p.done <- applyOutcome{appliedAt: applied[k]}
		}
	}
}

// applyBatched waits for the outcome of the event's batch; err is the delivery's context's end
// (its batch may still commit the event: the queue's path then finds it stored).
func (i *Inbox) applyBatched(ctx context.Context, ev storedEvent) (applyOutcome, error) {
	p := &pendingApply{ctx: ctx, ev: ev, done: make(chan applyOutcome, 1)}
	i.commit.submit(p)
	select {
	case o := <-p.done:
		return o, nil
	case <-ctx.Done():
		return applyOutcome{}, ctx.Err()
	}
}
