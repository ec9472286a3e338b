package stripeclient

import (
	"errors"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/stripe/stripe-go/v79"
)

// Bucket is a token bucket for the service's own pacing of calls to Stripe (a reconcile run's
// reads, the usage reporter's meter events): rate tokens a second, at most burst saved up.
type Bucket struct {
	mu     sync.Mutex
	rate   float64
	burst  float64
	tokens float64
	last   time.Time
	now    func() time.Time
}

// NewBucket returns a full bucket; now is its clock (time.Now when nil).
func NewBucket(rate float64, burst int, now func() time.Time) *Bucket {
	if now == nil {
		now = time.Now
	}
	return &Bucket{rate: rate, burst: float64(burst), tokens: float64(burst), now: now}
}

// Reserve takes a token and returns how long to wait before using it.
func (b *Bucket) Reserve() time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	if !b.last.IsZero() {
		b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	}
	b.last = now
	b.tokens--
	if b.tokens >= 0 {
		return 0
	}
	return time.Duration(-b.tokens / b.rate * float64(time.Second))
}

// RetryAfter is the delay Stripe asked for with a failed call (Retry-After, in seconds or as a
// date), if any.
func RetryAfter(err error, now time.Time) (time.Duration, bool) {
	var se *stripe.Error
	if !errors.As(err, &se) || se.LastResponse == nil {
		return 0, false
	}
	v := se.LastResponse.Header.Get("Retry-After")
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.ParseFloat(v, 64); err == nil && secs >= 0 {
		return time.Duration(secs * float64(time.Second)), true
	}
	if at, err := http.ParseTime(v); err == nil {
		return max(0, at.Sub(now)), true
	}
	return 0, false
}

// RateLimited reports whether a failed call was refused for Stripe's rate limit (429), as
// opposed to a lock timeout, which stripe-go retries itself.
func RateLimited(err error) bool {
	var se *stripe.Error
	return errors.As(err, &se) && se.HTTPStatusCode == http.StatusTooManyRequests && se.Code != stripe.ErrorCodeLockTimeout
}
