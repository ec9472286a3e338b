package notices

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"gorm.io/gorm"

	"billing/internal/mail"
)

// The sender: a loop in every replica (Run) that takes the due notices and mails them. A row is
// due from its event on (next_attempt_at), and again after each failed attempt, later each time.
//
// Taking a batch is one statement that moves the rows' next_attempt_at a lease ahead and counts
// the attempt; rows another replica is taking are skipped (SKIP LOCKED), and a taken row is due
// again only when its lease ends, so a row is in one send at a time while the lease lasts, and a
// sender that dies mid-batch leaves its rows to be sent again when their leases end. A send
// starts only while a send's timeout is left on the lease: a slow mail server makes the batch
// hand its last rows back (due at once, the attempt not counted) rather than send them after
// another replica may have taken them. The outcomes are recorded in one statement when the
// batch is done. Mail is at least once: a crash between a send and the record sends that
// batch's mails again.
const (
	sendBatch   = 50
	sendWorkers = 4
	// lease is how long a taken row is the batch's; sendTimeout bounds each send, and no send
	// starts with less than sendTimeout left on the lease, so every send ends before another
	// replica can take its row again. Since the batch hands back what it cannot send in time,
	// the lease need not outlast a whole batch: it is what the notices of a replica killed
	// mid-batch wait, as River's rescue of the notice jobs did (a minute).
	lease       = time.Minute
	sendTimeout = 30 * time.Second
	// pollInterval is how soon a notice written by an event is sent, at the latest.
	pollInterval = time.Second
	// maxAttempts, spread by backoff over about half a day, stops a dead mail server from
	// keeping notices due for weeks; the row is then failed, with its last error.
	maxAttempts = 12
)

// backoff is the wait after the attempt-th failed attempt: attempt⁴ seconds, River's schedule,
// which the notices' jobs had.
func backoff(attempt int) time.Duration {
	a := time.Duration(attempt)
	return a * a * a * a * time.Second
}

// SenderConfig is what a Sender needs.
type SenderConfig struct {
	DB     *gorm.DB
	Mail   mail.Config
	Logger *slog.Logger
	// Now is the clock of due times; time.Now when nil.
	Now func() time.Time
}

// Sender mails the due notices of both modes: a notice is sent whichever world its event came
// from.
type Sender struct {
	db  *gorm.DB
	now func() time.Time
	*mailer
}

// NewSender builds the sender. With mail not configured (no SMTP URL or no sender) notices are
// logged instead of sent.
func NewSender(c SenderConfig) *Sender {
	if c.Now == nil {
		c.Now = time.Now
	}
	return &Sender{db: c.DB, now: c.Now, mailer: newMailer(c.Mail, c.Logger)}
}

