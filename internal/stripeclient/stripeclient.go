// Package stripeclient builds the one stripe-go client of the service: pinned API version (the
// one stripe-go v79 speaks), the configured base URL (stripe-mock in tests), network retries on.
package stripeclient

import (
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/client"

	"billing/internal/httpserver"
)

// APIVersion is the Stripe API version sent on every call. It is not configurable: it is the
// version the pinned stripe-go release was generated for.
const APIVersion = stripe.APIVersion

// A call to Stripe is tried up to Retries+1 times, each try bounded by TryTimeout, with
// stripe-go's backoff (at most maxRetryDelay) between tries. CallBudget, the worst case of one
// call, fits in the server's OutboundBudget, so that a call is not cut mid-retry by the
// request's deadline, and so that its answer can still be written to the client.
const (
	TryTimeout = 20 * time.Second
	Retries    = 2
	// maxRetryDelay is stripe-go's cap on the sleep between two tries.
	maxRetryDelay = 5 * time.Second
	CallBudget    = (Retries+1)*TryTimeout + Retries*maxRetryDelay
)

// A compile-time check: the conversion fails if CallBudget does not fit in OutboundBudget.
const _ = uint64(httpserver.OutboundBudget - CallBudget)

// New returns a client for apiURL with secretKey. stripe-go retries network errors and 5xx
// answers itself, with the same Idempotency-Key on each retry.
func New(apiURL, secretKey string, logger *slog.Logger) *client.API {
	cfg := &stripe.BackendConfig{
		URL:               stripe.String(apiURL),
		MaxNetworkRetries: stripe.Int64(Retries),
		HTTPClient:        &http.Client{Timeout: TryTimeout, Transport: countingTransport{http.DefaultTransport}},
		LeveledLogger:     leveled{logger.With("component", "stripe")},
	}
	backends := &stripe.Backends{
		API:     stripe.GetBackendWithConfig(stripe.APIBackend, cfg),
		Connect: stripe.GetBackendWithConfig(stripe.ConnectBackend, cfg),
		Uploads: stripe.GetBackendWithConfig(stripe.UploadsBackend, cfg),
	}
	sc := &client.API{}
	sc.Init(secretKey, backends)
	return sc
}

// leveled adapts slog to stripe-go's logger. stripe-go's messages may embed a whole response body
// (a PaymentIntent's client_secret, a customer's email), so only the text before the first JSON
// brace is kept: the callers log the error codes that matter.
type leveled struct{ l *slog.Logger }

func (l leveled) Debugf(format string, v ...any) {}
func (l leveled) Infof(format string, v ...any)  {}
func (l leveled) Warnf(format string, v ...any)  { l.l.Warn(redact(fmt.Sprintf(format, v...))) }
func (l leveled) Errorf(format string, v ...any) { l.l.Warn(redact(fmt.Sprintf(format, v...))) }

func redact(msg string) string {
	if i := strings.IndexByte(msg, '{'); i >= 0 {
		return strings.TrimSpace(msg[:i]) + " (body omitted)"
	}
	return msg
}
