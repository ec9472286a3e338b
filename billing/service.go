// Package billing keeps the local mirror of Stripe subscriptions: the subscription state machine
// driven by webhook events, payment holds, the renewal re-reads, the user's invoices, and the
// holds and subscription state the admin console lists. It decides when a customer notice (trial
// ending, payment failed) is due and hands it to the notices package inside the event's
// transaction. Who gets access is the entitlements package's, built on this one; billing tells it
// of every change through Teller.
package billing

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"gorm.io/gorm"

	"billing/internal/jobs"
	"billing/notices"
	"billing/webhooks"
)

// The subscription and invoice event types of the first release; the others are beside their
// handlers (invoices.go, pause.go).
const (
	EventSubscriptionCreated      = "customer.subscription.created"
	EventSubscriptionUpdated      = "customer.subscription.updated"
	EventSubscriptionDeleted      = "customer.subscription.deleted"
	EventSubscriptionTrialWillEnd = "customer.subscription.trial_will_end"
	EventInvoicePaymentFailed     = "invoice.payment_failed"
	EventInvoicePaymentSucceeded  = "invoice.payment_succeeded"
)

// Deps are what the service needs from main.
type Deps struct {
	DB *gorm.DB
	// Livemode is the deployment's world (stripe.mode): the app-facing reads (customer
	// subscriptions, invoices) answer from it only. Events of both modes are applied, each to its
	// own world.
	Livemode bool
	// Jobs queues the re-reads' jobs (a tie's in the event's transaction, a renewal's by the sweep).
	Jobs   jobs.Inserter
	Logger *slog.Logger
	// Now is the clock of the state's decisions (re-reads, trial notices); time.Now when nil.
	Now func() time.Time
	// PeriodGrace is policy.period_grace: the re-read of a renewal runs halfway through it;
	// DefaultPeriodGrace when zero. The entitlement policy is given the same value.
	PeriodGrace time.Duration
	// Renewals is the entitlement policy's word on a renewal not confirmed, which the re-read
	// reports (entitlements.Policy); without it no re-read's outcome is "unconfirmed".
	Renewals RenewalPolicy
	// Reread reads a subscription from Stripe when its renewal is not confirmed (renewal_reread.go);
	// without Reread.Stripe (or Jobs) no re-read is queued, and the policy alone decides.
	Reread RereadDeps
	// Registerer receives the service's metrics; optional.
	Registerer prometheus.Registerer
}

// RenewalPolicy says since when access is withdrawn for want of a confirmed renewal (nil while
// it is not): entitlements.Policy. Billing schedules the re-reads; the policy decides access.
type RenewalPolicy interface {
	Unconfirmed(s *Subscription, now time.Time) *time.Time
}

// Service is the billing domain: event handlers, and the state and holds reads.
type Service struct {
	db       *gorm.DB
	livemode bool
	log      *slog.Logger
	now      func() time.Time
	grace    time.Duration
	renewals RenewalPolicy
	notices  *notices.Enqueuer
	rereads  *rereads
	teller   Teller

	events *prometheus.CounterVec
}

// New builds the service. It panics on a wiring bug (no database).
func New(d Deps) *Service {
	if d.DB == nil {
		panic("billing: Deps.DB is nil")
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.PeriodGrace <= 0 {
		d.PeriodGrace = DefaultPeriodGrace
	}
	log := d.Logger.With("component", "billing")
	s := &Service{
		db:       d.DB,
		livemode: d.Livemode,
		log:      log,
		now:      d.Now,
		grace:    d.PeriodGrace,
		renewals: d.Renewals,
		rereads:  newRereads(d),
		notices:  notices.NewEnqueuer(notices.EnqueuerConfig{Logger: log, Now: d.Now, Registerer: d.Registerer}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "billing_subscription_events_total",
			Help: "Subscription, invoice and active-entitlement events handled, by type and outcome (applied, stale, terminal, one_off, tie). Counted per attempt: a rolled-back attempt counts too.",
		}, []string{"type", "outcome"}),
	}
	if d.Registerer != nil {
		d.Registerer.MustRegister(s.events)
	}
	return s
}

// CountEvent counts an event handled by type and outcome in billing_subscription_events_total,
// which also counts the active-entitlement events that the entitlements package handles: one
// metric of the events that move what a subscription grants, as before the split.
func (s *Service) CountEvent(eventType, outcome string) {
	s.events.WithLabelValues(eventType, outcome).Inc()
}

// Register registers the handlers of billing's event types: subscriptions and invoices.
func (s *Service) Register(reg *webhooks.Registry) {
	subs := webhooks.HandlerFunc(s.handleSubscriptionEvent)
	invoices := webhooks.HandlerFunc(s.handleInvoiceEvent)
	reg.Register(EventSubscriptionCreated, subs)
	reg.Register(EventSubscriptionUpdated, subs)
	reg.Register(EventSubscriptionDeleted, subs)
	reg.Register(EventSubscriptionTrialWillEnd, subs)
	reg.Register(EventInvoicePaymentFailed, invoices)
	reg.Register(EventInvoicePaymentSucceeded, invoices)
	reg.Register(EventSubscriptionPaused, subs)
	reg.Register(EventSubscriptionResumed, subs)
	for _, typ := range []string{EventInvoicePaid, EventInvoicePaymentActionRequired, EventInvoiceVoided,
		EventInvoiceFinalized, EventInvoiceUpdated, EventInvoiceMarkedUncollectible} {
		reg.Register(typ, invoices)
	}
}

// CustomerSubscriptionStatus returns the local status of a subscription of a Stripe customer of
// the given mode; found is false when the subscription is unknown, of the other mode, or belongs
// to another customer.
func (s *Service) CustomerSubscriptionStatus(ctx context.Context, stripeCustomerID string, livemode bool, subscriptionID string) (status string, found bool, err error) {
	var rows []string
	err = s.db.WithContext(ctx).Raw(
		`SELECT status FROM subscriptions WHERE subscription_id = $1 AND stripe_customer_id = $2 AND livemode = $3`,
		subscriptionID, stripeCustomerID, livemode).Scan(&rows).Error
	if err != nil {
		return "", false, fmt.Errorf("load subscription %s: %w", subscriptionID, err)
	}
	if len(rows) == 0 {
		return "", false, nil
	}
	return rows[0], true, nil
}

// permanent marks a malformed event: retrying cannot fix it.
func permanent(format string, args ...any) error {
	return webhooks.Permanent(fmt.Errorf(format, args...))
}
