package usage

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/stripe/stripe-go/v79"
	"gorm.io/gorm"

	"billing/appevents"
	"billing/internal/outbound"
	"billing/internal/stripeclient"
)

// The reporter: a loop in every replica (RunReporter) that sends the mode's pending records
// as meter events, oldest due first. Replicas share the work without queueing on each other: a
// row another replica is sending is skipped (outbound's SkipLocked), and the row lock is held
// across the call, so a row is never in two calls at once. A record is due at once when stored
// (the POST wakes the loop) and again after each failed attempt, later each time.
//
// Before a row's first call, the moment is committed (first_attempt_at): Stripe cannot have
// seen the identifier before it, so the window (usage.review_after) counted from it is a safe
// lower bound of Stripe's memory of the identifier. A row past the window and still pending is
// needs_review (see the package doc), never sent again.
//
// Rate: every call takes a token of a bucket of usage.report_rate a second (per replica). A 429
// pauses the whole loop for Retry-After (or the row's backoff when Stripe sends none): the rate
// limit is the account's, not the row's. A 5xx or a call that got no answer is retried by
// stripe-go under the same key, then left pending with its backoff.

const (
	reportBatch   = 100
	reportWorkers = 4
	// pollInterval bounds the wait for rows that became due without a nudge (another
	// replica's POST, a backoff ending).
	pollInterval = 2 * time.Second
	minWait      = 100 * time.Millisecond
	// baseDelay doubles per failed attempt of a row, up to maxDelay.
	baseDelay = time.Second
	maxDelay  = 5 * time.Minute
	// maxRetryAfter caps the pause Stripe may ask for.
	maxRetryAfter = 10 * time.Minute
)

type reporter struct {
	s      *Service
	bucket *stripeclient.Bucket
	wake   chan struct{}

	mu          sync.Mutex
	pausedUntil time.Time
}

func newReporter(s *Service, rate float64) *reporter {
	burst := max(1, int(rate))
	return &reporter{s: s, bucket: stripeclient.NewBucket(rate, burst, s.now), wake: make(chan struct{}, 1)}
}

// nudge wakes the loop: a record was stored.
func (r *reporter) nudge() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *reporter) pause(until time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if until.After(r.pausedUntil) {
		r.pausedUntil = until
	}
}

func (r *reporter) pauseDeadline() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pausedUntil
}

// paused is how long the pause has to go.
func (r *reporter) paused() time.Duration { return r.pauseDeadline().Sub(r.s.now()) }

// RunReporter sends pending records until ctx ends. A call in flight when it ends is finished
// and its answer recorded; no new one starts.
func (s *Service) RunReporter(ctx context.Context) {
	s.log.InfoContext(ctx, "usage reporter started", "review_after", s.reviewAfter)
	var counted time.Time
	for {
		if time.Since(counted) >= countInterval {
			s.count(ctx)
			counted = time.Now()
		}
		n, err := s.ReportDue(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			s.log.WarnContext(ctx, "usage reporter: listing due records failed", "error", err)
		}
		if n >= reportBatch && err == nil {
			continue
		}
		wait := pollInterval
		if next, ok := s.nextDue(ctx); ok {
			// Not less than minWait: a due row that another replica is sending (skipped here)
			// stays due until it is done.
			wait = min(wait, max(minWait, next.Sub(s.now())))
		}
		wait = max(wait, s.rep.paused())
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-s.rep.wake:
		case <-t.C:
		}
		t.Stop()
	}
}

// ReportDue sends one batch of the due records and returns how many it took up.
func (s *Service) ReportDue(ctx context.Context) (int, error) {
	var keys []recordKey
	if err := s.db.WithContext(ctx).Raw(`
		SELECT user_id, usage_id FROM usage_records
		WHERE livemode = $1 AND status = $2 AND next_attempt_at <= $3
		ORDER BY next_attempt_at, created_at LIMIT $4`,
		s.livemode, statePending, s.now().UTC(), reportBatch).Scan(&keys).Error; err != nil {
		return 0, fmt.Errorf("list due usage records: %w", err)
	}
	work := make(chan recordKey)
	var wg sync.WaitGroup
	for range min(reportWorkers, len(keys)) {
		wg.Go(func() {
			for k := range work {
				s.report(ctx, k)
			}
		})
	}
	taken := 0
feed:
	for _, k := range keys {
		select {
		case work <- k:
			taken++
		case <-ctx.Done():
			break feed
		}
	}
	close(work)
	wg.Wait()
	return taken, nil
}

// nextDue is when the earliest pending record becomes due.
func (s *Service) nextDue(ctx context.Context) (time.Time, bool) {
	var row struct{ Next *time.Time }
	if err := s.db.WithContext(ctx).Raw(`SELECT min(next_attempt_at) AS next FROM usage_records WHERE livemode = $1 AND status = $2`,
		s.livemode, statePending).Scan(&row).Error; err != nil || row.Next == nil {
		return time.Time{}, false
	}
	return *row.Next, true
}

