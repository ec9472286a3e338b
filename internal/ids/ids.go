// Package ids validates the identifiers the app backend gives us: user, order, refund and
// subscription ids. They become parts of URLs, Stripe search queries and idempotency keys
// (customer-{user_id}, charge-{order_id}), so one shape is allowed everywhere.
package ids

import (
	"regexp"

	"billing/internal/apierr"
)

var pattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,100}$`)

// Valid reports whether s has the shape of an identifier of the API ([A-Za-z0-9_-]{1,100}).
func Valid(s string) bool { return pattern.MatchString(s) }

// Check returns a 400 with code unless value is a valid identifier; field names it in the message.
func Check(value, field string, code apierr.Code) error {
	if !Valid(value) {
		return apierr.New(code, "%s must be 1 to 100 characters of A-Z, a-z, 0-9, _ and -", field)
	}
	return nil
}

// CheckUser returns a 400 invalid_user_id unless id is a valid user id.
func CheckUser(id string) error { return Check(id, "user_id", apierr.CodeInvalidUserID) }

// CheckSubscription returns a 400 invalid_subscription_id unless id is a valid subscription id.
func CheckSubscription(id string) error {
	return Check(id, "subscription_id", apierr.CodeInvalidSubscriptionID)
}
