// Package usage records the app's metered usage and reports each record to Stripe as exactly
// one meter event (Billing Meters), and serves POST and GET /v1/customers/{user_id}/usage.
//
// A record is an outbox row: POST inserts it, pending, and answers 202 once it is committed;
// nothing calls Stripe in the request. The reporter (report.go) sends pending rows as meter
// events through the outbound protocol (internal/outbound), one row lock held across the call,
// at a bounded rate, and marks each reported in the transaction that records Stripe's answer.
// The event's identifier is usage-{user_id}-{usage_id}, and it is also the call's idempotency
// key, so every resend of a row — after a lost answer, a 5xx, a crash between the call and the
// mark — is the same event to Stripe, which drops repeats of an identifier for at least 24
// hours.
//
// Past that window a resend could count twice, and Stripe offers no lookup of a meter event by
// its identifier, so a row whose first attempt is older than usage.review_after (20 h by
// default, measured from a time committed before that attempt) and still not marked reported is
// never sent again by the service: it becomes needs_review, for an operator to decide with
// Stripe's meter event summaries at hand. Once reported, the local mark is the authority: a
// reported row is never sent again, and the totals the API answers are the local rows'.
//
// Every query names the deployment's mode (livemode): records of the other mode are another
// world, never sent with this mode's key nor summed in its answers.
package usage

import (
	"context"
	"log/slog"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stripe/stripe-go/v79/client"
	"gorm.io/gorm"

	"billing/appevents"
	"billing/entitlements"
	"billing/internal/outbound"
)

// Row states. Only pending rows are sent; the others are final for the reporter.
const (
	statePending     = "pending"
	stateReported    = "reported"
	stateNeedsReview = "needs_review"
	stateRefused     = "refused"
)

// DefaultReviewAfter is how long after a record's first attempt the reporter still sends it:
// well inside Stripe's identifier window of at least 24 hours, with room for clock skew and for
// calls and retries in flight when it passes.
const DefaultReviewAfter = 20 * time.Hour

// DefaultReportRate is the reporter's meter events per second: under Stripe's test-mode limit
// of 25 requests a second, with room for the service's other calls.
const DefaultReportRate = 20

// Identifier is the meter event identifier (and idempotency key) of a user's usage record.
func Identifier(userID, usageID string) string { return outbound.Key("usage", userID, usageID) }

// Periods is what the summary needs from entitlements: the user's customer view, whose entitlement
// names the subscription whose current period is summed.
type Periods interface {
	Customer(ctx context.Context, userID string) (*entitlements.CustomerView, error)
}

// Deps are what the usage service needs from main.
type Deps struct {
	DB       *gorm.DB
	Stripe   *client.API
	Livemode bool
	Periods  Periods
	// ReviewAfter is the reporter's window (DefaultReviewAfter when zero); ReportRate its
	// meter events per second (DefaultReportRate when zero).
	ReviewAfter time.Duration
	ReportRate  float64
	// Registerer takes the metrics; none are registered when nil.
	Registerer prometheus.Registerer
	Logger     *slog.Logger
	Now        func() time.Time
	// AppEvents tells the app of a record sent to review or refused (usage.needs_review), in
	// the transaction that moves it; nil tells nothing.
	AppEvents *appevents.Teller
}

// Service stores usage records, reports them and serves their endpoints.
type Service struct {
	db          *gorm.DB
	stripe      *client.API
	livemode    bool
	periods     Periods
	reviewAfter time.Duration
	log         *slog.Logger
	now         func() time.Time
	metrics     *metrics
	rep         *reporter
	teller      *appevents.Teller
}

// New returns the usage service.
func New(d Deps) *Service {
	s := &Service{db: d.DB, stripe: d.Stripe, livemode: d.Livemode, periods: d.Periods,
		reviewAfter: d.ReviewAfter, log: d.Logger, now: d.Now, teller: d.AppEvents}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.log = s.log.With("component", "usage")
	if s.now == nil {
		s.now = time.Now
	}
	if s.reviewAfter <= 0 {
		s.reviewAfter = DefaultReviewAfter
	}
	rate := d.ReportRate
	if rate <= 0 {
		rate = DefaultReportRate
	}
	s.metrics = newMetrics()
	if d.Registerer != nil {
		s.metrics.register(d.Registerer)
	}
	s.rep = newReporter(s, rate)
	return s
}

// Mount adds the routes to v1, the /v1 group behind the app backend's authentication.
func (s *Service) Mount(v1 *echo.Group) {
	v1.POST("/customers/:user_id/usage", s.post)
	v1.GET("/customers/:user_id/usage", s.get)
}

// record is a row of usage_records, scanned by column name.
type record struct {
	Livemode         bool
	UserID           string
	UsageID          string
	Meter            string
	Value            int64
	OccurredAt       time.Time
	StripeCustomerID string
	Identifier       string
	Status           string
	Attempts         int
	FirstAttemptAt   *time.Time
	LastAttemptAt    *time.Time
	NextAttemptAt    time.Time
	ErrorCode        *string
	ErrorMessage     *string
	ReportedAt       *time.Time
	ReviewSince      *time.Time
	CreatedAt        time.Time
	UpdatedAt        time.Time
}

// answer is the JSON of a usage record, in the POST's answer and its repeats.
type answer struct {
	UsageID    string    `json:"usage_id"`
	Meter      string    `json:"meter"`
	Value      int64     `json:"value"`
	Timestamp  time.Time `json:"timestamp"`
	Status     string    `json:"status"`
	Identifier string    `json:"identifier"`
}

func (r *record) answer() answer {
	return answer{UsageID: r.UsageID, Meter: r.Meter, Value: r.Value, Timestamp: r.OccurredAt.UTC(),
		Status: r.Status, Identifier: r.Identifier}
}
