// Package ledger makes the service's money-moving calls to Stripe, charges and refunds, so that
// no retry can ever double them, and serves POST /v1/charges and
// POST /v1/charges/{order_id}/refunds.
//
// Every call is one user of the outbound protocol (internal/outbound), which owns the order of
// the steps: the ledger row keyed by the business id (order id; order id + refund id) is
// inserted and committed, state 'pending', with a hash of the request, before Stripe is called;
// the row is locked across the call, which is made with the key derived from the business id
// (charge-{order_id}, refund-{order_id}-{refund_id}); past the key window an earlier attempt's
// object is looked up first — the PaymentIntents search API (metadata['order_id']:'…') for
// charges, the refunds list of the PaymentIntent filtered on metadata[refund_id] for refunds;
// Stripe's final answer completes the row, any other failure leaves it pending with the attempt
// recorded. What stays here is the money: request hashes and conflicts, the amount caps, the
// refund reservation under the charge's lock, and the answers, stored with the row so that a
// repeat of a completed request is answered from the ledger without calling Stripe (also long
// after Stripe's 24-hour key window).
//
// Locking: we lock the ledger row itself rather than take a pg advisory lock. The row exists
// before anyone needs the lock, the lock is scoped to exactly one order, it is released by
// commit, rollback or a dropped connection without bookkeeping, and it cannot collide with
// another order the way hashed advisory-lock keys can. Holding it across the Stripe call costs a
// pooled connection per in-flight charge, which is acceptable: it only ever serialises requests
// for the same order, and those must wait anyway.
package ledger

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/labstack/echo/v4"
	"github.com/stripe/stripe-go/v79/client"
	"gorm.io/gorm"

	"billing/appevents"
	"billing/internal/apierr"
	"billing/internal/httpserver"
	"billing/internal/outbound"
	"billing/internal/stripeclient"
)

// callTimeout bounds one request's ledger section (lock, Stripe call with stripe-go's own
// retries, completion). It is detached from the client's context: once Stripe may have acted,
// the answer is recorded even if the client has gone. It is the server's outbound budget, which
// ends while the answer can still be written.
const callTimeout = httpserver.OutboundBudget

// Row states.
const (
	statePending   = "pending"
	stateCompleted = "completed"
)

// Deps are what the ledger needs from main.
type Deps struct {
	DB       *gorm.DB
	Stripe   *client.API
	Livemode bool
	Logger   *slog.Logger
	Now      func() time.Time
	// AppEvents tells the app of every change of a charge's GET answer (charge.updated), in the
	// change's transaction; nil tells nothing.
	AppEvents *appevents.Teller
}

// Service makes charges and refunds and serves their endpoints.
type Service struct {
	db       *gorm.DB
	stripe   *client.API
	livemode bool
	log      *slog.Logger
	now      func() time.Time
	teller   *appevents.Teller
}

// New returns the ledger service. Logger and Now default to a discarding logger and time.Now.
func New(d Deps) *Service {
	s := &Service{db: d.DB, stripe: d.Stripe, livemode: d.Livemode, log: d.Logger, now: d.Now, teller: d.AppEvents}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.now == nil {
		s.now = time.Now
	}
	s.log = s.log.With("component", "ledger")
	return s
}

// Mount adds the routes to v1, the /v1 group behind the app backend's authentication.
func (s *Service) Mount(v1 *echo.Group) {
	v1.POST("/charges", s.postCharge)
	v1.POST("/charges/:order_id/refunds", s.postRefund)
	v1.GET("/charges/:order_id", s.getCharge)
}

// requestHash is the hex sha256 of a canonical JSON encoding of v (a struct: fixed field order).
func requestHash(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		// Only plain strings and integers are hashed; this cannot fail.
		panic(fmt.Sprintf("ledger: hash request: %v", err))
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func isUniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505"
}

// unfinished is the answer to an attempt that left the row pending (what is "charge" or
// "refund"): Stripe unreachable, a refusal of the call rather than of the money (a bad API key),
// or a failed lookup of an earlier attempt.
func unfinished(a outbound.Attempt, what string) *apierr.Error {
	switch {
	case a.Step == outbound.StepFind:
		return lookupFailed(a.Err, what)
	case stripeclient.Retryable(a.Err):
		return unavailable(a.Err, what)
	default:
		return refused(a.Err, apierr.CodeStripeError, "Stripe refused the call; the %s stays pending", what)
	}
}

func unavailable(err error, what string) *apierr.Error {
	return apierr.Wrap(fmt.Errorf("%s: %w", what, stripeclient.Redact(err)), apierr.CodeStripeUnavailable,
		"Stripe could not be reached to %s; repeat the same request to finish it", what)
}

// lookupFailed maps a failed lookup of an earlier attempt beyond the key window. The row stays
// pending: the lookup says nothing about the charge or refund itself, and without it nothing
// may be created.
func lookupFailed(err error, what string) *apierr.Error {
	if stripeclient.Retryable(err) {
		return unavailable(err, "look up an earlier "+what+" attempt")
	}
	return refused(err, apierr.CodeStripeError,
		"Stripe refused the lookup of an earlier attempt; the %s stays pending", what)
}

// refused is a Stripe refusal as an answer; the cause keeps only the redacted Stripe error.
func refused(err error, code apierr.Code, format string, args ...any) *apierr.Error {
	return apierr.Wrap(stripeclient.Redact(err), code, format, args...)
}

// modeConflict answers a request about a ledger row of the other mode: a live service never
// finishes, repeats or refunds a test-mode charge with its live key, nor the reverse.
func modeConflict(what string, rowLivemode bool) error {
	row, service := "test", "live"
	if rowLivemode {
		row, service = "live", "test"
	}
	return apierr.New(apierr.CodeLivemodeConflict, "%s was recorded in %s mode; this service runs in %s mode", what, row, service)
}

// reply is the protocol's answer of an endpoint (outbound.Reply).
type reply = outbound.Reply

// answerOf renders the stored answer of a completed row.
func answerOf(raw *string, body any, created bool) reply { return outbound.ReplyOf(raw, body, created) }