// report sends one record, within the rate and any pause Stripe asked for.
func (s *Service) report(ctx context.Context, k recordKey) {
	// A pause Stripe asked for first (waited again only if another 429 extended it meanwhile),
	// then the rate.
	for {
		until := s.rep.pauseDeadline()
		d := until.Sub(s.now())
		if d <= 0 {
			break
		}
		if err := sleepCtx(ctx, d); err != nil {
			return
		}
		if !s.rep.pauseDeadline().After(until) {
			break
		}
	}
	if d := s.rep.bucket.Reserve(); d > 0 {
		if err := sleepCtx(ctx, d); err != nil {
			return
		}
	}
	// From here the call is finished whatever happens to ctx: its answer must be recorded.
	callCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stripeclient.CallBudget)
	defer cancel()
	res, err := s.send(callCtx, k)
	if err != nil {
		s.metrics.failures.WithLabelValues("error").Inc()
		s.log.WarnContext(ctx, "usage record not reported; the next round tries again", "user_id", k.UserID, "usage_id", k.UsageID, "error", err)
		return
	}
	switch res.Outcome {
	case outbound.Completed:
		s.metrics.reported.Inc()
	case outbound.Refused:
		s.metrics.failures.WithLabelValues("refused").Inc()
	case outbound.Review:
		s.metrics.failures.WithLabelValues("needs_review").Inc()
	case outbound.Pending:
		reason := "unavailable"
		if stripeclient.RateLimited(res.Attempt.Err) {
			reason = "rate_limited"
		}
		s.metrics.failures.WithLabelValues(reason).Inc()
	}
}

// send is one attempt at a record through the outbound protocol. It first commits the
// attempt's start if none was (first_attempt_at), the moment the window is counted from.
func (s *Service) send(ctx context.Context, k recordKey) (outbound.Result, error) {
	now := s.now().UTC()
	if err := s.db.WithContext(ctx).Exec(`
		UPDATE usage_records SET first_attempt_at = $1, updated_at = $1
		WHERE livemode = $2 AND user_id = $3 AND usage_id = $4 AND status = $5 AND first_attempt_at IS NULL`,
		now, s.livemode, k.UserID, k.UsageID, statePending).Error; err != nil {
		return outbound.Result{}, fmt.Errorf("stamp first attempt: %w", err)
	}
	var row record
	args := []any{s.livemode, k.UserID, k.UsageID}
	// update sets columns of the locked row; set's placeholders start at $4.
	update := func(tx *gorm.DB, set string, setArgs ...any) error {
		return tx.Exec(fmt.Sprintf(`UPDATE usage_records SET %s WHERE livemode = $1 AND user_id = $2 AND usage_id = $3`, set),
			append(slices.Clone(args), setArgs...)...).Error
	}
	markReported := func(tx *gorm.DB, a outbound.Attempt, note *string) error {
		if err := update(tx, `status = $4, reported_at = $5, attempts = attempts + 1, last_attempt_at = $5,
			error_code = NULL, error_message = $6, updated_at = $5`, stateReported, a.At, note); err != nil {
			return fmt.Errorf("mark usage record reported: %w", err)
		}
		return nil
	}
	return outbound.Run(ctx, s.db, outbound.Call[*stripe.BillingMeterEvent]{
		Lock: outbound.Select{SQL: `SELECT * FROM usage_records WHERE livemode = $1 AND user_id = $2 AND usage_id = $3`,
			Args: args, Into: &row, SkipLocked: true},
		Locked: func(*gorm.DB) (outbound.State, error) {
			if row.Status != statePending {
				return outbound.State{Key: row.Identifier, Done: true}, nil
			}
			if row.FirstAttemptAt == nil {
				return outbound.State{}, errors.New("pending usage record without a first attempt")
			}
			return outbound.State{Key: row.Identifier, CreatedAt: *row.FirstAttemptAt}, nil
		},
		Window: s.reviewAfter,
		Review: func(tx *gorm.DB, a outbound.Attempt) error {
			if err := update(tx, `status = $4, review_since = $5, updated_at = $5`, stateNeedsReview, a.At); err != nil {
				return fmt.Errorf("mark usage record for review: %w", err)
			}
			if err := s.tellReview(ctx, tx, k); err != nil {
				return err
			}
			s.log.WarnContext(ctx, "usage record needs an operator's review: its first attempt is older than usage.review_after and Stripe never acknowledged it",
				"user_id", row.UserID, "usage_id", row.UsageID, "identifier", row.Identifier, "first_attempt_at", row.FirstAttemptAt, "attempts", row.Attempts)
			return nil
		},
		Create: func(p stripe.Params) (*stripe.BillingMeterEvent, error) {
			return s.stripe.BillingMeterEvents.New(meterEventParams(p, &row))
		},
		Complete: func(tx *gorm.DB, _ *stripe.BillingMeterEvent, a outbound.Attempt) error {
			return markReported(tx, a, nil)
		},
		Refuse: func(tx *gorm.DB, a outbound.Attempt) error {
			if duplicateIdentifier(a.Err) {
				// Stripe holds an event under this identifier: an earlier attempt's, whose
				// answer (and key) was lost. The identifier is derived from the record, so it is
				// this record's event.
				note := "Stripe already had an event with this identifier"
				return markReported(tx, a, &note)
			}
			code, msg := stripeErrorOf(a.Err)
			if err := update(tx, `status = $4, attempts = attempts + 1, last_attempt_at = $5, error_code = $6,
				error_message = $7, updated_at = $5`, stateRefused, a.At, code, msg); err != nil {
				return fmt.Errorf("mark usage record refused: %w", err)
			}
			if err := s.tellReview(ctx, tx, k); err != nil {
				return err
			}
			s.log.WarnContext(ctx, "Stripe refused the meter event; the record is kept as refused", "user_id", row.UserID,
				"usage_id", row.UsageID, "meter", row.Meter, stripeclient.LogAttr(a.Err))
			return nil
		},
		RecordAttempt: func(tx *gorm.DB, a outbound.Attempt) error {
			delay := backoff(row.Attempts + 1)
			if stripeclient.RateLimited(a.Err) {
				if d, ok := stripeclient.RetryAfter(a.Err, a.At); ok {
					delay = min(d, maxRetryAfter)
				}
				s.rep.pause(a.At.Add(delay))
			}
			code, msg := stripeErrorOf(a.Err)
			if err := update(tx, `attempts = attempts + 1, last_attempt_at = $4, next_attempt_at = $5, error_code = $6,
				error_message = $7, updated_at = $4`, a.At, a.At.Add(delay), code, msg); err != nil {
				return fmt.Errorf("record usage attempt: %w", err)
			}
			return nil
		},
		Now: s.now,
		Log: s.log.With("user_id", k.UserID, "usage_id", k.UsageID),
	})
}

