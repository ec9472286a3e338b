package stripeclient

import (
	"log/slog"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v79"

	"billing/internal/httpserver"
)

// A delayed Stripe once outlived the server's write timeout: the charge succeeded and the client
// got an empty reply. One call, all its tries and backoffs included, must end while the answer
// can still be written, even after the slowest allowed body upload.
func TestCallFitsInTheRequestBudget(t *testing.T) {
	t.Parallel()
	sc := New("http://127.0.0.1:1", "sk_test_x", slog.New(slog.DiscardHandler))
	for name, b := range map[string]stripe.Backend{"api": sc.PaymentIntents.B, "customers": sc.Customers.B, "refunds": sc.Refunds.B} {
		impl, ok := b.(*stripe.BackendImplementation)
		if !ok {
			t.Fatalf("%s: backend %T", name, b)
		}
		if impl.HTTPClient == nil || impl.HTTPClient.Timeout <= 0 {
			t.Fatalf("%s: no per-try timeout", name)
		}
		retries := time.Duration(impl.MaxNetworkRetries)
		worst := (retries+1)*impl.HTTPClient.Timeout + retries*maxRetryDelay
		if worst > httpserver.OutboundBudget {
			t.Errorf("%s: a call may take %v, more than the outbound budget %v", name, worst, httpserver.OutboundBudget)
		}
		if httpserver.ReadTimeout+worst >= httpserver.WriteTimeout {
			t.Errorf("%s: a call may take %v; with the body read (%v) it outlives the write timeout %v",
				name, worst, httpserver.ReadTimeout, httpserver.WriteTimeout)
		}
		if worst != CallBudget {
			t.Errorf("%s: a call may take %v, CallBudget says %v", name, worst, CallBudget)
		}
	}
}
