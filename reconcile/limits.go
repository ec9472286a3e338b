package reconcile

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/stripe/stripe-go/v79"

	"billing/internal/stripeclient"
)

// Limits bound the run's calls to Stripe.
//
// Every request waits for a token of a bucket refilled at ReadsPerSecond (Stripe's read limit
// is 25 per second in test mode and 100 in live mode; a run stays under it so that the service's
// own calls keep their share). A request that fails with 429, a 5xx or a network error is tried
// again, up to MaxAttempts times, after Retry-After when Stripe sends it (at most MaxRetryAfter),
// else after BaseDelay doubled per attempt (at most MaxDelay). stripe-go retries a request
// itself only when Stripe says so (Stripe-Should-Retry, a lock timeout) or on 5xx and network
// errors, at most stripeclient.Retries times: one attempt here is at most Retries+1 requests, so a
// page costs at most MaxAttempts × (Retries+1) requests before the run gives up and says so.
type Limits struct {
	ReadsPerSecond float64
	Burst          int
	MaxAttempts    int
	BaseDelay      time.Duration
	MaxDelay       time.Duration
	MaxRetryAfter  time.Duration
}

// DefaultLimits are the limits of a mode.
func DefaultLimits(livemode bool) Limits {
	l := Limits{ReadsPerSecond: 25, Burst: 5, MaxAttempts: 8, BaseDelay: time.Second, MaxDelay: 30 * time.Second, MaxRetryAfter: 2 * time.Minute}
	if livemode {
		l.ReadsPerSecond = 100
		l.Burst = 20
	}
	return l
}

// withDefaults fills the zero fields from DefaultLimits.
func (l Limits) withDefaults(livemode bool) Limits {
	d := DefaultLimits(livemode)
	if l.ReadsPerSecond <= 0 {
		l.ReadsPerSecond = d.ReadsPerSecond
	}
	if l.Burst <= 0 {
		l.Burst = d.Burst
	}
	if l.MaxAttempts <= 0 {
		l.MaxAttempts = d.MaxAttempts
	}
	if l.BaseDelay <= 0 {
		l.BaseDelay = d.BaseDelay
	}
	if l.MaxDelay <= 0 {
		l.MaxDelay = d.MaxDelay
	}
	if l.MaxRetryAfter <= 0 {
		l.MaxRetryAfter = d.MaxRetryAfter
	}
	return l
}

// MaxRequestsPerCall is the most requests one call (a page, a re-read) can make before it fails.
func (l Limits) MaxRequestsPerCall() int { return l.MaxAttempts * (stripeclient.Retries + 1) }

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// retryable reports whether a failed read may succeed later: rate limited, Stripe's 5xx, or no
// answer at all.
func retryable(err error) bool {
	var se *stripe.Error
	if !errors.As(err, &se) {
		return true
	}
	return se.HTTPStatusCode == http.StatusTooManyRequests || se.HTTPStatusCode >= 500 || se.HTTPStatusCode == 0
}

// delay is the wait before attempt+1 after a failed attempt (1-based).
func (l Limits) delay(attempt int, err error, now time.Time) time.Duration {
	if d, ok := stripeclient.RetryAfter(err, now); ok {
		return min(d, l.MaxRetryAfter)
	}
	d := l.BaseDelay
	for i := 1; i < attempt && d < l.MaxDelay; i++ {
		d *= 2
	}
	return min(d, l.MaxDelay)
}

// errGaveUp wraps the last error of a call that used up its attempts.
type errGaveUp struct {
	what     string
	attempts int
	err      error
}

func (e *errGaveUp) Error() string {
	return fmt.Sprintf("%s: gave up after %d attempts: %v", e.what, e.attempts, stripeclient.Redact(e.err))
}

func (e *errGaveUp) Unwrap() error { return e.err }

// call runs fn, one read from Stripe, within the limits: it waits for the rate limiter, takes
// the fetch time just before the request goes out (so that what Stripe answers is never taken
// for newer than it is), and tries again after a retryable failure. It returns the fetch time of
// the attempt that succeeded.
func (s *Service) call(ctx context.Context, what string, fn func(ctx context.Context) error) (time.Time, error) {
	for attempt := 1; ; attempt++ {
		if err := s.sleep(ctx, s.bucket.Reserve()); err != nil {
			return time.Time{}, err
		}
		fetchedAt := s.now()
		err := fn(ctx)
		if err == nil {
			return fetchedAt, nil
		}
		if ctx.Err() != nil {
			return time.Time{}, ctx.Err()
		}
		if !retryable(err) {
			return time.Time{}, fmt.Errorf("%s: %w", what, stripeclient.Redact(err))
		}
		if attempt >= s.limits.MaxAttempts {
			return time.Time{}, &errGaveUp{what: what, attempts: attempt, err: err}
		}
		d := s.limits.delay(attempt, err, s.now())
		s.metrics.retries.Inc()
		s.log.WarnContext(ctx, "stripe read failed; trying again", "what", what, "attempt", attempt,
			"delay", d, stripeclient.LogAttr(err))
		if err := s.sleep(ctx, d); err != nil {
			return time.Time{}, err
		}
	}
}
