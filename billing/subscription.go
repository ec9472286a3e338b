package billing

import (
	"time"
)

// Stripe subscription statuses. Status is stored as Stripe's text; a status not listed here (a
// future one) is kept as it comes, is never entitled and never on hold.
const (
	StatusIncomplete        = "incomplete"
	StatusIncompleteExpired = "incomplete_expired"
	StatusTrialing          = "trialing"
	StatusActive            = "active"
	StatusPastDue           = "past_due"
	StatusCanceled          = "canceled"
	StatusUnpaid            = "unpaid"
	StatusPaused            = "paused"

	// StatusNone is the entitlement status of a known user without any subscription.
	StatusNone = "none"
)

// Hold reasons.
const (
	HoldPaymentFailed = "payment_failed"
	HoldPastDue       = "past_due"
	HoldUnpaid        = "unpaid"
	// HoldAuthenticationRequired: the payment waits for the customer to authenticate it
	// (invoice.payment_action_required).
	HoldAuthenticationRequired = "authentication_required"
)

// IsTerminal reports whether a status is final: Stripe never moves a subscription out of it, so
// no event, older or newer, may either.
func IsTerminal(status string) bool {
	return status == StatusCanceled || status == StatusIncompleteExpired
}

// statusTieRank orders statuses along Stripe's lifecycle. It breaks ties between subscription
// events created in the same second (Stripe's clock has one-second precision): the later stage
// of the lifecycle wins, e.g. incomplete→active at creation or active→past_due at renewal, and
// terminal states beat everything. Unknown statuses rank lowest.
func statusTieRank(status string) int {
	switch status {
	case StatusIncomplete:
		return 1
	case StatusTrialing:
		return 2
	case StatusActive:
		return 3
	case StatusPastDue:
		return 4
	case StatusUnpaid:
		return 5
	case StatusPaused:
		return 6
	case StatusCanceled, StatusIncompleteExpired:
		return 9
	}
	return 0
}

// Subscription is one subscription as stored locally (both column groups).
type Subscription struct {
	SubscriptionID     string     `gorm:"column:subscription_id"`
	StripeCustomerID   string     `gorm:"column:stripe_customer_id"`
	Livemode           bool       `gorm:"column:livemode"`
	Status             string     `gorm:"column:status"`
	PriceID            *string    `gorm:"column:price_id"`
	CurrentPeriodStart *time.Time `gorm:"column:current_period_start"`
	CurrentPeriodEnd   *time.Time `gorm:"column:current_period_end"`
	CancelAtPeriodEnd  bool       `gorm:"column:cancel_at_period_end"`
	CancelAt           *time.Time `gorm:"column:cancel_at"`
	CanceledAt         *time.Time `gorm:"column:canceled_at"`
	EndedAt            *time.Time `gorm:"column:ended_at"`
	TrialStart         *time.Time `gorm:"column:trial_start"`
	TrialEnd           *time.Time `gorm:"column:trial_end"`
	StatusSince        *time.Time `gorm:"column:status_since"`
	SubEventID         *string    `gorm:"column:sub_event_id"`
	SubEventCreated    *time.Time `gorm:"column:sub_event_created"`
	TrialWillEndAt     *time.Time `gorm:"column:trial_will_end_at"`

	PaymentHold        bool       `gorm:"column:payment_hold"`
	PaymentHoldSince   *time.Time `gorm:"column:payment_hold_since"`
	LatestInvoiceID    *string    `gorm:"column:latest_invoice_id"`
	AttemptCount       *int64     `gorm:"column:attempt_count"`
	NextPaymentAttempt *time.Time `gorm:"column:next_payment_attempt"`
	AmountDue          *int64     `gorm:"column:amount_due"`
	Currency           *string    `gorm:"column:currency"`
	HostedInvoiceURL   *string    `gorm:"column:hosted_invoice_url"`
	InvEventCreated    *time.Time `gorm:"column:inv_event_created"`
	// PaymentHoldBillingReason is the billing_reason of the invoice the hold is about.
	PaymentHoldBillingReason *string `gorm:"column:payment_hold_billing_reason"`
	// PaymentHoldKind is the hold's reason: payment_failed or authentication_required.
	PaymentHoldKind *string `gorm:"column:payment_hold_kind"`
	// Collection paused (pause_collection) while the status stays as it is; nil when not.
	PauseCollectionBehavior  *string    `gorm:"column:pause_collection_behavior"`
	PauseCollectionResumesAt *time.Time `gorm:"column:pause_collection_resumes_at"`
	// Quantity is the seats: the quantity of the licensed item (nil until Stripe said).
	Quantity *int64 `gorm:"column:quantity"`

	// UserID is joined from customers at read time; nil while the customer is not linked.
	UserID *string `gorm:"column:user_id"`
}