// Run sends due notices until ctx ends. A batch in flight when it ends is finished and recorded.
func (s *Sender) Run(ctx context.Context) {
	for {
		n, err := s.SendDue(context.WithoutCancel(ctx))
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			s.log.WarnContext(ctx, "notices: sending due notices failed", "error", err)
		}
		if n == sendBatch && err == nil {
			continue
		}
		t := time.NewTimer(pollInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// due is a notice taken to be sent.
type due struct {
	ID        int64
	Kind      string
	EventID   string
	Content   []byte
	Attempts  int
	Recipient string
}

// result is one taken notice's outcome, or its failure; back: not sent, for too little was left
// of the lease.
type result struct {
	due
	out  outcome
	err  error
	back bool
}

// SendDue takes one batch of due notices, sends them and records how each went; it returns how
// many it took.
func (s *Sender) SendDue(ctx context.Context) (int, error) {
	now := s.now().UTC()
	var taken []due
	// The recipient is looked up again for a row written without one: the customer may have
	// been linked since the event.
	err := s.db.WithContext(ctx).Raw(`/* all modes: a notice is sent whichever world its event came from */
		UPDATE notices n SET next_attempt_at = $2, attempts = n.attempts + 1
		FROM (SELECT id FROM notices
		      WHERE delivery IS NULL AND next_attempt_at <= $1
		      ORDER BY next_attempt_at LIMIT $3 FOR UPDATE SKIP LOCKED) d
		WHERE n.id = d.id
		RETURNING n.id, n.kind, n.event_id, n.content, n.attempts,
		  coalesce(NULLIF(n.recipient, ''), (`+recipientOf("n.stripe_customer_id", "n.livemode")+`), '') AS recipient`,
		now, now.Add(lease), sendBatch).Scan(&taken).Error
	if err != nil {
		return 0, fmt.Errorf("take due notices: %w", err)
	}
	if len(taken) == 0 {
		return 0, nil
	}
	results := make([]result, len(taken))
	work := make(chan int)
	var wg sync.WaitGroup
	for range min(sendWorkers, len(taken)) {
		wg.Go(func() {
			for i := range work {
				if s.now().Sub(now) > lease-sendTimeout {
					results[i] = result{due: taken[i], back: true}
					continue
				}
				results[i] = s.send1(ctx, taken[i])
			}
		})
	}
	for i := range taken {
		work <- i
	}
	close(work)
	wg.Wait()
	return len(taken), s.record(ctx, now, results)
}

func (s *Sender) send1(ctx context.Context, d due) result {
	var a Args
	if err := json.Unmarshal(d.Content, &a); err != nil {
		return result{due: d, err: fmt.Errorf("notice %d content: %w: %w", d.ID, errPermanent, err)}
	}
	a.NoticeID = d.ID
	ctx, cancel := context.WithTimeout(ctx, sendTimeout)
	defer cancel()
	out, err := s.deliver(ctx, d.ID, a, d.Recipient)
	return result{due: d, out: out, err: err}
}

// record writes the batch's outcomes in one statement: a handled notice leaves the queue; a
// failed one is due again after its backoff, or failed for good after maxAttempts or a
// permanent error.
func (s *Sender) record(ctx context.Context, now time.Time, results []result) error {
	var (
		ids                    []int64
		deliveries, recipients []string
		sent, back             []bool
		next                   []*time.Time
		lastErrors             []*string
		handedBack             int
	)
	for _, r := range results {
		if r.back {
			handedBack++
			ids, deliveries, recipients, sent = append(ids, r.ID), append(deliveries, ""), append(recipients, ""), append(sent, false)
			next, lastErrors, back = append(next, &now), append(lastErrors, nil), append(back, true)
			continue
		}
		delivery, to, ok := r.out.delivery, r.out.to, r.out.sent
		var at *time.Time
		var lastError *string
		if r.err != nil {
			msg := r.err.Error()
			lastError = &msg
			if errors.Is(r.err, errPermanent) || r.Attempts >= maxAttempts {
				delivery = "failed"
				s.log.ErrorContext(ctx, "notice failed; not sent", "notice_id", r.ID, "kind", r.Kind,
					"event_id", r.EventID, "attempts", r.Attempts, "error", r.err)
			} else {
				t := now.Add(backoff(r.Attempts))
				at = &t
				s.log.WarnContext(ctx, "notice not sent; retrying", "notice_id", r.ID, "kind", r.Kind,
					"event_id", r.EventID, "attempts", r.Attempts, "retry_at", t, "error", r.err)
			}
		}
		if delivery != "" {
			Metrics.delivered.WithLabelValues(r.Kind, delivery).Inc()
		}
		ids, deliveries, recipients, sent = append(ids, r.ID), append(deliveries, delivery), append(recipients, to), append(sent, ok)
		next, lastErrors, back = append(next, at), append(lastErrors, lastError), append(back, false)
	}
	if handedBack > 0 {
		s.log.WarnContext(ctx, "notices: the mail server is slow; handing the rest of a batch back", "notices", handedBack)
	}
	err := s.db.WithContext(ctx).Exec(`/* all modes: by the ids taken above */
		UPDATE notices n SET
		  delivery = NULLIF(r.delivery, ''),
		  recipient = CASE WHEN r.recipient <> '' THEN r.recipient ELSE n.recipient END,
		  sent_at = CASE WHEN r.sent THEN CAST($7 AS timestamptz) END,
		  next_attempt_at = r.next_attempt_at,
		  last_error = CASE WHEN r.back THEN n.last_error ELSE r.last_error END,
		  attempts = CASE WHEN r.back THEN n.attempts - 1 ELSE n.attempts END
		FROM unnest(CAST($1 AS bigint[]), CAST($2 AS text[]), CAST($3 AS text[]), CAST($4 AS boolean[]),
		            CAST($5 AS timestamptz[]), CAST($6 AS text[]), CAST($8 AS boolean[]))
		  AS r(id, delivery, recipient, sent, next_attempt_at, last_error, back)
		WHERE n.id = r.id`,
		ids, deliveries, recipients, sent, next, lastErrors, now, back).Error
	if err != nil {
		// The rows stay taken: they are sent again when their lease ends.
		return fmt.Errorf("record %d notices: %w", len(results), err)
	}
	return nil
}
