package billing

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"
)

// Event objects are decoded into small structs of our own rather than stripe-go's types: real
// payloads span many API versions (plan instead of items, customer as id or expanded object,
// nulls everywhere), and a handler must take what it needs and ignore the rest without failing.

// expandableID is a Stripe reference that is either an id string or an expanded object with an
// "id" field; null and absent decode as "".
type expandableID string

func (e *expandableID) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	switch {
	case len(b) == 0 || bytes.Equal(b, []byte("null")):
		*e = ""
		return nil
	case b[0] == '"':
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*e = expandableID(s)
		return nil
	case b[0] == '{':
		var o struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(b, &o); err != nil {
			return err
		}
		*e = expandableID(o.ID)
		return nil
	}
	return fmt.Errorf("reference is neither an id nor an object: %.40s", b)
}

// unixTime is a Stripe timestamp (seconds since the epoch). It accepts null, integers, floats
// and numeric strings; Valid is false for null or absent.
type unixTime struct {
	Time  time.Time
	Valid bool
}

func (u *unixTime) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) == 0 || bytes.Equal(b, []byte("null")) {
		*u = unixTime{}
		return nil
	}
	s := string(b)
	if b[0] == '"' {
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		if s == "" {
			*u = unixTime{}
			return nil
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return fmt.Errorf("timestamp is not a number: %.40s", b)
	}
	if f < minUnixTime || f > maxUnixTime {
		return fmt.Errorf("timestamp out of range: %.40s", b)
	}
	*u = unixTime{Time: time.Unix(int64(f), 0).UTC(), Valid: true}
	return nil
}

// A timestamp must lie in the years 1 to 9999: what both PostgreSQL and JSON (the notice jobs'
// arguments) represent. Beyond, pgx would silently wrap the value or the database refuse it, and
// a retry cannot fix either.
const (
	minUnixTime = -62135596800 // 0001-01-01T00:00:00Z
	maxUnixTime = 253402300799 // 9999-12-31T23:59:59Z
)

// Ptr returns the time or nil, for nullable columns.
func (u unixTime) Ptr() *time.Time {
	if !u.Valid {
		return nil
	}
	t := u.Time
	return &t
}

// subscriptionObject is the part of a Stripe subscription the state machine keeps.
type subscriptionObject struct {
	ID                 string       `json:"id"`
	Customer           expandableID `json:"customer"`
	Status             string       `json:"status"`
	CancelAtPeriodEnd  *bool        `json:"cancel_at_period_end"`
	CancelAt           unixTime     `json:"cancel_at"`
	CanceledAt         unixTime     `json:"canceled_at"`
	EndedAt            unixTime     `json:"ended_at"`
	CurrentPeriodStart unixTime     `json:"current_period_start"`
	CurrentPeriodEnd   unixTime     `json:"current_period_end"`
	TrialStart         unixTime     `json:"trial_start"`
	TrialEnd           unixTime     `json:"trial_end"`
	Items              *struct {
		Data []subscriptionItem `json:"data"`
	} `json:"items"`
	// PauseCollection is set while collection is paused (the status does not change).
	PauseCollection *struct {
		Behavior  string   `json:"behavior"`
		ResumesAt unixTime `json:"resumes_at"`
	} `json:"pause_collection"`
	// Plan is the pre-2018 single-plan shape (still sent alongside items by older versions).
	Plan *struct {
		ID string `json:"id"`
	} `json:"plan"`
}

type subscriptionItem struct {
	Price priceRef `json:"price"`
	Plan  priceRef `json:"plan"`
	// Quantity is absent on metered items.
	Quantity *int64 `json:"quantity"`
	// API versions from 2025-03-31 carry the billing period on the items only.
	CurrentPeriodStart unixTime `json:"current_period_start"`
	CurrentPeriodEnd   unixTime `json:"current_period_end"`
}

// priceRef is an item's price (or legacy plan): its id, or the expanded object with its usage
// type; null and absent decode as empty.
type priceRef struct {
	ID string
	// Metered: the price bills usage (recurring.usage_type, or the plan's usage_type, "metered").
	Metered bool
}

func (p *priceRef) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '{' {
		var o struct {
			ID        string `json:"id"`
			UsageType string `json:"usage_type"`
			Recurring *struct {
				UsageType string `json:"usage_type"`
			} `json:"recurring"`
		}
		if err := json.Unmarshal(b, &o); err != nil {
			return err
		}
		*p = priceRef{ID: o.ID, Metered: o.UsageType == "metered" || (o.Recurring != nil && o.Recurring.UsageType == "metered")}
		return nil
	}
	var id expandableID
	if err := id.UnmarshalJSON(b); err != nil {
		return err
	}
	*p = priceRef{ID: string(id)}
	return nil
}

// metered reports whether the item bills usage rather than seats.
func (it *subscriptionItem) metered() bool { return it.Price.Metered || it.Plan.Metered }

