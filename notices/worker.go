package notices

import (
	"context"
	"fmt"
	"log/slog"
	netmail "net/mail"
	"strings"
	"time"

	"github.com/riverqueue/river"
	"gorm.io/gorm"

	"billing/internal/mail"
)

// Worker sends notices. It is a river.Worker[Args].
type Worker struct {
	river.WorkerDefaults[Args]
	db        *gorm.DB
	mail      mail.Config
	log       *slog.Logger
	templates *renderer
	// send delivers one message; replaced in tests.
	send func(ctx context.Context, cfg mail.Config, to string, msg []byte) error
}

// NewWorker builds the worker; the composition root registers it with river.AddWorker. With
// mail not configured (no SMTP URL or no sender) notices are logged instead of sent.
func NewWorker(db *gorm.DB, cfg mail.Config, logger *slog.Logger) *Worker {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Worker{
		db:        db,
		mail:      cfg,
		log:       logger.With("component", "billing_notices"),
		templates: mustParseTemplates(),
		send:      mail.Send,
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
func (w *Worker) Work(ctx context.Context, job *river.Job[Args]) error {
	return w.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		return w.deliver(ctx, tx, job.Args)
	})
}

func (w *Worker) deliver(ctx context.Context, tx *gorm.DB, a Args) error {
	var rows []noticeRow
	// A notice id names one notice, of whichever mode its event was: the worker sends both's.
	err := tx.Raw(`/* all modes */ SELECT id, recipient, stripe_customer_id, livemode, delivery FROM notices WHERE id = $1 FOR UPDATE`, a.NoticeID).
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
		return markDelivered(tx, a.NoticeKind, n.ID, "no_recipient", "", false)
	}

	addr, err := netmail.ParseAddress(to)
	if err != nil {
		// A bad address will not get better by retrying; the customer record has to change.
		w.log.WarnContext(ctx, "notice recipient is not a valid address; not sent", "notice_id", n.ID,
			"kind", a.NoticeKind, "event_id", a.EventID, "to", maskEmail(to))
		return markDelivered(tx, a.NoticeKind, n.ID, "invalid_recipient", "", false)
	}
	to = addr.Address

	msg, err := w.templates.render(a)
	if err != nil {
		// A template that cannot render this notice will not render it on a retry either.
		return river.JobCancel(fmt.Errorf("render notice %d: %w", n.ID, err))
	}
	if !w.mail.Enabled() {
		w.log.InfoContext(ctx, "notice (mail not configured, logged instead of sent)",
			"notice_id", n.ID, "kind", a.NoticeKind, "event_id", a.EventID, "to", maskEmail(to),
			"subject", msg.Subject, "text", msg.Text)
		return markDelivered(tx, a.NoticeKind, n.ID, "log", to, true)
	}
	raw, err := mail.Build(w.mail.From, to, msg, time.Now(), fmt.Sprintf("notice-%d", n.ID))
	if err != nil {
		return river.JobCancel(fmt.Errorf("build notice %d: %w", n.ID, err))
	}
	if err := w.send(ctx, w.mail, to, raw); err != nil {
		Metrics.sendFailures.WithLabelValues(a.NoticeKind).Inc()
		return fmt.Errorf("send notice %d: %w", n.ID, err)
	}
	w.log.InfoContext(ctx, "notice sent", "notice_id", n.ID, "kind", a.NoticeKind, "event_id", a.EventID, "to", maskEmail(to))
	return markDelivered(tx, a.NoticeKind, n.ID, "smtp", to, true)
}

// markDelivered records how the notice was handled; to, when not empty, replaces the recipient
// (the address actually used).
func markDelivered(tx *gorm.DB, kind string, id int64, delivery, to string, sent bool) error {
	Metrics.delivered.WithLabelValues(kind, delivery).Inc()
	err := tx.Exec(`/* all modes: by the id of the notice locked above */
		UPDATE notices SET delivery = $1,
		  recipient = CASE WHEN CAST($2 AS text) <> '' THEN CAST($2 AS text) ELSE recipient END,
		  sent_at = CASE WHEN CAST($3 AS boolean) THEN now() ELSE NULL END
		WHERE id = $4`, delivery, to, sent, id).Error
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

var _ river.Worker[Args] = (*Worker)(nil)
