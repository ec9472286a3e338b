// Package notices sends customer notices (trial ending, payment failed): a row in the notices
// table, written in the transaction of the event that calls for the notice with what the mail
// will say, and the sender, a loop in every replica that renders and mails each due row once.
// Domain packages decide when a notice is due and call an Enqueuer; this package imports none of
// them.
package notices

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"gorm.io/gorm"
)

// Notice kinds.
const (
	KindTrialWillEnd  = "trial_will_end"
	KindPaymentFailed = "payment_failed"
	// KindPaymentActionRequired: the payment waits for the customer to authenticate it on the
	// invoice's page (HostedInvoiceURL).
	KindPaymentActionRequired = "payment_action_required"
)

// Args is what one notice's mail says, as of the event, so the mail does not change if the
// subscription moves on before it is sent: the row's content. It is also the River job that
// sent a notice before the sender did (JobKind), for the jobs still queued from then.
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

// JobKind is the River kind of Args. Notices are no longer queued as jobs, but jobs queued under
// it by an earlier build must still find their worker (Worker), so it never changes.
const JobKind = "billing_notice"

func (Args) Kind() string { return JobKind }

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
	Logger *slog.Logger
	// Now stamps the notices row; time.Now when nil.
	Now func() time.Time
	// Registerer receives billing_notices_enqueued_total; optional.
	Registerer prometheus.Registerer
}

// Enqueuer records notices, due at once, inside the caller's transaction.
type Enqueuer struct {
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
		log: c.Logger,
		now: c.Now,
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

// Enqueue writes the notices row in tx, due at once, in one statement with the recipient's
// lookup. The row's unique (event_id, livemode, kind) makes a re-applied event a no-op.
//
// The recipient is recipientSQL's, or else the event's own address (FallbackEmail), or "" when
// there is neither (the sender looks again).
func (e *Enqueuer) Enqueue(ctx context.Context, tx *gorm.DB, in Input) error {
	content, err := json.Marshal(Args{
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
	})
	if err != nil {
		return fmt.Errorf("enqueue %s notice of %s: %w", in.Kind, in.EventID, err)
	}
	now := e.now()
	// The customer and mode are $1 and $2, as recipientSQL has them.
	var id int64
	var recipient string
	err = tx.Statement.ConnPool.QueryRowContext(ctx, `
		INSERT INTO notices (event_id, kind, subscription_id, stripe_customer_id, livemode, recipient, created_at, content, next_attempt_at)
		VALUES ($3, $4, $5, $1, $2, coalesce((`+recipientSQL+`), $6), $7, $8, $7)
		ON CONFLICT (event_id, livemode, kind) DO NOTHING
		RETURNING id, recipient`,
		in.StripeCustomerID, in.Livemode, in.EventID, in.Kind, in.SubscriptionID, strings.TrimSpace(in.FallbackEmail), now, content).
		Scan(&id, &recipient)
	if errors.Is(err, sql.ErrNoRows) {
		e.log.DebugContext(ctx, "notice already enqueued", "event_id", in.EventID, "kind", in.Kind)
		return nil
	}
	if err != nil {
		return fmt.Errorf("enqueue %s notice of %s: %w", in.Kind, in.EventID, err)
	}
	e.enqueued.WithLabelValues(in.Kind).Inc()
	e.log.DebugContext(ctx, "notice enqueued", "event_id", in.EventID, "kind", in.Kind,
		"subscription_id", in.SubscriptionID, "notice_id", id, "has_recipient", recipient != "")
	return nil
}

// recipientOf is the email of the user linked to the Stripe customer customer of the mode mode
// (SQL expressions), trimmed of white space, or no row or NULL when there is none: the one
// definition of a notice's recipient, for the notice's row and, when it had none, for its sending.
func recipientOf(customer, mode string) string {
	return `/* all modes: the mode is the one given (the event's, or the notice's own) */ SELECT NULLIF(btrim(c.email, E' \t\n\v\f\r'), '') FROM customers c WHERE c.stripe_customer_id = ` + customer + ` AND c.livemode = ` + mode
}

// recipientSQL is recipientOf the customer $1 of the mode $2.
var recipientSQL = recipientOf("$1", "$2")

// recipientFor is recipientSQL's recipient, or "" when there is none.
func recipientFor(ctx context.Context, db *gorm.DB, stripeCustomerID string, livemode bool) (string, error) {
	var email string
	err := db.WithContext(ctx).Raw(`SELECT coalesce((`+recipientSQL+`), '')`, stripeCustomerID, livemode).Row().Scan(&email)
	if err != nil {
		return "", fmt.Errorf("load email of customer %s: %w", stripeCustomerID, err)
	}
	return email, nil
}
