// Package apierr is the service's one error type for HTTP answers: a stable snake_case code, a
// human message, and the internal cause (logged, never returned). One map turns codes into HTTP
// statuses, so a handler says what went wrong and never picks a status itself.
package apierr

import (
	"errors"
	"fmt"
	"net/http"
)

// Code is a stable, machine-readable error code: part of the outside contract once published.
type Code string

const (
	// Generic.
	CodeInvalidRequest   Code = "invalid_request"
	CodeInvalidJSON      Code = "invalid_json"
	CodeNotFound         Code = "not_found"
	CodeRouteNotFound    Code = "route_not_found"
	CodeMethodNotAllowed Code = "method_not_allowed"
	CodeUnauthorized     Code = "unauthorized"
	CodeForbidden        Code = "forbidden"
	CodeConflict         Code = "conflict"
	CodeBodyTooLarge     Code = "body_too_large"
	CodeUnsupportedMedia Code = "unsupported_media_type"
	CodeInternal         Code = "internal_error"
	CodeUnavailable      Code = "service_unavailable"
	CodeDatabaseDown     Code = "database_unavailable"
	// Too many requests are calling Stripe at once: retry after the Retry-After header.
	CodeBusy Code = "busy"

	// Validation of identifiers and amounts.
	CodeInvalidUserID   Code = "invalid_user_id"
	CodeInvalidOrderID  Code = "invalid_order_id"
	CodeInvalidRefundID Code = "invalid_refund_id"
	CodeInvalidAmount   Code = "invalid_amount"
	CodeInvalidCurrency Code = "invalid_currency"
	CodeInvalidEmail    Code = "invalid_email"
	CodeInvalidURL      Code = "invalid_url"

	// Webhook endpoint.
	CodeMissingSignature   Code = "missing_signature"
	CodeMalformedSignature Code = "malformed_signature"
	CodeInvalidSignature   Code = "invalid_signature"
	CodeStaleTimestamp     Code = "timestamp_outside_tolerance"
	CodeNotAnEvent         Code = "invalid_event"
	// A body whose objects repeat a key, exactly or in another case: readers disagree on it.
	CodeAmbiguousJSON Code = "ambiguous_json"
	// A verified event whose livemode is not the mode of the secret that signed it.
	CodeLivemodeMismatch Code = "livemode_mismatch"
	// A verified event whose id is stored, in its mode, with another type: not a redelivery.
	CodeEventIDConflict Code = "event_id_conflict"

	// Money.
	CodeIdempotencyConflict   Code = "idempotency_conflict"
	CodeCardDeclined          Code = "card_declined"
	CodeAuthenticationRequire Code = "authentication_required"
	CodeRefundExceedsCharge   Code = "refund_exceeds_charge"
	CodeChargeNotRefundable   Code = "charge_not_refundable"
	CodeNoCustomer            Code = "customer_not_found"
	CodeStripeError           Code = "stripe_error"
	CodeStripeUnavailable     Code = "stripe_unavailable"

	// Subscriptions and events.
	CodeAlreadyCanceled Code = "subscription_already_canceled"
	CodeEventProcessed  Code = "event_already_processed"
	CodeEventNotFailed  Code = "event_not_failed"
	// An admin action named an event id that is stored in both modes without saying which.
	CodeAmbiguousEvent Code = "ambiguous_event_id"
	// A reconcile run of the mode is going; one runs at a time.
	CodeReconcileRunning Code = "reconcile_running"

	// Customers, ledger and portal.
	CodeInvalidName           Code = "invalid_name"
	CodeInvalidDescription    Code = "invalid_description"
	CodeInvalidRefundReason   Code = "invalid_refund_reason"
	CodeInvalidSubscriptionID Code = "invalid_subscription_id"
	// Stripe refused a charge or refund for a reason other than the card (e.g. amount below
	// Stripe's minimum): final for that order/refund id, so not a 5xx that invites retries.
	CodeChargeFailed Code = "charge_failed"
	CodeRefundFailed Code = "refund_failed"

	// A request of this service's mode (stripe.mode) reached state of the other mode: a user
	// linked to a test customer while the service runs live, or the reverse. Test and live never mix.
	CodeLivemodeConflict Code = "livemode_conflict"

	// Checkout, plan changes and links to existing Stripe customers.
	CodeInvalidRequestID           Code = "invalid_request_id"
	CodeInvalidPriceID             Code = "invalid_price_id"
	CodeInvalidQuantity            Code = "invalid_quantity"
	CodeInvalidTrialPeriodDays     Code = "invalid_trial_period_days"
	CodeInvalidCustomerID          Code = "invalid_customer_id"
	CodeAlreadySubscribed          Code = "already_subscribed"
	CodeCustomerBelongsToOtherUser Code = "customer_belongs_to_other_user"
	// Stripe refused to open the session (an unknown price): final for that request_id.
	CodeCheckoutFailed Code = "checkout_failed"

	// A feature's lookup key that no feature can have (empty, too long, control characters).
	CodeInvalidLookupKey Code = "invalid_lookup_key"
	// Usage records (meter events).
	CodeInvalidUsageID Code = "invalid_usage_id"
	CodeInvalidMeter   Code = "invalid_meter"
	CodeInvalidValue   Code = "invalid_value"
	// A timestamp Stripe would refuse: older than 35 days or more than 5 minutes ahead.
	CodeInvalidTimestamp Code = "invalid_timestamp"

	// The app events feed's after names no event of the deployment's mode.
	CodeUnknownAppEvent Code = "unknown_app_event"

	// The catalog: a lookup key or price that names no price the app may sell now, a promotion
	// code that Stripe would refuse, a plan change that cannot be previewed.
	CodeUnknownPrice         Code = "unknown_price"
	CodeInactivePrice        Code = "inactive_price"
	CodeInvalidPromotionCode Code = "invalid_promotion_code"
	CodeInvalidActive        Code = "invalid_active"
)

