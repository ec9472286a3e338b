package notices

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	netmail "net/mail"
	"strings"
	"time"

	"github.com/riverqueue/river"
	"gorm.io/gorm"

	"billing/internal/mail"
)

// mailer renders one notice and hands it to the mail server, or to the log when mail is not
// configured: the one way a notice goes out, for the sender and for the jobs of earlier builds.
type mailer struct {
	mail      mail.Config
	log       *slog.Logger
	templates *renderer
	// send delivers one message; replaced in tests.
	send func(ctx context.Context, cfg mail.Config, to string, msg []byte) error
}

func newMailer(cfg mail.Config, logger *slog.Logger) *mailer {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &mailer{mail: cfg, log: logger.With("component", "billing_notices"), templates: mustParseTemplates(), send: mail.Send}
}

// outcome is how a notice was handled: delivery is smtp, log, no_recipient or
// invalid_recipient; to, when not empty, is the address used.
type outcome struct {
	delivery string
	to       string
	sent     bool
}

// errPermanent marks a failure that no retry can mend (the notice cannot be rendered or built).
var errPermanent = errors.New("permanent")

// deliver sends the notice id (content a) to to, the recipient as known ("" for none). An error
// wrapping errPermanent will not get better; any other is worth a retry.
func (m *mailer) deliver(ctx context.Context, id int64, a Args, to string) (outcome, error) {
	if to == "" {
		m.log.WarnContext(ctx, "notice has no recipient; not sent", "notice_id", id, "kind", a.NoticeKind,
			"event_id", a.EventID, "subscription_id", a.SubscriptionID)
		return outcome{delivery: "no_recipient"}, nil
	}
	addr, err := netmail.ParseAddress(to)
	if err != nil {
		// A bad address will not get better by retrying; the customer record has to change.
		m.log.WarnContext(ctx, "notice recipient is not a valid address; not sent", "notice_id", id,
			"kind", a.NoticeKind, "event_id", a.EventID, "to", maskEmail(to))
		return outcome{delivery: "invalid_recipient"}, nil
	}
	to = addr.Address
	msg, err := m.templates.render(a)
	if err != nil {
		return outcome{}, fmt.Errorf("render notice %d: %w: %w", id, errPermanent, err)
	}
	if !m.mail.Enabled() {
		m.log.InfoContext(ctx, "notice (mail not configured, logged instead of sent)",
			"notice_id", id, "kind", a.NoticeKind, "event_id", a.EventID, "to", maskEmail(to),
			"subject", msg.Subject, "text", msg.Text)
		return outcome{delivery: "log", to: to, sent: true}, nil
	}
	raw, err := mail.Build(m.mail.From, to, msg, time.Now(), fmt.Sprintf("notice-%d", id))
	if err != nil {
		return outcome{}, fmt.Errorf("build notice %d: %w: %w", id, errPermanent, err)
	}
	if err := m.send(ctx, m.mail, to, raw); err != nil {
		Metrics.sendFailures.WithLabelValues(a.NoticeKind).Inc()
		return outcome{}, fmt.Errorf("send notice %d: %w", id, err)
	}
	m.log.InfoContext(ctx, "notice sent", "notice_id", id, "kind", a.NoticeKind, "event_id", a.EventID, "to", maskEmail(to))
	return outcome{delivery: "smtp", to: to, sent: true}, nil
}

// Worker sends the notices that earlier builds queued as River jobs (JobKind), one job each; the
// notices written since are the sender's. It is a river.Worker[Args].
type Worker struct {
	river.WorkerDefaults[Args]
	db *gorm.DB
	*mailer
}

// NewWorker builds the worker; the composition root registers it with river.AddWorker.
func NewWorker(db *gorm.DB, cfg mail.Config, logger *slog.Logger) *Worker {
	return &Worker{db: db, mailer: newMailer(cfg, logger)}
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
func (w *Worker) Work(ctx context.Context, job *river.Job[Args]) error {
	return w.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var rows []noticeRow
		// A notice id names one notice, of whichever mode its event was: the worker sends both's.
		err := tx.Raw(`/* all modes */ SELECT id, recipient, stripe_customer_id, livemode, delivery FROM notices WHERE id = $1 FOR UPDATE`, job.Args.NoticeID).
			Scan(&rows).Error
		if err != nil {
			return fmt.Errorf("load notice %d: %w", job.Args.NoticeID, err)
		}
		if len(rows) == 0 {
			w.log.WarnContext(ctx, "notice row missing; job dropped", "notice_id", job.Args.NoticeID, "event_id", job.Args.EventID)
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
		out, err := w.deliver(ctx, n.ID, job.Args, to)
		if errors.Is(err, errPermanent) {
			return river.JobCancel(err)
		}
		if err != nil {
			return err
		}
		Metrics.delivered.WithLabelValues(job.Args.NoticeKind, out.delivery).Inc()
		err = tx.Exec(`/* all modes: by the id of the notice locked above */
			UPDATE notices SET delivery = $1,
			  recipient = CASE WHEN CAST($2 AS text) <> '' THEN CAST($2 AS text) ELSE recipient END,
			  sent_at = CASE WHEN CAST($3 AS boolean) THEN now() ELSE NULL END
			WHERE id = $4`, out.delivery, out.to, out.sent, n.ID).Error
		if err != nil {
			return fmt.Errorf("mark notice %d %s: %w", n.ID, out.delivery, err)
		}
		return nil
	})
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
