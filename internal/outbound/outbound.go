// Package outbound is the one implementation of the protocol by which the service makes an
// object on Stripe (a customer, a charge, a refund, …) exactly once, whatever the retries,
// crashes and concurrent requests. Its users keep their own tables, parameters and answers; the
// order of the steps and the rules below live here only.
//
//  1. The row is committed, pending, before any call: Run opens its own transaction on a pool
//     handle (it refuses a transaction handle), so the row it locks is one that a crash cannot
//     take back. A row that is not there (never committed, or dropped meanwhile) is Gone and
//     nothing is called.
//  2. The row lock is held across the call: Run locks the row (SELECT … FOR UPDATE), calls
//     Stripe and records the outcome in that one transaction. Concurrent attempts at one row
//     queue on the lock and find it finished.
//  3. Every attempt uses the same idempotency key: the one the locked row gives (State.Key),
//     set by Run in the stripe.Params handed to Create, so a repeat after a lost answer gets
//     Stripe's first answer back instead of a second object.
//  4. Past KeyWindow, Stripe may have forgotten the key: Run asks Find for the object an
//     earlier attempt would have made before it lets Create make one. A failed lookup is never
//     followed by a create.
//  5. A final refusal (Final) completes or drops the row (Refuse); any other failure leaves it
//     pending with the attempt recorded (RecordAttempt), to be finished by the next attempt
//     under the same key.
//
// An asynchronous caller (a background reporter working through many rows) may also skip a row
// that a concurrent attempt holds (Select.SkipLocked: Busy) instead of queueing on it. And an
// object that Stripe offers no lookup for (a meter event has no retrieve by its identifier)
// has no Find: past the window the row is handed to Review, which records it for an operator's
// decision; it is never created again blindly. Such a caller counts the window from a moment it
// commits before each first attempt (State.CreatedAt), and may shorten it (Call.Window).
package outbound

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v79"
	"gorm.io/gorm"

	"billing/internal/stripeclient"
)

// KeyWindow is how long after a row's creation Stripe is trusted to still know its idempotency
// key. Stripe keeps keys for at least 24 hours after their first use; the row is committed
// before that first use, so its age bounds the key's from above, and the hour of margin covers
// clock skew and the duration of the calls.
const KeyWindow = 23 * time.Hour

// Key is an idempotency key derived from business identifiers: kind-id1-id2…
// (customer-{user_id}, charge-{order_id}, refund-{order_id}-{refund_id},
// checkout-{user_id}-{request_id}).
func Key(kind string, ids ...string) string {
	return kind + "-" + strings.Join(ids, "-")
}

// ErrInTransaction is Run given a transaction handle: the pending row would not be committed
// before the call (rule 1), and the lock would outlive the call's transaction.
var ErrInTransaction = errors.New("outbound: Run needs a pool handle, not a transaction")

// Select reads the call's one row. SQL is a SELECT with $n placeholders and no locking clause
// (Run adds FOR UPDATE, and so must be the only table it names); the row is scanned into Into, a
// pointer to a struct, by column name.
type Select struct {
	SQL  string
	Args []any
	Into any
	// SkipLocked skips a row that a concurrent attempt holds (FOR UPDATE SKIP LOCKED): Run
	// returns Busy and calls nothing.
	SkipLocked bool
}

// State is what the protocol needs to know of the locked row.
type State struct {
	// Key is the idempotency key of the row: stored with it or derived from its identifiers,
	// never from the request at hand.
	Key string
	// CreatedAt is a moment committed before the key's first use: when the row was first
	// committed, or, for a caller that commits it before every first attempt, when that attempt
	// began. The window is counted from it.
	CreatedAt time.Time
	// Done says that Stripe's final answer is recorded already: nothing is called.
	Done bool
}

// Step names a call to Stripe.
type Step int

const (
	// StepFind is the lookup of an earlier attempt's object past KeyWindow.
	StepFind Step = iota + 1
	// StepCreate is the create under the idempotency key.
	StepCreate
)

func (s Step) String() string {
	switch s {
	case StepFind:
		return "find"
	case StepCreate:
		return "create"
	}
	return "none"
}

// Attempt is one attempt at Stripe, as the callbacks record it.
type Attempt struct {
	At   time.Time // when its outcome was known (Call.Now, in UTC)
	Step Step      // the call that made, found or failed to make the object
	Err  error     // the failure; nil when the object was made or found
}

