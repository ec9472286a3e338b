package stripeclient

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/stripe/stripe-go/v79"

	"billing/internal/apierr"
)

// Retryable reports whether a failed call may not have reached Stripe, or may succeed when
// repeated with the same idempotency key: network errors, 5xx, 429, and 409 (the key is in use
// by a concurrent request). stripe-go has already retried these itself; whatever the call was
// for must stay unfinished so that a later request repeats it.
func Retryable(err error) bool {
	var se *stripe.Error
	if !errors.As(err, &se) {
		return true
	}
	return se.HTTPStatusCode >= 500 || se.HTTPStatusCode == http.StatusTooManyRequests ||
		se.HTTPStatusCode == http.StatusConflict || se.HTTPStatusCode == 0
}

// Redact replaces a *stripe.Error in err by a summary of its scalar fields. stripe.Error's own
// Error() is the JSON of the whole error, objects included: a card error embeds the
// PaymentIntent (its client_secret) and the payment method (card details), which must never
// reach a log line. Use it on any Stripe error kept as the cause of an answer.
func Redact(err error) error {
	var se *stripe.Error
	if !errors.As(err, &se) {
		return err
	}
	return fmt.Errorf("stripe error: status %d, type %q, code %q, decline_code %q, request_id %q: %s",
		se.HTTPStatusCode, se.Type, se.Code, se.DeclineCode, se.RequestID, se.Msg)
}

// LogAttr summarises a failed call for a log line, with the same fields as Redact.
func LogAttr(err error) slog.Attr {
	var se *stripe.Error
	if errors.As(err, &se) {
		return slog.Group("stripe_error", "status", se.HTTPStatusCode, "type", string(se.Type), "code", string(se.Code),
			"decline_code", string(se.DeclineCode), "request_id", se.RequestID, "message", se.Msg)
	}
	return slog.String("error", err.Error())
}

// APIError turns a failed call that says nothing final about the business object into the
// client's answer: 503 stripe_unavailable (repeat the same request) when Retryable, else 502
// stripe_error. what says what the call was for ("create the customer").
func APIError(err error, what string) error {
	cause := fmt.Errorf("%s: %w", what, Redact(err))
	if Retryable(err) {
		return apierr.Wrap(cause, apierr.CodeStripeUnavailable,
			"Stripe could not be reached to %s; repeat the same request", what)
	}
	return apierr.Wrap(cause, apierr.CodeStripeError, "Stripe refused to %s", what)
}