var statuses = map[Code]int{
	CodeInvalidRequest:        http.StatusBadRequest,
	CodeInvalidJSON:           http.StatusBadRequest,
	CodeNotFound:              http.StatusNotFound,
	CodeRouteNotFound:         http.StatusNotFound,
	CodeMethodNotAllowed:      http.StatusMethodNotAllowed,
	CodeUnauthorized:          http.StatusUnauthorized,
	CodeForbidden:             http.StatusForbidden,
	CodeConflict:              http.StatusConflict,
	CodeBodyTooLarge:          http.StatusRequestEntityTooLarge,
	CodeUnsupportedMedia:      http.StatusUnsupportedMediaType,
	CodeInternal:              http.StatusInternalServerError,
	CodeUnavailable:           http.StatusServiceUnavailable,
	CodeDatabaseDown:          http.StatusServiceUnavailable,
	CodeBusy:                  http.StatusServiceUnavailable,
	CodeInvalidUserID:         http.StatusBadRequest,
	CodeInvalidOrderID:        http.StatusBadRequest,
	CodeInvalidRefundID:       http.StatusBadRequest,
	CodeInvalidAmount:         http.StatusBadRequest,
	CodeInvalidCurrency:       http.StatusBadRequest,
	CodeInvalidEmail:          http.StatusBadRequest,
	CodeInvalidURL:            http.StatusBadRequest,
	CodeMissingSignature:      http.StatusBadRequest,
	CodeMalformedSignature:    http.StatusBadRequest,
	CodeInvalidSignature:      http.StatusBadRequest,
	CodeStaleTimestamp:        http.StatusBadRequest,
	CodeNotAnEvent:            http.StatusBadRequest,
	CodeAmbiguousJSON:         http.StatusBadRequest,
	CodeLivemodeMismatch:      http.StatusBadRequest,
	CodeEventIDConflict:       http.StatusConflict,
	CodeAmbiguousEvent:        http.StatusConflict,
	CodeIdempotencyConflict:   http.StatusConflict,
	CodeCardDeclined:          http.StatusPaymentRequired,
	CodeAuthenticationRequire: http.StatusPaymentRequired,
	CodeRefundExceedsCharge:   http.StatusUnprocessableEntity,
	CodeChargeNotRefundable:   http.StatusConflict,
	CodeNoCustomer:            http.StatusNotFound,
	CodeStripeError:           http.StatusBadGateway,
	CodeStripeUnavailable:     http.StatusServiceUnavailable,
	CodeAlreadyCanceled:       http.StatusConflict,
	CodeEventProcessed:        http.StatusConflict,
	CodeEventNotFailed:        http.StatusConflict,
	CodeReconcileRunning:      http.StatusConflict,
	CodeInvalidName:           http.StatusBadRequest,
	CodeInvalidDescription:    http.StatusBadRequest,
	CodeInvalidRefundReason:   http.StatusBadRequest,
	CodeInvalidSubscriptionID: http.StatusBadRequest,
	CodeChargeFailed:          http.StatusUnprocessableEntity,
	CodeRefundFailed:          http.StatusUnprocessableEntity,
	CodeLivemodeConflict:      http.StatusConflict,

	CodeInvalidRequestID:           http.StatusBadRequest,
	CodeInvalidPriceID:             http.StatusBadRequest,
	CodeInvalidQuantity:            http.StatusBadRequest,
	CodeInvalidTrialPeriodDays:     http.StatusBadRequest,
	CodeInvalidCustomerID:          http.StatusBadRequest,
	CodeAlreadySubscribed:          http.StatusConflict,
	CodeCustomerBelongsToOtherUser: http.StatusConflict,
	CodeCheckoutFailed:             http.StatusUnprocessableEntity,

	CodeInvalidLookupKey: http.StatusBadRequest,
	CodeInvalidUsageID:   http.StatusBadRequest,
	CodeInvalidMeter:     http.StatusBadRequest,
	CodeInvalidValue:     http.StatusBadRequest,
	CodeInvalidTimestamp: http.StatusUnprocessableEntity,
	CodeUnknownAppEvent:  http.StatusBadRequest,

	CodeUnknownPrice:         http.StatusUnprocessableEntity,
	CodeInactivePrice:        http.StatusUnprocessableEntity,
	CodeInvalidPromotionCode: http.StatusUnprocessableEntity,
	CodeInvalidActive:        http.StatusBadRequest,
}