// paymentHoldInForce reports whether the invoice-driven hold still holds. A payment hold is lifted
// by a newer invoice.payment_succeeded (written by the invoice guard), and also, at read time, by a
// subscription snapshot that is strictly newer than the last invoice event and says the
// subscription is in good standing again (active/trialing): Stripe does that when the failed
// invoice is voided or paid out of band, cases that send no payment_succeeded. Computing it here
// keeps subscription events from ever writing the hold columns.
func (s *Subscription) paymentHoldInForce() bool {
	if !s.PaymentHold {
		return false
	}
	if s.PaymentHoldBillingReason != nil && neverStarted(s.Status, *s.PaymentHoldBillingReason) {
		return false
	}
	if (s.Status == StatusActive || s.Status == StatusTrialing) &&
		s.SubEventCreated != nil && s.InvEventCreated != nil && s.SubEventCreated.After(*s.InvEventCreated) {
		return false
	}
	return true
}

// CollectionPaused reports whether collection is paused at now: pause_collection is set and its
// resumes_at, if any, is still ahead.
func (s *Subscription) CollectionPaused(now time.Time) bool {
	return s.PauseCollectionBehavior != nil &&
		(s.PauseCollectionResumesAt == nil || now.Before(*s.PauseCollectionResumesAt))
}

// neverStarted reports whether an invoice is the first one of a subscription that never started
// (Checkout abandoned or its payment refused): nothing was granted, so nothing is held.
func neverStarted(status, billingReason string) bool {
	return billingReason == "subscription_create" &&
		(status == StatusIncomplete || status == StatusIncompleteExpired)
}

// Hold is the subscription's hold now: its reason and since when, ok false when none. A terminal
// subscription is never on hold (nothing is left to pay for). Precedence of reasons when several
// apply: unpaid (Stripe gave up retrying) > payment_failed (carries the invoice details) > past_due.
// Since is the earliest start among the applicable causes.
func (s *Subscription) Hold() (reason string, since *time.Time, ok bool) {
	if IsTerminal(s.Status) {
		return "", nil, false
	}
	payment := s.paymentHoldInForce()
	statusHold := s.Status == StatusPastDue || s.Status == StatusUnpaid
	switch {
	case s.Status == StatusUnpaid:
		reason = HoldUnpaid
	case payment && s.PaymentHoldKind != nil && *s.PaymentHoldKind == HoldAuthenticationRequired:
		reason = HoldAuthenticationRequired
	case payment:
		reason = HoldPaymentFailed
	case statusHold:
		reason = HoldPastDue
	default:
		return "", nil, false
	}
	if payment {
		since = s.PaymentHoldSince
	}
	if statusHold && s.StatusSince != nil && (since == nil || s.StatusSince.Before(*since)) {
		since = s.StatusSince
	}
	return reason, since, true
}

// RenewalDue is when Stripe must renew an active or trialing subscription for it to stay
// entitled: the trial's end while trialing, else the current period's end. Nil for other
// statuses (past_due is already waiting on Stripe's retries), or when the end is unknown.
func (s *Subscription) RenewalDue() *time.Time {
	switch s.Status {
	case StatusTrialing:
		if s.TrialEnd != nil {
			return s.TrialEnd
		}
		return s.CurrentPeriodEnd
	case StatusActive:
		return s.CurrentPeriodEnd
	}
	return nil
}
