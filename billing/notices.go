package billing

import (
	"context"
	"fmt"
	"log/slog"
	"net/mail"
	"strings"
	"time"

	"github.com/riverqueue/river"
	"gorm.io/gorm"

	"billing/internal/jobs"
)

// Notice kinds.
const (
	NoticeTrialWillEnd  = "trial_will_end"
	NoticePaymentFailed = "payment_failed"
)

// NoticeArgs is the River job that sends one customer notice. It carries what the mail says as
// of the event, so the mail does not change if the subscription moves on before it is sent.
type NoticeArgs struct {
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

// NoticeJobKind is the River kind of NoticeArgs.
const NoticeJobKind = "billing_notice"

func (NoticeArgs) Kind() string { return NoticeJobKind }

// InsertOpts: uniqueness by (event id, kind) backs up the notices table's own unique key, and a
// bounded number of attempts (River's backoff spreads 12 over about a day) stops a dead mail
// server from keeping jobs around for weeks.
func (NoticeArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{
		MaxAttempts: 12,
		UniqueOpts:  river.UniqueOpts{ByArgs: true},
	}
}

type noticeInput struct {
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

// enqueueNotice writes the notices row and inserts its job, both in tx. The row's unique
// (event_id, kind) makes a re-applied event a no-op: the job is inserted only when the row is new.
func (s *Service) enqueueNotice(ctx context.Context, tx *gorm.DB, in noticeInput) error {
	if s.jobs == nil {
		return errNoInserter
	}
	recipient, err := recipientFor(ctx, tx, in.StripeCustomerID, in.Livemode)
	if err != nil {
		return err
	}
	if recipient == "" {
		recipient = strings.TrimSpace(in.FallbackEmail)
	}
	var ids []int64
	err = tx.WithContext(ctx).Raw(`
		INSERT INTO notices (event_id, kind, subscription_id, stripe_customer_id, livemode, recipient, created_at)
		VALUES (?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (event_id, kind) DO NOTHING
		RETURNING id`,
		in.EventID, in.Kind, in.SubscriptionID, in.StripeCustomerID, in.Livemode, recipient, s.now()).
		Scan(&ids).Error
	if err != nil {
		return fmt.Errorf("record %s notice of %s: %w", in.Kind, in.EventID, err)
	}
	if len(ids) == 0 {
		s.log.InfoContext(ctx, "notice already enqueued", "event_id", in.EventID, "kind", in.Kind)
		return nil
	}
	sqlTx, err := jobs.SQLTx(tx)
	if err != nil {
		return err
	}
	args := NoticeArgs{
		NoticeID:           ids[0],
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
	if _, err := s.jobs.InsertTx(ctx, sqlTx, args, nil); err != nil {
		return fmt.Errorf("enqueue %s notice of %s: %w", in.Kind, in.EventID, err)
	}
	s.notices.WithLabelValues(in.Kind).Inc()
	s.log.InfoContext(ctx, "notice enqueued", "event_id", in.EventID, "kind", in.Kind,
		"subscription_id", in.SubscriptionID, "notice_id", ids[0], "has_recipient", recipient != "")
	return nil
}

// recipientFor is the email of the user linked to a Stripe customer of the given mode, or ""
// when there is none.
func recipientFor(ctx context.Context, db *gorm.DB, stripeCustomerID string, livemode bool) (string, error) {
	if stripeCustomerID == "" {
		return "", nil
	}
	var emails []string
	err := db.WithContext(ctx).Raw(`SELECT email FROM customers WHERE stripe_customer_id = ? AND livemode = ?`, stripeCustomerID, livemode).
		Scan(&emails).Error
	if err != nil {
		return "", fmt.Errorf("load email of customer %s: %w", stripeCustomerID, err)
	}
	if len(emails) == 0 {
		return "", nil
	}
	return strings.TrimSpace(emails[0]), nil
}

// MailConfig is where notices go: SMTP when both fields are set, else the log.
type MailConfig struct {
	// SMTPURL is smtp://[user:pass@]host[:port] (STARTTLS when the server offers it) or
	// smtps://[user:pass@]host[:port] (implicit TLS).
	SMTPURL string
	From    string
}

// NoticeWorker sends notices. It is a river.Worker[NoticeArgs].
type NoticeWorker struct {
	river.WorkerDefaults[NoticeArgs]
	db    *gorm.DB
	mail  MailConfig
	log   *slog.Logger
	pages *pages
	// send delivers one message; replaced in tests.
	send func(ctx context.Context, cfg MailConfig, to string, msg []byte) error
}

// NewNoticeWorker builds the worker; main registers it with river.AddWorker.
func NewNoticeWorker(db *gorm.DB, mail MailConfig, logger *slog.Logger) *NoticeWorker {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &NoticeWorker{
		db:    db,
		mail:  mail,
		log:   logger.With("component", "billing_notices"),
		pages: mustParsePages(),
		send: func(ctx context.Context, cfg MailConfig, to string, msg []byte) error {
			return sendSMTP(ctx, cfg, to, msg, nil)
		},
	}
}

type noticeRow struct {
	ID               int64   `gorm:"column:id"`
	Recipient        string  `gorm:"column:recipient"`
	StripeCustomerID *string `gorm:"column:stripe_customer_id"`
	Livemode         bool    `gorm:"column:livemode"`
	Delivery         *string `gorm:"column:delivery"`
}

// Work renders and delivers the notice once. The notices row stays locked from the check to
// the mark "delivered", which commit together: River runs a job again when it looks stuck
// (worker.rescue_after), possibly while the first run is still talking to the mail server, and
// that second run must wait and then find the notice delivered. The one duplicate left is a
// crash (or failed commit) between the send and the commit: mail is at least once.
//
// The worker keeps the client's job timeout, which main bounds by worker.rescue_after: a longer
// one of its own would let a slow send be rescued and run twice.
func (w *NoticeWorker) Work(ctx context.Context, job *river.Job[NoticeArgs]) error {
	return w.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		return w.deliver(ctx, tx, job.Args)
	})
}

func (w *NoticeWorker) deliver(ctx context.Context, tx *gorm.DB, a NoticeArgs) error {
	var rows []noticeRow
	err := tx.Raw(`SELECT id, recipient, stripe_customer_id, livemode, delivery FROM notices WHERE id = ? FOR UPDATE`, a.NoticeID).
		Scan(&rows).Error
	if err != nil {
		return fmt.Errorf("load notice %d: %w", a.NoticeID, err)
	}
	if len(rows) == 0 {
		w.log.WarnContext(ctx, "notice row missing; job dropped", "notice_id", a.NoticeID, "event_id", a.EventID)
		return nil
	}
	n := rows[0]
	if n.Delivery != nil {
		return nil
	}
	to := n.Recipient
	if to == "" && n.StripeCustomerID != nil {
		// The customer may have been linked since the event was processed.
		if to, err = recipientFor(ctx, tx, *n.StripeCustomerID, n.Livemode); err != nil {
			return err
		}
	}
	if to == "" {
		w.log.WarnContext(ctx, "notice has no recipient; not sent", "notice_id", n.ID, "kind", a.NoticeKind,
			"event_id", a.EventID, "subscription_id", a.SubscriptionID)
		return markDelivered(tx, n.ID, "no_recipient", "", false)
	}

	addr, err := mail.ParseAddress(to)
	if err != nil {
		// A bad address will not get better by retrying; the customer record has to change.
		w.log.WarnContext(ctx, "notice recipient is not a valid address; not sent", "notice_id", n.ID,
			"kind", a.NoticeKind, "event_id", a.EventID, "to", maskEmail(to))
		return markDelivered(tx, n.ID, "invalid_recipient", "", false)
	}
	to = addr.Address

	msg, err := w.pages.renderNotice(a)
	if err != nil {
		// A template that cannot render this notice will not render it on a retry either.
		return river.JobCancel(fmt.Errorf("render notice %d: %w", n.ID, err))
	}
	if w.mail.SMTPURL == "" || w.mail.From == "" {
		w.log.InfoContext(ctx, "notice (mail not configured, logged instead of sent)",
			"notice_id", n.ID, "kind", a.NoticeKind, "event_id", a.EventID, "to", maskEmail(to),
			"subject", msg.Subject, "text", msg.Text)
		return markDelivered(tx, n.ID, "log", to, true)
	}
	raw, err := buildMessage(w.mail.From, to, msg, time.Now(), fmt.Sprintf("notice-%d", n.ID))
	if err != nil {
		return river.JobCancel(fmt.Errorf("build notice %d: %w", n.ID, err))
	}
	if err := w.send(ctx, w.mail, to, raw); err != nil {
		return fmt.Errorf("send notice %d: %w", n.ID, err)
	}
	w.log.InfoContext(ctx, "notice sent", "notice_id", n.ID, "kind", a.NoticeKind, "event_id", a.EventID, "to", maskEmail(to))
	return markDelivered(tx, n.ID, "smtp", to, true)
}

func markDelivered(tx *gorm.DB, id int64, delivery, to string, sent bool) error {
	err := tx.Exec(`
		UPDATE notices SET delivery = ?, recipient = CASE WHEN ? <> '' THEN ? ELSE recipient END,
		  sent_at = CASE WHEN ? THEN now() ELSE NULL END
		WHERE id = ?`, delivery, to, to, sent, id).Error
	if err != nil {
		return fmt.Errorf("mark notice %d %s: %w", id, delivery, err)
	}
	return nil
}

// maskEmail keeps enough of an address to tell mails apart in logs: "j***@example.com".
func maskEmail(addr string) string {
	at := strings.LastIndexByte(addr, '@')
	if at <= 0 {
		return "***"
	}
	return addr[:1] + "***" + addr[at:]
}

var _ river.Worker[NoticeArgs] = (*NoticeWorker)(nil)
