// Package notices sends customer notices (trial ending, payment failed): a row in the notices
// table and a River job, written in the transaction of the event that calls for the notice, and
// the worker that renders and mails it once. Domain packages decide when a notice is due and
// call an Enqueuer; this package imports none of them.
package notices

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"gorm.io/gorm"

	"billing/internal/jobs"
)

// Notice kinds.
const (
	KindTrialWillEnd  = "trial_will_end"
	KindPaymentFailed = "payment_failed"
	// KindPaymentActionRequired: the payment waits for the customer to authenticate it on the
	// invoice's page (HostedInvoiceURL).
	KindPaymentActionRequired = "payment_action_required"
)

// Args is the River job that sends one customer notice. It carries what the mail says as of
// the event, so the mail does not change if the subscription moves on before it is sent.
type Args struct {
	NoticeID         int64  `json:"notice_id"`
	EventID          string `json:"event_id" river:"unique"`
	NoticeKind       string `json:"kind" river:"unique"`
	SubscriptionID   string `json:"subscription_id"`
	StripeCustomerID string `json:"stripe_customer_id"`
	Livemode         bool   `json:"livemode"`

	TrialEnd *time.Time `json:"trial_end,omitempty"`

	InvoiceID          string     `json:"invoice_id,omitempty"`
	AmountDue          *int64     `json:"amount_due,omitempty"`
	Currency           string     `json:"currency,omitempty"`
	HostedInvoiceURL   string     `json:"hosted_invoice_url,omitempty"`
	NextPaymentAttempt *time.Time `json:"next_payment_attempt,omitempty"`
	AttemptCount       int64      `json:"attempt_count,omitempty"`
}

// JobKind is the River kind of Args. It predates this package; jobs already queued under it
// must still find their worker, so it never changes.
const JobKind = "billing_notice"

func (Args) Kind() string { return JobKind }

// InsertOpts: uniqueness by (event id, kind) backs up the notices table's own unique key, and a
// bounded number of attempts (River's backoff spreads 12 over about a day) stops a dead mail
// server from keeping jobs around for weeks.
func (Args) InsertOpts() river.InsertOpts {
	return river.InsertOpts{
		MaxAttempts: 12,
		UniqueOpts:  river.UniqueOpts{ByArgs: true},
	}
}

// Input is one notice to enqueue.
type Input struct {
	EventID          string
	Kind             string
	SubscriptionID   string
	StripeCustomerID string
	Livemode         bool
	// FallbackEmail is an address from the event itself (invoice.customer_email), used when the
	// customer is not linked or has no email.
	FallbackEmail string

	TrialEnd *time.Time

	InvoiceID          string
	AmountDue          *int64
	Currency           string
	HostedInvoiceURL   string
	NextPaymentAttempt *time.Time
	AttemptCount       int64
}

// EnqueuerConfig is what an Enqueuer needs.
type EnqueuerConfig struct {
	// Jobs inserts the job in the caller's transaction; Enqueue fails without one.
	Jobs   jobs.Inserter
	Logger *slog.Logger
	// Now stamps the notices row; time.Now when nil.
	Now func() time.Time
	// Registerer receives billing_notices_enqueued_total; optional.
	Registerer prometheus.Registerer
}

// Enqueuer records notices and queues their jobs inside the caller's transaction.
type Enqueuer struct {
	jobs     jobs.Inserter
	log      *slog.Logger
	now      func() time.Time
	enqueued *prometheus.CounterVec
}

// NewEnqueuer builds an Enqueuer and registers its metric.
func NewEnqueuer(c EnqueuerConfig) *Enqueuer {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	e := &Enqueuer{
		jobs: c.Jobs,
		log:  c.Logger,
		now:  c.Now,
		enqueued: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "billing_notices_enqueued_total",
			Help: "Customer notices enqueued, by kind. Counted per attempt: a rolled-back attempt counts too.",
		}, []string{"kind"}),
	}
	if c.Registerer != nil {
		c.Registerer.MustRegister(e.enqueued)
	}
	return e
}

var errNoInserter = errors.New("notices: no job inserter configured")

