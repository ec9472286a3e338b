// Package checkout opens Stripe Checkout sessions for subscriptions and follows them to the
// end: POST /v1/customers/{user_id}/checkout-sessions, the checkout.session.* events (completed,
// async_payment_succeeded and async_payment_failed, expired), and the success page's
// GET /v1/checkout-sessions/{id}.
//
// Opening a session is one user of the outbound protocol (internal/outbound): the row keyed by
// (user_id, request_id) is committed, state 'pending', with a hash of the request, before Stripe
// is called with the key checkout-{user_id}-{request_id}; past the key window the customer's
// sessions are listed and matched on metadata (Stripe has no search for sessions) before a new
// one is made. The answer is stored with the row, so a repeat answers from it without calling
// Stripe, and the same request_id with other values is refused.
//
// When Checkout completes, the user must be entitled as soon as Stripe says so, whichever of
// checkout.session.completed and the customer.subscription.* events arrives first. The event's
// handler records the session and queues, in the event's transaction, a River job that reads the
// session's subscription from Stripe and applies it through billing.Service.ApplySnapshot: the
// same code and ordering guard as the subscription events, so a late older event cannot undo the
// read, and a newer event is not undone by it.
package checkout

import (
	"context"
	"log/slog"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/client"
	"gorm.io/gorm"

	"billing/billing"
	"billing/customers"
	"billing/entitlements"
	"billing/internal/jobs"
	"billing/webhooks"
)

// The event types the package handles.
const (
	EventSessionCompleted             = string(stripe.EventTypeCheckoutSessionCompleted)
	EventSessionAsyncPaymentSucceeded = string(stripe.EventTypeCheckoutSessionAsyncPaymentSucceeded)
	EventSessionAsyncPaymentFailed    = string(stripe.EventTypeCheckoutSessionAsyncPaymentFailed)
	// EventSessionExpired: the session was not completed in time; the row says so, and the
	// success page answers from it instead of asking Stripe.
	EventSessionExpired = string(stripe.EventTypeCheckoutSessionExpired)
)

// Customers links users to Stripe customers; customers.Handlers implements it.
type Customers interface {
	// EnsureLinked returns the user's linked customer of the service's mode, making it first
	// if needed; errors are *apierr.Error values.
	EnsureLinked(ctx context.Context, userID string) (*customers.Customer, error)
}

// Billing is the subscription state: the way a subscription read from Stripe is applied.
// billing.Service implements it.
type Billing interface {
	ApplySnapshot(ctx context.Context, tx *gorm.DB, snap billing.Snapshot) (billing.SnapshotOutcome, error)
}

// Entitlements is the app's answers: the entitlement that refuses a second subscription, and the
// telling of the app. entitlements.Service implements it.
type Entitlements interface {
	Entitlement(ctx context.Context, userID string) (*entitlements.Entitlement, error)
	// TellUser tells the app, in tx, of the user's entitlement after a link changed it.
	TellUser(ctx context.Context, tx *gorm.DB, userID string) error
}

// Prices checks the price a request names against the catalog; catalog.Service implements it.
type Prices interface {
	// PriceOf is the price id named by id or lookup key; errors are *apierr.Error values.
	PriceOf(ctx context.Context, priceID, lookupKey *string) (string, error)
}

// Deps are what the package needs from main.
type Deps struct {
	DB           *gorm.DB
	Stripe       *client.API
	Customers    Customers
	Billing      Billing
	Entitlements Entitlements
	// Jobs queues the subscription reads in the event's transaction.
	Jobs jobs.Inserter
	// Livemode is the mode of the service (stripe.mode): calls out are made in it only.
	Livemode bool
	// SuccessURL and CancelURL are checkout.success_url and checkout.cancel_url, the defaults of
	// a request that gives none.
	SuccessURL, CancelURL string
	// Prices resolves lookup keys and refuses inactive prices; nil passes price_id on as given
	// and refuses every lookup key.
	Prices Prices
	// AutomaticTax is checkout.automatic_tax: every session asks Stripe Tax.
	AutomaticTax bool
	Logger       *slog.Logger
	Now          func() time.Time
}

// Service serves the checkout endpoints, handles the checkout events and runs the reads.
type Service struct {
	db         *gorm.DB
	stripe     *client.API
	customers  Customers
	billing    Billing
	ents       Entitlements
	jobs       jobs.Inserter
	livemode   bool
	successURL string
	cancelURL  string
	prices     Prices
	// automaticTax is recorded with each new request, so that its retries ask as it did.
	automaticTax bool
	log          *slog.Logger
	now          func() time.Time
}

// New returns the checkout service. Logger and Now default to a discarding logger and time.Now.
func New(d Deps) *Service {
	s := &Service{
		db: d.DB, stripe: d.Stripe, customers: d.Customers, billing: d.Billing, ents: d.Entitlements, jobs: d.Jobs,
		livemode: d.Livemode, successURL: d.SuccessURL, cancelURL: d.CancelURL, log: d.Logger, now: d.Now,
		prices: d.Prices, automaticTax: d.AutomaticTax,
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.now == nil {
		s.now = time.Now
	}
	s.log = s.log.With("component", "checkout")
	return s
}

// Mount adds the routes to v1, the /v1 group behind the app backend's authentication.
func (s *Service) Mount(v1 *echo.Group) {
	v1.POST("/customers/:user_id/checkout-sessions", s.postSession)
	v1.GET("/checkout-sessions/:session_id", s.getSession)
}

// Register registers the handlers of the checkout events.
func (s *Service) Register(reg *webhooks.Registry) {
	h := webhooks.HandlerFunc(s.handleSessionEvent)
	reg.Register(EventSessionCompleted, h)
	reg.Register(EventSessionAsyncPaymentSucceeded, h)
	reg.Register(EventSessionAsyncPaymentFailed, h)
	reg.Register(EventSessionExpired, h)
}
