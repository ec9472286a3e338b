package reconcile

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v79"
)

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func tooMany(retryAfter string) error {
	se := &stripe.Error{HTTPStatusCode: http.StatusTooManyRequests, Code: "rate_limit"}
	h := http.Header{}
	if retryAfter != "" {
		h.Set("Retry-After", retryAfter)
	}
	se.SetLastResponse(&stripe.APIResponse{Header: h})
	return se
}

// Backoff doubles from BaseDelay up to MaxDelay; Retry-After wins, capped at MaxRetryAfter.
func TestBackoffDelays(t *testing.T) {
	l := Limits{BaseDelay: time.Second, MaxDelay: 30 * time.Second, MaxRetryAfter: time.Minute}
	now := time.Unix(1000, 0)
	for attempt, want := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 5: 16 * time.Second, 6: 30 * time.Second, 40: 30 * time.Second} {
		if got := l.delay(attempt, tooMany(""), now); got != want {
			t.Errorf("attempt %d: delay %v, want %v", attempt, got, want)
		}
	}
	if got := l.delay(1, tooMany("7"), now); got != 7*time.Second {
		t.Errorf("Retry-After 7: %v", got)
	}
	if got := l.delay(1, tooMany("3600"), now); got != time.Minute {
		t.Errorf("Retry-After 3600: %v, want capped at a minute", got)
	}
	if got := l.delay(1, tooMany(now.Add(20*time.Second).UTC().Format(http.TimeFormat)), now); got != 20*time.Second {
		t.Errorf("Retry-After as a date: %v", got)
	}
	if got := l.delay(3, tooMany("soon"), now); got != 4*time.Second {
		t.Errorf("unreadable Retry-After: %v, want the backoff", got)
	}
}

func TestRetryable(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{tooMany(""), true},
		{&stripe.Error{HTTPStatusCode: 500}, true},
		{&stripe.Error{HTTPStatusCode: 401}, false},
		{&stripe.Error{HTTPStatusCode: 404}, false},
		{errors.New("connection reset"), true},
	} {
		if got := retryable(tc.err); got != tc.want {
			t.Errorf("retryable(%v) = %v", tc.err, got)
		}
	}
}

func TestSummaryLineAndExitCode(t *testing.T) {
	s := Summary{Objects: 5, Drifted: 2, Repaired: 2, MissingAtStripe: 0, Errors: 0}
	if s.Line() != "reconcile: objects=5 drifted=2 repaired=2 missing_at_stripe=0 errors=0" || s.ExitCode() != ExitClean {
		t.Errorf("%q exit %d", s.Line(), s.ExitCode())
	}
	for _, tc := range []struct {
		s    Summary
		want int
	}{
		{Summary{Drifted: 2, Repaired: 0, DryRun: true}, ExitDrift},
		{Summary{Drifted: 2, Repaired: 1}, ExitDrift},
		{Summary{MissingAtStripe: 1}, ExitDrift},
		{Summary{Errors: 1}, ExitDrift},
		{Summary{Errors: 1, Err: errors.New("stopped")}, ExitStopped},
		{Summary{}, ExitClean},
	} {
		if got := tc.s.ExitCode(); got != tc.want {
			t.Errorf("%+v: exit %d, want %d", tc.s, got, tc.want)
		}
	}
}
