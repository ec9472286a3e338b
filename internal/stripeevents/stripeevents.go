// Package stripeevents builds signed Stripe events of the pinned API version: the sample events
// of `billing trigger`, and the events the tests and benchmarks deliver. Objects have the shape
// of API version 2024-06-20.
package stripeevents

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// APIVersion is the version stamped on built events.
const APIVersion = "2024-06-20"

// Subscription is the part of a Stripe subscription the service reads.
type Subscription struct {
	ID                 string
	Customer           string
	Status             string
	PriceID            string
	CurrentPeriodStart time.Time
	CurrentPeriodEnd   time.Time
	TrialStart         time.Time
	TrialEnd           time.Time
	CancelAtPeriodEnd  bool
	CanceledAt         time.Time
	EndedAt            time.Time
	// Quantity is the item's seats; 1 when zero.
	Quantity int64
}

// Invoice is the part of a Stripe invoice the service reads.
type Invoice struct {
	ID                 string
	Customer           string
	CustomerEmail      string
	Subscription       string
	Status             string
	AttemptCount       int
	NextPaymentAttempt time.Time
	AmountDue          int64
	AmountPaid         int64
	Currency           string
	HostedInvoiceURL   string
}

func unixOrNil(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.Unix()
}

func (s Subscription) object(livemode bool) map[string]any {
	price := map[string]any{"id": s.PriceID, "object": "price", "currency": "usd", "unit_amount": 2000,
		"recurring": map[string]any{"interval": "month", "interval_count": 1}}
	return map[string]any{
		"id":                   s.ID,
		"object":               "subscription",
		"customer":             s.Customer,
		"status":               s.Status,
		"livemode":             livemode,
		"cancel_at_period_end": s.CancelAtPeriodEnd,
		"canceled_at":          unixOrNil(s.CanceledAt),
		"ended_at":             unixOrNil(s.EndedAt),
		"current_period_start": unixOrNil(s.CurrentPeriodStart),
		"current_period_end":   unixOrNil(s.CurrentPeriodEnd),
		"trial_start":          unixOrNil(s.TrialStart),
		"trial_end":            unixOrNil(s.TrialEnd),
		"currency":             "usd",
		"items": map[string]any{
			"object":   "list",
			"has_more": false,
			"data": []any{map[string]any{
				"id": "si_" + s.ID, "object": "subscription_item", "price": price, "quantity": max(s.Quantity, 1),
			}},
		},
		"plan":     map[string]any{"id": s.PriceID, "object": "plan"},
		"metadata": map[string]any{},
	}
}

func (inv Invoice) object(livemode bool) map[string]any {
	var sub any
	if inv.Subscription != "" {
		sub = inv.Subscription
	}
	return map[string]any{
		"id":                   inv.ID,
		"object":               "invoice",
		"customer":             inv.Customer,
		"customer_email":       inv.CustomerEmail,
		"subscription":         sub,
		"status":               inv.Status,
		"attempt_count":        inv.AttemptCount,
		"attempted":            inv.AttemptCount > 0,
		"next_payment_attempt": unixOrNil(inv.NextPaymentAttempt),
		"amount_due":           inv.AmountDue,
		"amount_paid":          inv.AmountPaid,
		"currency":             inv.Currency,
		"hosted_invoice_url":   inv.HostedInvoiceURL,
		"billing_reason":       "subscription_cycle",
		"livemode":             livemode,
		"paid":                 inv.Status == "paid",
	}
}

// Event returns the JSON of an event of type typ carrying object.
func Event(id, typ string, created time.Time, livemode bool, object map[string]any, previous map[string]any) []byte {
	return event(id, typ, APIVersion, created, livemode, object, previous)
}

func event(id, typ, apiVersion string, created time.Time, livemode bool, object map[string]any, previous map[string]any) []byte {
	data := map[string]any{"object": object}
	if previous != nil {
		data["previous_attributes"] = previous
	}
	ev := map[string]any{
		"id":               id,
		"object":           "event",
		"api_version":      apiVersion,
		"created":          created.Unix(),
		"type":             typ,
		"livemode":         livemode,
		"pending_webhooks": 1,
		"request":          map[string]any{"id": nil, "idempotency_key": nil},
		"data":             data,
	}
	b, err := json.Marshal(ev)
	if err != nil {
		panic(fmt.Sprintf("stripeevents: marshal event: %v", err))
	}
	return b
}

// EntitlementSummary is a customer's active entitlements as the summary event carries them.
type EntitlementSummary struct {
	Customer string
	// LookupKeys are the features' lookup keys (feature ids feat_<key>).
	LookupKeys []string
	// HasMore says the list goes on past these (Stripe's events carry a page of 10).
	HasMore bool
}

func (e EntitlementSummary) object(livemode bool) map[string]any {
	data := []any{}
	for i, k := range e.LookupKeys {
		data = append(data, map[string]any{
			"id": fmt.Sprintf("ent_%s_%d", strings.TrimPrefix(e.Customer, "cus_"), i), "object": "entitlements.active_entitlement",
			"feature": "feat_" + k, "livemode": livemode, "lookup_key": k,
		})
	}
	return map[string]any{
		"object": "entitlements.active_entitlement_summary", "customer": e.Customer, "livemode": livemode,
		"entitlements": map[string]any{"object": "list", "data": data, "has_more": e.HasMore,
			"url": "/v1/customer/" + e.Customer + "/entitlements"},
	}
}

