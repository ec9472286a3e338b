package stripeclient

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/stripe/stripe-go/v79"

	"billing/internal/apierr"
)

func cardError() *stripe.Error {
	return &stripe.Error{
		HTTPStatusCode: http.StatusPaymentRequired, Type: stripe.ErrorTypeCard, Code: stripe.ErrorCodeCardDeclined,
		DeclineCode: "insufficient_funds", Msg: "Your card has insufficient funds.", RequestID: "req_1",
		PaymentIntent: &stripe.PaymentIntent{ID: "pi_1", ClientSecret: "pi_1_secret_DO_NOT_LOG"},
		PaymentMethod: &stripe.PaymentMethod{ID: "pm_1", Card: &stripe.PaymentMethodCard{Last4: "4242", Fingerprint: "fp_DO_NOT_LOG"}},
	}
}

// stripe.Error's own Error() is the JSON of the whole error, objects included.
func TestRedactKeepsObjectsOut(t *testing.T) {
	t.Parallel()
	se := cardError()
	if !strings.Contains(se.Error(), "DO_NOT_LOG") {
		t.Fatal("premise: stripe.Error.Error() no longer embeds the objects; Redact may be obsolete")
	}
	wrapped := fmt.Errorf("charge: %w", se)
	for name, s := range map[string]string{
		"Redact":   Redact(wrapped).Error(),
		"APIError": APIError(wrapped, "charge").Error(),
		"LogAttr":  slog.GroupValue(LogAttr(wrapped)).String(),
	} {
		if strings.Contains(s, "DO_NOT_LOG") || strings.Contains(s, "4242") {
			t.Errorf("%s leaks an object: %s", name, s)
		}
		if !strings.Contains(s, "insufficient_funds") || !strings.Contains(s, "req_1") {
			t.Errorf("%s lost the error's codes: %s", name, s)
		}
	}
	plain := errors.New("dial tcp: connection refused")
	if Redact(plain) != plain {
		t.Error("Redact changed an error that is not Stripe's")
	}
}

func TestRetryableAndAPIError(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		err       error
		retryable bool
		code      apierr.Code
	}{
		{"network", errors.New("connection reset"), true, apierr.CodeStripeUnavailable},
		{"context", context.DeadlineExceeded, true, apierr.CodeStripeUnavailable},
		{"500", &stripe.Error{HTTPStatusCode: 500, Type: stripe.ErrorTypeAPI}, true, apierr.CodeStripeUnavailable},
		{"429", &stripe.Error{HTTPStatusCode: 429}, true, apierr.CodeStripeUnavailable},
		{"409 key in use", &stripe.Error{HTTPStatusCode: 409, Type: stripe.ErrorTypeIdempotency}, true, apierr.CodeStripeUnavailable},
		{"400", &stripe.Error{HTTPStatusCode: 400, Type: stripe.ErrorTypeInvalidRequest}, false, apierr.CodeStripeError},
		{"401", &stripe.Error{HTTPStatusCode: 401}, false, apierr.CodeStripeError},
		{"402", cardError(), false, apierr.CodeStripeError},
	} {
		if got := Retryable(tc.err); got != tc.retryable {
			t.Errorf("%s: Retryable = %v, want %v", tc.name, got, tc.retryable)
		}
		e, ok := apierr.As(APIError(tc.err, "do it"))
		if !ok || e.Code != tc.code {
			t.Errorf("%s: APIError = %v, want code %s", tc.name, e, tc.code)
		}
	}
}