// Status is the HTTP status of a code; an unknown code is a 500 so that a forgotten entry is loud.
func Status(c Code) int {
	if s, ok := statuses[c]; ok {
		return s
	}
	return http.StatusInternalServerError
}

// Error is an error meant for an HTTP client. Err, the cause, is for logs only.
type Error struct {
	Code    Code
	Message string
	// Details are extra JSON fields of the error object (e.g. decline_code, payment_intent_id).
	Details map[string]any
	Err     error
}

func (e *Error) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("%s: %s: %v", e.Code, e.Message, e.Err)
	}
	return fmt.Sprintf("%s: %s", e.Code, e.Message)
}

func (e *Error) Unwrap() error { return e.Err }

// Status is the HTTP status of the error's code.
func (e *Error) Status() int { return Status(e.Code) }

// New returns an error with a code and a message for the client.
func New(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Wrap returns an error with a code and message for the client that keeps err as its cause.
func Wrap(err error, code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...), Err: err}
}

// With adds a detail field and returns the error, for chaining.
func (e *Error) With(key string, value any) *Error {
	if e.Details == nil {
		e.Details = map[string]any{}
	}
	e.Details[key] = value
	return e
}

// Internal wraps an unexpected error: the client learns only that something failed.
func Internal(err error) *Error {
	return &Error{Code: CodeInternal, Message: "internal error", Err: err}
}

// As finds an *Error in err's chain.
func As(err error) (*Error, bool) {
	var e *Error
	if errors.As(err, &e) {
		return e, true
	}
	return nil, false
}

// Body is the JSON shape of every error answer: {"error": {"code": …, "message": …, …details}}.
func (e *Error) Body() map[string]any {
	inner := map[string]any{"code": e.Code, "message": e.Message}
	for k, v := range e.Details {
		if k != "code" && k != "message" {
			inner[k] = v
		}
	}
	return map[string]any{"error": inner}
}