// Call is one attempt at finishing a pending row. Every field but Now and Log is required.
type Call[T any] struct {
	// Lock reads the row; Run locks it.
	Lock Select
	// Locked inspects the row scanned into Lock.Into. An error (say, a row of the other mode)
	// stops the call before Stripe and is returned by Run.
	Locked func(tx *gorm.DB) (State, error)
	// Find looks for the object an earlier attempt made (by metadata); found is false when
	// there is none. Only called past the window. Exactly one of Find and Review is set.
	Find func(ctx context.Context) (obj T, found bool, err error)
	// Review records a row past the window whose object Stripe cannot be asked about: whether
	// an earlier attempt made it is unknowable, so it is neither created again nor dropped, but
	// left to an operator. Its Attempt has no Step.
	Review func(tx *gorm.DB, a Attempt) error
	// Window is how long Stripe is trusted to remember the key; KeyWindow when zero.
	Window time.Duration
	// Create makes the object. p carries the context and the row's idempotency key; it must
	// be sent as it is (the Params field of the stripe-go parameters).
	Create func(p stripe.Params) (T, error)
	// Complete records the object (made, or found by Find) in the row.
	Complete func(tx *gorm.DB, obj T, a Attempt) error
	// Refuse records a final refusal (a.Err): it completes the row with the refusal, or drops
	// it when nothing would remain under the key.
	Refuse func(tx *gorm.DB, a Attempt) error
	// RecordAttempt records a failure that leaves the row pending.
	RecordAttempt func(tx *gorm.DB, a Attempt) error

	// Now is the clock of the row ages and attempts; time.Now when nil.
	Now func() time.Time
	// Log receives one line per lookup hit, refusal and failed attempt; nothing when nil.
	Log *slog.Logger
}

// Outcome is where a Run left the row.
type Outcome int

const (
	// AlreadyDone: the row was complete when locked (a concurrent attempt finished it).
	AlreadyDone Outcome = iota + 1
	// Gone: there was no row to lock.
	Gone
	// Completed: Stripe made the object, or Find found it; Complete recorded it.
	Completed
	// Refused: Stripe refused finally; Refuse recorded it.
	Refused
	// Pending: the attempt failed without a final answer; RecordAttempt recorded it.
	Pending
	// Busy: a concurrent attempt holds the row (Select.SkipLocked); nothing was called.
	Busy
	// Review: past the window with no lookup; Review recorded it and nothing was called.
	Review
)

func (o Outcome) String() string {
	switch o {
	case AlreadyDone:
		return "already done"
	case Gone:
		return "gone"
	case Completed:
		return "completed"
	case Refused:
		return "refused"
	case Pending:
		return "pending"
	case Busy:
		return "busy"
	case Review:
		return "review"
	}
	return "unknown"
}

// Result is a Run's outcome and, unless AlreadyDone or Gone, the attempt it made.
type Result struct {
	Outcome Outcome
	Attempt Attempt
}

