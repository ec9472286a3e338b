package test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"billing/internal/testenv"
)

// waitForLog polls the service's output for s; the deadline only bounds a failing test.
func waitForLog(t *testing.T, p *proc, s string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(p.out.String(), s) {
		if time.Now().After(deadline) {
			t.Fatalf("the log never said %q:\n%s", s, tail(p.out.String(), 4000))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// serve checks Stripe in the background: it is ready while its check still waits for Stripe's
// answer, and logs the failure once Stripe answers.
func TestServeIsReadyWhileTheStripeCheckWaits(t *testing.T) {
	t.Parallel()
	arrived := make(chan struct{}, 16)
	release := make(chan struct{})
	var inFlight atomic.Int32
	stub := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inFlight.Add(1)
		defer inFlight.Add(-1)
		select {
		case arrived <- struct{}{}:
		default:
		}
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = w.Write([]byte(`{"error":{"type":"invalid_request_error","message":"Invalid API Key provided: sk_test_****eck1"}}`))
	}))
	t.Cleanup(stub.Close)
	var released atomic.Bool
	releaseOnce := func() {
		if released.CompareAndSwap(false, true) {
			close(release)
		}
	}
	t.Cleanup(releaseOnce) // runs before stub.Close, which waits for held requests

	p := start(t, t.TempDir(), map[string]string{
		"BILLING_DATABASE_URL":      testenv.DatabaseURL(t),
		"BILLING_STRIPE_API_URL":    stub.URL,
		"BILLING_STRIPE_SECRET_KEY": "sk_test_check1",
	})
	select {
	case <-arrived:
	case <-time.After(60 * time.Second):
		t.Fatalf("the start-up check never reached Stripe:\n%s", tail(p.out.String(), 4000))
	}
	if n := inFlight.Load(); n != 1 {
		t.Fatalf("%d check requests held at Stripe once the service is ready, want 1: the check did not run in the background", n)
	}
	if strings.Contains(p.out.String(), "stripe check failed") {
		t.Fatalf("the check finished before the service was ready:\n%s", tail(p.out.String(), 4000))
	}

	releaseOnce()
	waitForLog(t, p, `"check":"stripe secret key"`)
	if out := p.out.String(); !strings.Contains(out, "Stripe refused the key") || strings.Contains(out, "sk_test_check1") {
		t.Errorf("log:\n%s", tail(out, 4000))
	}
	if code := p.stop(t, syscall.SIGTERM); code != 0 {
		t.Errorf("exit code %d", code)
	}
}

// With Stripe unreachable the service starts all the same and warns.
func TestServeStartsWithStripeUnreachable(t *testing.T) {
	t.Parallel()
	p := start(t, t.TempDir(), map[string]string{
		"BILLING_DATABASE_URL":      testenv.DatabaseURL(t),
		"BILLING_STRIPE_API_URL":    "http://127.0.0.1:1",
		"BILLING_STRIPE_SECRET_KEY": "sk_test_check2",
	})
	waitForLog(t, p, "cannot reach Stripe")
	if status, _ := get(t, p.url("/readyz"), ""); status != 200 {
		t.Errorf("/readyz %d after the warning", status)
	}
	if code := p.stop(t, syscall.SIGTERM); code != 0 {
		t.Errorf("exit code %d", code)
	}
}