// Quantity is the seats of the subscription: the quantity of its first licensed (not metered)
// item, nil when it has none or Stripe sent no quantity.
func (s *subscriptionObject) Quantity() *int64 {
	if s.Items == nil {
		return nil
	}
	for i := range s.Items.Data {
		if it := &s.Items.Data[i]; !it.metered() && it.Quantity != nil {
			q := *it.Quantity
			return &q
		}
	}
	return nil
}

// PriceID is the price of the first item, falling back to the legacy plan.
func (s *subscriptionObject) PriceID() string {
	if s.Items != nil {
		for _, it := range s.Items.Data {
			if it.Price.ID != "" {
				return it.Price.ID
			}
			if it.Plan.ID != "" {
				return it.Plan.ID
			}
		}
	}
	if s.Plan != nil {
		return s.Plan.ID
	}
	return ""
}

// Period is the current billing period, from the subscription or else from its first item.
func (s *subscriptionObject) Period() (start, end unixTime) {
	start, end = s.CurrentPeriodStart, s.CurrentPeriodEnd
	if s.Items != nil && len(s.Items.Data) > 0 {
		if !start.Valid {
			start = s.Items.Data[0].CurrentPeriodStart
		}
		if !end.Valid {
			end = s.Items.Data[0].CurrentPeriodEnd
		}
	}
	return start, end
}

// invoiceObject is the part of a Stripe invoice a payment hold needs.
type invoiceObject struct {
	ID                 string       `json:"id"`
	Customer           expandableID `json:"customer"`
	CustomerEmail      *string      `json:"customer_email"`
	Subscription       expandableID `json:"subscription"`
	AttemptCount       *int64       `json:"attempt_count"`
	NextPaymentAttempt unixTime     `json:"next_payment_attempt"`
	AmountDue          *int64       `json:"amount_due"`
	Currency           *string      `json:"currency"`
	HostedInvoiceURL   *string      `json:"hosted_invoice_url"`
	// Created is the invoice's own creation time: a payment lifts a hold only when its invoice
	// is the held one or newer, and the invoice list is ordered by it.
	Created       unixTime `json:"created"`
	Status        *string  `json:"status"`
	Number        *string  `json:"number"`
	BillingReason *string  `json:"billing_reason"`
	AmountPaid    *int64   `json:"amount_paid"`
	PeriodStart   unixTime `json:"period_start"`
	PeriodEnd     unixTime `json:"period_end"`
	InvoicePDF    *string  `json:"invoice_pdf"`
	// From API 2025-03-31 the subscription moved to parent.subscription_details.
	Parent *struct {
		SubscriptionDetails *struct {
			Subscription expandableID `json:"subscription"`
		} `json:"subscription_details"`
	} `json:"parent"`
}

// SubscriptionID is the invoice's subscription, or "" for a one-off invoice.
func (i *invoiceObject) SubscriptionID() string {
	if i.Subscription != "" {
		return string(i.Subscription)
	}
	if i.Parent != nil && i.Parent.SubscriptionDetails != nil {
		return string(i.Parent.SubscriptionDetails.Subscription)
	}
	return ""
}

var errNotAnObject = errors.New("data.object is not a JSON object")

// ExpandableID is a Stripe reference as an id or an expanded object, for the other packages that
// decode event objects the same way (entitlements).
type ExpandableID = expandableID

// DecodeObject is decodeObject, for the other packages that decode event objects.
func DecodeObject(raw json.RawMessage, v any) error { return decodeObject(raw, v) }

// decodeObject decodes data.object leniently: unknown fields are ignored, but a payload that is
// not an object at all is malformed.
func decodeObject(raw json.RawMessage, v any) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '{' {
		return errNotAnObject
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("decode data.object: %w", err)
	}
	return nil
}

func decodeSubscription(raw json.RawMessage) (*subscriptionObject, error) {
	var s subscriptionObject
	if err := decodeObject(raw, &s); err != nil {
		return nil, err
	}
	switch {
	case s.ID == "":
		return nil, errors.New("subscription has no id")
	case s.Customer == "":
		return nil, fmt.Errorf("subscription %s has no customer", s.ID)
	case s.Status == "":
		return nil, fmt.Errorf("subscription %s has no status", s.ID)
	}
	return &s, nil
}

func decodeInvoice(raw json.RawMessage) (*invoiceObject, error) {
	var i invoiceObject
	if err := decodeObject(raw, &i); err != nil {
		return nil, err
	}
	if i.ID == "" {
		return nil, errors.New("invoice has no id")
	}
	if i.AttemptCount != nil && (*i.AttemptCount < math.MinInt32 || *i.AttemptCount > math.MaxInt32) {
		// subscriptions.attempt_count is an integer column.
		return nil, fmt.Errorf("invoice %s: attempt_count %d out of range", i.ID, *i.AttemptCount)
	}
	return &i, nil
}