// EntitlementSummaryEvent returns an entitlements.active_entitlement_summary.updated event.
func EntitlementSummaryEvent(id string, created time.Time, livemode bool, e EntitlementSummary) []byte {
	return Event(id, "entitlements.active_entitlement_summary.updated", created, livemode, e.object(livemode), nil)
}

// SubscriptionEvent returns a customer.subscription.* event.
func SubscriptionEvent(id, typ string, created time.Time, livemode bool, s Subscription) []byte {
	return Event(id, typ, created, livemode, s.object(livemode), nil)
}

// InvoiceEvent returns an invoice.* event.
func InvoiceEvent(id, typ string, created time.Time, livemode bool, inv Invoice) []byte {
	return Event(id, typ, created, livemode, inv.object(livemode), nil)
}

// SignatureHeader returns the Stripe-Signature header of payload signed with secret at t.
func SignatureHeader(payload []byte, secret string, t time.Time) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(ts))
	mac.Write([]byte("."))
	mac.Write(payload)
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac.Sum(nil))
}

// Sample returns a plausible event of typ for `billing trigger`, ids derived from suffix (the
// event's too).
func Sample(typ, suffix string, now time.Time, livemode bool) ([]byte, error) {
	return SampleWith(typ, SampleOptions{Suffix: suffix, Now: now, Livemode: livemode})
}

// SampleOptions shape a sample event. Empty fields take their defaults.
type SampleOptions struct {
	// Suffix names the objects: sub_<suffix>, cus_<suffix>, in_<suffix>; and the event,
	// evt_<suffix>, unless EventID is set.
	Suffix string
	// EventID, Customer, Subscription and Invoice replace the ids derived from Suffix.
	EventID, Customer, Subscription, Invoice string
	// Status is the subscription's status (customer.subscription.*) or the invoice's (invoice.*).
	Status string
	// APIVersion stamps the event (default the pinned one).
	APIVersion string
	// Quantity is the subscription's seats (customer.subscription.*; default 1).
	Quantity int64
	// Features are the lookup keys of entitlements.active_entitlement_summary.updated (default
	// one, "premium"); FeaturesHaveMore says Stripe has more than these.
	Features         []string
	FeaturesHaveMore bool
	Now              time.Time
	Livemode         bool
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// SampleWith is Sample with every id, the status and the API version open to choice, so that a
// whole lifecycle of one linked customer can be played by hand.
func SampleWith(typ string, o SampleOptions) ([]byte, error) {
	now := o.Now
	if now.IsZero() {
		now = time.Now()
	}
	subID := orDefault(o.Subscription, "sub_"+o.Suffix)
	cusID := orDefault(o.Customer, "cus_"+o.Suffix)
	invID := orDefault(o.Invoice, "in_"+o.Suffix)
	sub := Subscription{
		ID: subID, Customer: cusID, Status: "active", PriceID: "price_monthly",
		CurrentPeriodStart: now, CurrentPeriodEnd: now.AddDate(0, 1, 0), Quantity: o.Quantity,
	}
	inv := Invoice{
		ID: invID, Customer: cusID, Subscription: subID, Currency: "usd",
		AmountDue: 2000, HostedInvoiceURL: "https://invoice.stripe.com/i/acct_test/" + invID,
		CustomerEmail: "customer+" + o.Suffix + "@example.com",
	}
	id := orDefault(o.EventID, "evt_"+o.Suffix)
	var object map[string]any
	switch typ {
	case "customer.subscription.created":
		sub.Status = "trialing"
		sub.TrialStart, sub.TrialEnd = now, now.AddDate(0, 0, 14)
	case "customer.subscription.updated":
	case "customer.subscription.deleted":
		sub.Status, sub.CanceledAt, sub.EndedAt = "canceled", now, now
	case "customer.subscription.trial_will_end":
		sub.Status = "trialing"
		sub.TrialStart, sub.TrialEnd = now.AddDate(0, 0, -11), now.AddDate(0, 0, 3)
	case "invoice.payment_failed":
		inv.Status, inv.AttemptCount, inv.NextPaymentAttempt = "open", 1, now.AddDate(0, 0, 3)
	case "invoice.payment_succeeded", "invoice.paid":
		inv.Status, inv.AttemptCount, inv.AmountPaid = "paid", 1, inv.AmountDue
	case "customer.created", "customer.updated":
		object = map[string]any{"id": cusID, "object": "customer", "email": inv.CustomerEmail}
	case "entitlements.active_entitlement_summary.updated":
		keys := o.Features
		if len(keys) == 0 {
			keys = []string{"premium"}
		}
		object = EntitlementSummary{Customer: cusID, LookupKeys: keys, HasMore: o.FeaturesHaveMore}.object(o.Livemode)
	default:
		return nil, fmt.Errorf("no sample for event type %q (try customer.subscription.created|updated|deleted|trial_will_end, invoice.payment_succeeded|payment_failed, customer.created, entitlements.active_entitlement_summary.updated)", typ)
	}
	switch {
	case object != nil:
	case strings.HasPrefix(typ, "customer.subscription."):
		if o.Status != "" {
			sub.Status = o.Status
			if o.Status != "trialing" {
				sub.TrialStart, sub.TrialEnd = time.Time{}, time.Time{}
			}
		}
		object = sub.object(o.Livemode)
	default:
		if o.Status != "" {
			inv.Status = o.Status
		}
		object = inv.object(o.Livemode)
	}
	return event(id, typ, orDefault(o.APIVersion, APIVersion), now, o.Livemode, object, nil), nil
}
