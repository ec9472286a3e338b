// Package billingtest builds the Stripe events that billing's handlers take, for the tests of
// billing and of the packages built on it (entitlements): a subscription or an invoice described
// by its fields, times counted from testenv.Base. No program links it.
package billingtest

import (
	"encoding/json"

	"github.com/stripe/stripe-go/v79"

	"billing/internal/testenv"
	"billing/webhooks"
)

// Sub describes a subscription snapshot; zero fields are left out of the JSON (or null).
type Sub struct {
	ID, Customer, Status, Price string
	PeriodStart, PeriodEnd      int64 // offsets from testenv.Base; 0 = absent
	TrialStart, TrialEnd        int64
	CanceledAt, EndedAt         int64
	CancelAtPeriodEnd           bool
	// Quantity is the item's seats; 0 leaves it out.
	Quantity int64
}

// JSON is the subscription object of the event.
func (s Sub) JSON() json.RawMessage {
	ts := func(off int64) any {
		if off == 0 {
			return nil
		}
		return testenv.Base + off
	}
	items := map[string]any{"object": "list", "data": []any{}}
	if s.Price != "" {
		item := map[string]any{
			"id": "si_" + s.ID, "object": "subscription_item",
			"price": map[string]any{"id": s.Price, "object": "price"},
			"plan":  map[string]any{"id": s.Price, "object": "plan"},
		}
		if s.Quantity != 0 {
			item["quantity"] = s.Quantity
		}
		items["data"] = []any{item}
	}
	m := map[string]any{
		"id": s.ID, "object": "subscription", "customer": s.Customer, "status": s.Status,
		"cancel_at_period_end": s.CancelAtPeriodEnd, "cancel_at": nil,
		"current_period_start": ts(s.PeriodStart), "current_period_end": ts(s.PeriodEnd),
		"trial_start": ts(s.TrialStart), "trial_end": ts(s.TrialEnd),
		"canceled_at": ts(s.CanceledAt), "ended_at": ts(s.EndedAt),
		"items": items, "livemode": false,
	}
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}

// Invoice describes an invoice; Subscription "" makes a one-off invoice.
type Invoice struct {
	ID, Customer, Subscription, Email, Currency, URL string
	AttemptCount, AmountDue                          int64
	NextAttempt                                      int64 // offset from testenv.Base; 0 = null
	// Left out of the JSON when zero.
	Created, PeriodStart, PeriodEnd    int64 // offsets from testenv.Base
	BillingReason, Status, Number, PDF string
	AmountPaid                         int64
}

// JSON is the invoice object of the event.
func (i Invoice) JSON() json.RawMessage {
	m := map[string]any{
		"id": i.ID, "object": "invoice", "customer": i.Customer,
		"attempt_count": i.AttemptCount, "amount_due": i.AmountDue,
		"currency": i.Currency, "hosted_invoice_url": i.URL, "next_payment_attempt": nil,
		"customer_email": nil, "subscription": nil,
	}
	if i.Subscription != "" {
		m["subscription"] = i.Subscription
	}
	if i.Email != "" {
		m["customer_email"] = i.Email
	}
	if i.NextAttempt != 0 {
		m["next_payment_attempt"] = testenv.Base + i.NextAttempt
	}
	for k, off := range map[string]int64{"created": i.Created, "period_start": i.PeriodStart, "period_end": i.PeriodEnd} {
		if off != 0 {
			m[k] = testenv.Base + off
		}
	}
	for k, v := range map[string]string{"billing_reason": i.BillingReason, "status": i.Status, "number": i.Number, "invoice_pdf": i.PDF} {
		if v != "" {
			m[k] = v
		}
	}
	if i.AmountPaid != 0 {
		m["amount_paid"] = i.AmountPaid
	}
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}

// Event wraps an object into a webhooks.Event created at testenv.Base+created seconds.
func Event(id, typ string, created int64, obj json.RawMessage) webhooks.Event {
	payload, _ := json.Marshal(map[string]any{
		"id": id, "object": "event", "type": typ, "api_version": webhooks.PinnedAPIVersion,
		"created": testenv.Base + created, "livemode": false, "data": map[string]any{"object": obj},
	})
	return webhooks.Event{
		ID: id, Type: typ, Livemode: false, APIVersion: webhooks.PinnedAPIVersion,
		Created: testenv.At(created), Payload: payload, Object: obj,
	}
}

// SubEvent is an event of type typ carrying s.
func SubEvent(id, typ string, created int64, s Sub) webhooks.Event {
	return Event(id, typ, created, s.JSON())
}

// InvoiceEvent is an event of type typ carrying i.
func InvoiceEvent(id, typ string, created int64, i Invoice) webhooks.Event {
	return Event(id, typ, created, i.JSON())
}

// Shorthands for the common cases.

// Created is a customer.subscription.created of s.
func Created(id string, t int64, s Sub) webhooks.Event {
	return SubEvent(id, string(stripe.EventTypeCustomerSubscriptionCreated), t, s)
}

// Updated is a customer.subscription.updated of s.
func Updated(id string, t int64, s Sub) webhooks.Event {
	return SubEvent(id, string(stripe.EventTypeCustomerSubscriptionUpdated), t, s)
}

// Deleted is a customer.subscription.deleted of s.
func Deleted(id string, t int64, s Sub) webhooks.Event {
	return SubEvent(id, string(stripe.EventTypeCustomerSubscriptionDeleted), t, s)
}

// Failed is an invoice.payment_failed of i.
func Failed(id string, t int64, i Invoice) webhooks.Event {
	return InvoiceEvent(id, string(stripe.EventTypeInvoicePaymentFailed), t, i)
}

// Succeeded is an invoice.payment_succeeded of i.
func Succeeded(id string, t int64, i Invoice) webhooks.Event {
	return InvoiceEvent(id, string(stripe.EventTypeInvoicePaymentSucceeded), t, i)
}

// With is s in another status.
func (s Sub) With(status string) Sub { s.Status = status; return s }
