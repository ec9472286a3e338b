package stripeclient

import (
	"net/http"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v79"
)

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

// The bucket lets a burst through, then spaces requests at the rate, and refills with time.
func TestBucketSpacesRequests(t *testing.T) {
	c := &fakeClock{t: time.Unix(1000, 0)}
	b := NewBucket(25, 5, c.now)
	var waits []time.Duration
	for range 7 {
		waits = append(waits, b.Reserve())
	}
	want := []time.Duration{0, 0, 0, 0, 0, 40 * time.Millisecond, 80 * time.Millisecond}
	for i := range want {
		if waits[i] != want[i] {
			t.Fatalf("waits = %v, want %v", waits, want)
		}
	}
	c.t = c.t.Add(time.Second) // 25 tokens' worth, capped at the burst
	for i := range 5 {
		if w := b.Reserve(); w != 0 {
			t.Fatalf("after a second, request %d waits %v", i, w)
		}
	}
	if w := b.Reserve(); w != 40*time.Millisecond {
		t.Fatalf("beyond the burst: wait %v, want 40ms", w)
	}
}

func TestRateLimited(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&stripe.Error{HTTPStatusCode: http.StatusTooManyRequests, Code: stripe.ErrorCodeRateLimit}, true},
		{&stripe.Error{HTTPStatusCode: http.StatusTooManyRequests, Code: stripe.ErrorCodeLockTimeout}, false},
		{&stripe.Error{HTTPStatusCode: http.StatusInternalServerError}, false},
		{http.ErrHandlerTimeout, false},
	} {
		if got := RateLimited(tc.err); got != tc.want {
			t.Errorf("RateLimited(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