// Run finishes the pending row of c, following the rules of the package doc, in one
// transaction on db, which must be a pool handle. Its error is a failed statement, a callback's
// error or Locked's refusal; the transaction is then rolled back and the row stays as it was, so
// that the next attempt repeats the same call under the same key.
func Run[T any](ctx context.Context, db *gorm.DB, c Call[T]) (Result, error) {
	if err := c.check(); err != nil {
		return Result{}, err
	}
	if _, inTx := db.Statement.ConnPool.(gorm.TxCommitter); inTx {
		return Result{}, ErrInTransaction
	}
	now := time.Now
	if c.Now != nil {
		now = c.Now
	}
	log := c.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}

	var res Result
	err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if c.Lock.SkipLocked {
			// Tell a held row from a missing one: only the first is Busy.
			var held bool
			if err := tx.Raw(`SELECT EXISTS (`+c.Lock.SQL+`)`, c.Lock.Args...).Scan(&held).Error; err != nil {
				return fmt.Errorf("find row: %w", err)
			}
			if !held {
				res.Outcome = Gone
				return nil
			}
		}
		lockSQL := c.Lock.SQL + " FOR UPDATE"
		if c.Lock.SkipLocked {
			lockSQL += " SKIP LOCKED"
		}
		locked := tx.Raw(lockSQL, c.Lock.Args...).Scan(c.Lock.Into)
		if locked.Error != nil {
			return fmt.Errorf("lock row: %w", locked.Error)
		}
		if locked.RowsAffected == 0 {
			res.Outcome = Gone
			if c.Lock.SkipLocked {
				res.Outcome = Busy
			}
			return nil
		}
		st, err := c.Locked(tx)
		if err != nil {
			return err
		}
		if st.Done {
			res.Outcome = AlreadyDone
			return nil
		}
		if st.Key == "" {
			return errors.New("outbound: locked row without an idempotency key")
		}

		window := KeyWindow
		if c.Window > 0 {
			window = c.Window
		}
		if now().Sub(st.CreatedAt) >= window && c.Review != nil {
			res.Outcome = Review
			res.Attempt = Attempt{At: now().UTC()}
			log.WarnContext(ctx, "past the key window with no lookup: left for an operator's review, not sent again",
				"idempotency_key", st.Key, "since", st.CreatedAt)
			return c.Review(tx, res.Attempt)
		}
		if now().Sub(st.CreatedAt) >= window {
			// Search lags writes by up to a minute, but an attempt made within that minute
			// used the same key, which Stripe still remembers: find-then-create cannot double.
			obj, found, err := c.Find(ctx)
			res.Attempt = Attempt{At: now().UTC(), Step: StepFind, Err: err}
			switch {
			case err != nil:
				// Without the lookup nothing may be created; and a refused lookup says
				// nothing about the object, so it is never final.
				res.Outcome = Pending
				log.WarnContext(ctx, "lookup of an earlier attempt failed; the row stays pending",
					"idempotency_key", st.Key, stripeclient.LogAttr(err))
				return c.RecordAttempt(tx, res.Attempt)
			case found:
				res.Outcome = Completed
				log.InfoContext(ctx, "object of an earlier attempt found on Stripe past the key window",
					"idempotency_key", st.Key)
				return c.Complete(tx, obj, res.Attempt)
			}
		}

		key := st.Key
		obj, err := c.Create(stripe.Params{Context: ctx, IdempotencyKey: &key})
		res.Attempt = Attempt{At: now().UTC(), Step: StepCreate, Err: err}
		if err == nil {
			res.Outcome = Completed
			return c.Complete(tx, obj, res.Attempt)
		}
		if Final(err) {
			res.Outcome = Refused
			log.WarnContext(ctx, "refused by Stripe", "idempotency_key", st.Key, stripeclient.LogAttr(err))
			return c.Refuse(tx, res.Attempt)
		}
		res.Outcome = Pending
		log.WarnContext(ctx, "attempt failed; the row stays pending", "idempotency_key", st.Key, stripeclient.LogAttr(err))
		return c.RecordAttempt(tx, res.Attempt)
	})
	if err != nil {
		return Result{}, err
	}
	return res, nil
}

// Final reports whether a failed create is Stripe's final refusal of the object, as opposed to
// a failure that a later attempt under the same key may turn into the object: no answer at all,
// 5xx, 429 and 409 (stripeclient.Retryable), and refusals that are about the call rather than
// the object — the key reused with other parameters, a bad or restricted API key — which, once
// fixed, must finish the same row rather than leave a refusal recorded forever.
func Final(err error) bool {
	var se *stripe.Error
	if !errors.As(err, &se) || stripeclient.Retryable(err) {
		return false
	}
	return se.Type != stripe.ErrorTypeIdempotency &&
		se.HTTPStatusCode != http.StatusUnauthorized && se.HTTPStatusCode != http.StatusForbidden
}

func (c *Call[T]) check() error {
	var missing []string
	if c.Find != nil && c.Review != nil {
		return errors.New("outbound: Call with both Find and Review")
	}
	for name, isNil := range map[string]bool{
		"Lock.SQL": c.Lock.SQL == "", "Lock.Into": c.Lock.Into == nil, "Locked": c.Locked == nil,
		"Find or Review": c.Find == nil && c.Review == nil, "Create": c.Create == nil, "Complete": c.Complete == nil,
		"Refuse": c.Refuse == nil, "RecordAttempt": c.RecordAttempt == nil,
	} {
		if isNil {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return fmt.Errorf("outbound: Call without %s", strings.Join(missing, ", "))
	}
	return nil
}