// tellReview tells the app, in tx, a record of the service's mode that tx moved to needs_review
// or refused (usage.needs_review): the record as POST /v1/customers/{user_id}/usage answers it
// once tx commits. The user's lock comes after the record's, which tx holds.
func (s *Service) tellReview(ctx context.Context, tx *gorm.DB, k recordKey) error {
	if s.teller == nil {
		return nil
	}
	l, err := s.teller.Lock(ctx, tx, k.UserID, s.livemode, appevents.UsageSubject(k.UsageID))
	if err != nil {
		return fmt.Errorf("tell usage record %s/%s: %w", k.UserID, k.UsageID, err)
	}
	var rows []record
	if err := tx.WithContext(ctx).Raw(`SELECT * FROM usage_records WHERE livemode = $1 AND user_id = $2 AND usage_id = $3`,
		s.livemode, k.UserID, k.UsageID).Scan(&rows).Error; err != nil {
		return fmt.Errorf("tell usage record %s/%s: load: %w", k.UserID, k.UsageID, err)
	}
	if len(rows) == 0 || (rows[0].Status != stateNeedsReview && rows[0].Status != stateRefused) {
		return nil
	}
	if _, err := s.teller.Tell(ctx, tx, l, appevents.Change{Type: appevents.TypeUsageNeedsReview, Answer: rows[0].answer()}); err != nil {
		return fmt.Errorf("tell usage record %s/%s: %w", k.UserID, k.UsageID, err)
	}
	return nil
}

// meterEventParams is the record's meter event; p carries its key (the identifier).
func meterEventParams(p stripe.Params, r *record) *stripe.BillingMeterEventParams {
	return &stripe.BillingMeterEventParams{
		Params:     p,
		EventName:  stripe.String(r.Meter),
		Identifier: stripe.String(r.Identifier),
		Payload: map[string]string{
			"stripe_customer_id": r.StripeCustomerID,
			"value":              strconv.FormatInt(r.Value, 10),
		},
		Timestamp: stripe.Int64(r.OccurredAt.Unix()),
	}
}

// duplicateIdentifier reports Stripe's refusal of a meter event whose identifier it already
// holds ("An event already exists with identifier …"): it comes once the idempotency key is
// forgotten and the identifier is not.
func duplicateIdentifier(err error) bool {
	var se *stripe.Error
	return errors.As(err, &se) && se.HTTPStatusCode == 400 &&
		strings.Contains(strings.ToLower(se.Msg), "already exists with identifier")
}

// stripeErrorOf is what a row keeps of a failed attempt: Stripe's code and message, or the
// network error's text.
func stripeErrorOf(err error) (code, msg string) {
	var se *stripe.Error
	if errors.As(err, &se) {
		code = string(se.Code)
		if code == "" {
			code = fmt.Sprintf("http_%d", se.HTTPStatusCode)
		}
		return code, se.Msg
	}
	return "no_answer", err.Error()
}

// backoff is the wait after a row's attempt-th failed attempt.
func backoff(attempt int) time.Duration {
	d := baseDelay
	for i := 1; i < attempt && d < maxDelay; i++ {
		d *= 2
	}
	return min(d, maxDelay)
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
