// Package entitlements decides who gets access: the entitlement policy over billing's
// subscription state, the answers the app reads (GET /v1/customers/{user_id}, …/entitlement,
// …/features/{lookup_key}), the customer's features (customer_features, from
// entitlements.active_entitlement_summary.updated events and reads of Stripe: this package is
// the table's one writer), the policy's words for the admin console, and the app events that
// tell the app when an answer changes. It builds on billing and billing never imports it:
// billing tells it of every change of state through billing.Teller, which main fills with this
// service.
package entitlements

import (
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"gorm.io/gorm"

	"billing/appevents"
	"billing/billing"
	"billing/internal/jobs"
	"billing/webhooks"
)

// Deps are what the service needs from main.
type Deps struct {
	DB *gorm.DB
	// Billing is the subscription state the answers are decided from (its reads, its count of
	// events); required.
	Billing *billing.Service
	// Livemode is the deployment's world (stripe.mode): the app-facing reads answer from it only.
	Livemode bool
	// Policy is the entitlement policy (policy.*); its PeriodGrace is DefaultPeriodGrace when zero.
	Policy Policy
	// Jobs queues the features reads in the event's transaction.
	Jobs   jobs.Inserter
	Logger *slog.Logger
	// Now is the clock of entitlement decisions (cancel at period end, grace); time.Now when nil.
	Now func() time.Time
	// Read configures the read of a customer's whole list of features from Stripe.
	Read ReadDeps
	// Registerer receives the service's metrics; optional.
	Registerer prometheus.Registerer
	// AppEvents tells the app of every change of a user's entitlement (entitlement.updated);
	// nil tells nothing (`billing verify`'s replay).
	AppEvents *appevents.Teller
}

// ReadDeps configure the read of a customer's active entitlements from Stripe, when an event's
// list has more than it carries.
type ReadDeps struct {
	// Stripe lists a customer's active entitlements; without it a summary event whose list has
	// more is applied as far as it goes, and no read is queued.
	Stripe ActiveEntitlementLister
	// Livemode is the mode of Stripe's key: a customer of the other mode cannot be read with it.
	Livemode bool
	// MaxAttempts of one read before it gives up; billing.DefaultRereadAttempts when zero.
	MaxAttempts int
	// RetryDelay is the first delay between attempts, doubled at each one;
	// billing.DefaultRereadRetryDelay when zero.
	RetryDelay time.Duration
}

// Service answers entitlements and keeps the customers' features.
type Service struct {
	db       *gorm.DB
	billing  *billing.Service
	livemode bool
	log      *slog.Logger
	now      func() time.Time
	policy   Policy
	teller   *appevents.Teller
	jobs     jobs.Inserter
	stripe   ActiveEntitlementLister
	read     ReadDeps

	featureReads *prometheus.CounterVec
}

// New builds the service. It panics on a wiring bug (no database, no billing).
func New(d Deps) *Service {
	if d.DB == nil {
		panic("entitlements: Deps.DB is nil")
	}
	if d.Billing == nil {
		panic("entitlements: Deps.Billing is nil")
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.Policy.PeriodGrace <= 0 {
		d.Policy.PeriodGrace = billing.DefaultPeriodGrace
	}
	if d.Read.MaxAttempts <= 0 {
		d.Read.MaxAttempts = billing.DefaultRereadAttempts
	}
	if d.Read.RetryDelay <= 0 {
		d.Read.RetryDelay = billing.DefaultRereadRetryDelay
	}
	s := &Service{
		db:       d.DB,
		billing:  d.Billing,
		livemode: d.Livemode,
		// The log's component stays billing's: operators' queries find the features' lines there.
		log:    d.Logger.With("component", "billing"),
		now:    d.Now,
		policy: d.Policy,
		teller: d.AppEvents,
		jobs:   d.Jobs,
		stripe: d.Read.Stripe,
		read:   d.Read,
		featureReads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "billing_feature_reads_total",
			Help: "Reads of a customer's active entitlements from Stripe (every page), by outcome (applied, stale, skipped, failed).",
		}, []string{"outcome"}),
	}
	if d.Registerer != nil {
		d.Registerer.MustRegister(s.featureReads)
	}
	return s
}

// Policy is the service's entitlement policy.
func (s *Service) Policy() Policy { return s.policy }

// Register registers the handler of the customer's active entitlements.
func (s *Service) Register(reg *webhooks.Registry) {
	reg.Register(EventEntitlementSummaryUpdated, webhooks.HandlerFunc(s.handleEntitlementSummary))
}

// AddWorkers registers the worker of the features reads when Deps.Read.Stripe is set.
func (s *Service) AddWorkers(w *river.Workers) {
	if s.stripe != nil {
		river.AddWorker(w, &featuresReadWorker{s: s})
	}
}