// Enqueue writes the notices row and inserts its job, both in tx, in one statement (one round
// trip instead of three): the recipient's lookup, the row, and its job. The row's unique
// (event_id, kind) makes a re-applied event a no-op: the job is inserted only when the row is new,
// and carries the row's id.
//
// The recipient is recipientSQL's, or else the event's own address (FallbackEmail), or "" when
// there is neither.
func (e *Enqueuer) Enqueue(ctx context.Context, tx *gorm.DB, in Input) error {
	if e.jobs == nil {
		return errNoInserter
	}
	sqlTx, err := jobs.SQLTx(tx)
	if err != nil {
		return err
	}
	args := Args{
		EventID:            in.EventID,
		NoticeKind:         in.Kind,
		SubscriptionID:     in.SubscriptionID,
		StripeCustomerID:   in.StripeCustomerID,
		Livemode:           in.Livemode,
		TrialEnd:           in.TrialEnd,
		InvoiceID:          in.InvoiceID,
		AmountDue:          in.AmountDue,
		Currency:           in.Currency,
		HostedInvoiceURL:   in.HostedInvoiceURL,
		NextPaymentAttempt: in.NextPaymentAttempt,
		AttemptCount:       in.AttemptCount,
	}
	// The customer and mode are $1 and $2, as recipientSQL has them.
	query := `
		INSERT INTO notices (event_id, kind, subscription_id, stripe_customer_id, livemode, recipient, created_at)
		VALUES ($3, $4, $5, $1, $2, coalesce((` + recipientSQL + `), $6), $7)
		ON CONFLICT (event_id, livemode, kind) DO NOTHING
		RETURNING id, recipient`
	params := []any{in.StripeCustomerID, in.Livemode, in.EventID, in.Kind, in.SubscriptionID, strings.TrimSpace(in.FallbackEmail), e.now()}
	// River's row for Args.InsertOpts (unique by event and kind) for the new row, its id merged in.
	job, jobParams, err := jobs.UniqueInsert(e.jobs, args, time.Time{}, args.InsertOpts().MaxAttempts, len(params)+1,
		jobs.Within{From: "notice", Args: `jsonb_build_object('notice_id', notice.id)`})
	if err != nil {
		return fmt.Errorf("enqueue %s notice of %s: %w", in.Kind, in.EventID, err)
	}
	if job != "" {
		query = `WITH notice AS (` + query + `), job AS (` + job + `) SELECT id, recipient FROM notice`
		params = append(params, jobParams...)
	}
	var id int64
	var recipient string
	err = sqlTx.QueryRowContext(ctx, query, params...).Scan(&id, &recipient)
	if errors.Is(err, sql.ErrNoRows) {
		e.log.InfoContext(ctx, "notice already enqueued", "event_id", in.EventID, "kind", in.Kind)
		return nil
	}
	if err != nil {
		return fmt.Errorf("enqueue %s notice of %s: %w", in.Kind, in.EventID, err)
	}
	e.enqueued.WithLabelValues(in.Kind).Inc()
	e.log.InfoContext(ctx, "notice enqueued", "event_id", in.EventID, "kind", in.Kind,
		"subscription_id", in.SubscriptionID, "notice_id", id, "has_recipient", recipient != "")
	return nil
}

// recipientSQL is the email of the user linked to the Stripe customer $1 of the mode $2, trimmed
// of white space, or no row or NULL when there is none: the one definition of a notice's
// recipient, for the notice's row and, when it had none, for its sending.
const recipientSQL = `SELECT NULLIF(btrim(email, E' \t\n\v\f\r'), '') FROM customers WHERE stripe_customer_id = $1 AND livemode = $2`

// recipientFor is recipientSQL's recipient, or "" when there is none.
func recipientFor(ctx context.Context, db *gorm.DB, stripeCustomerID string, livemode bool) (string, error) {
	var email string
	err := db.WithContext(ctx).Raw(`SELECT coalesce((`+recipientSQL+`), '')`, stripeCustomerID, livemode).Row().Scan(&email)
	if err != nil {
		return "", fmt.Errorf("load email of customer %s: %w", stripeCustomerID, err)
	}
	return email, nil
}
