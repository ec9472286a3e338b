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

// CheckoutSession is the part of a Checkout Session the service reads.
type CheckoutSession struct {
	ID                string
	Customer          string
	Subscription      string // "" while there is none (open or expired sessions)
	ClientReferenceID string
	Status            string // open, complete, expired
	PaymentStatus     string // paid, unpaid, no_payment_required
	URL               string // "" once the session is complete or expired (Stripe sends null)
	Metadata          map[string]string
	Created           time.Time
	ExpiresAt         time.Time
	AmountTotal       int64
	Currency          string
}

func nullIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func metadata(m map[string]string) map[string]any {
	out := map[string]any{}
	for k, v := range m {
		out[k] = v
	}
	return out
}

func (cs CheckoutSession) object(livemode bool) map[string]any {
	return map[string]any{
		"id":                  cs.ID,
		"object":              "checkout.session",
		"mode":                "subscription",
		"status":              cs.Status,
		"payment_status":      cs.PaymentStatus,
		"client_reference_id": nullIfEmpty(cs.ClientReferenceID),
		"customer":            nullIfEmpty(cs.Customer),
		"subscription":        nullIfEmpty(cs.Subscription),
		"url":                 nullIfEmpty(cs.URL),
		"metadata":            metadata(cs.Metadata),
		"created":             cs.Created.Unix(),
		"expires_at":          cs.ExpiresAt.Unix(),
		"amount_total":        cs.AmountTotal,
		"currency":            cs.Currency,
		"livemode":            livemode,
	}
}

// PaymentIntent is the part of a PaymentIntent the service reads.
type PaymentIntent struct {
	ID           string
	Customer     string
	Status       string
	Amount       int64
	Currency     string
	Metadata     map[string]string
	LatestCharge string
	// ErrorCode and DeclineCode make last_payment_error (null when both are empty).
	ErrorCode, DeclineCode string
	Created                time.Time
}

func (pi PaymentIntent) object(livemode bool) map[string]any {
	var lastErr any
	if pi.ErrorCode != "" || pi.DeclineCode != "" {
		lastErr = map[string]any{"type": "card_error", "code": nullIfEmpty(pi.ErrorCode),
			"decline_code": nullIfEmpty(pi.DeclineCode), "message": "Your card was declined."}
	}
	var canceledAt any
	if pi.Status == "canceled" {
		canceledAt = pi.Created.Unix()
	}
	var received int64
	if pi.Status == "succeeded" {
		received = pi.Amount
	}
	return map[string]any{
		"id":                 pi.ID,
		"object":             "payment_intent",
		"status":             pi.Status,
		"customer":           nullIfEmpty(pi.Customer),
		"amount":             pi.Amount,
		"amount_received":    received,
		"currency":           pi.Currency,
		"metadata":           metadata(pi.Metadata),
		"latest_charge":      nullIfEmpty(pi.LatestCharge),
		"last_payment_error": lastErr,
		"canceled_at":        canceledAt,
		"created":            pi.Created.Unix(),
		"livemode":           livemode,
	}
}

// Charge is the part of a charge the service reads. From API version 2022-11-15 a charge's
// refunds are not in its payload unless expanded, so there are none here.
type Charge struct {
	ID             string
	Customer       string
	PaymentIntent  string
	Amount         int64
	AmountRefunded int64
	Currency       string
	// Metadata is the PaymentIntent's: Stripe copies it to the charges it makes.
	Metadata map[string]string
	Created  time.Time
}

func (ch Charge) object(livemode bool) map[string]any {
	return map[string]any{
		"id":              ch.ID,
		"object":          "charge",
		"status":          "succeeded",
		"paid":            true,
		"captured":        true,
		"customer":        nullIfEmpty(ch.Customer),
		"payment_intent":  nullIfEmpty(ch.PaymentIntent),
		"amount":          ch.Amount,
		"amount_captured": ch.Amount,
		"amount_refunded": ch.AmountRefunded,
		"refunded":        ch.AmountRefunded >= ch.Amount,
		"currency":        ch.Currency,
		"metadata":        metadata(ch.Metadata),
		"created":         ch.Created.Unix(),
		"livemode":        livemode,
	}
}

// Refund is the part of a refund the service reads.
type Refund struct {
	ID            string
	Charge        string
	PaymentIntent string
	Status        string
	Amount        int64
	Currency      string
	// Metadata carries order_id and refund_id on the refunds the service makes.
	Metadata      map[string]string
	FailureReason string // null unless the refund failed
	Created       time.Time
}

func (r Refund) object(livemode bool) map[string]any {
	return map[string]any{
		"id":             r.ID,
		"object":         "refund",
		"status":         r.Status,
		"charge":         nullIfEmpty(r.Charge),
		"payment_intent": nullIfEmpty(r.PaymentIntent),
		"amount":         r.Amount,
		"currency":       r.Currency,
		"metadata":       metadata(r.Metadata),
		"failure_reason": nullIfEmpty(r.FailureReason),
		"reason":         nil,
		"created":        r.Created.Unix(),
		// Refunds have no livemode field of their own; the event carries the mode.
	}
}

// CheckoutSessionEvent returns a checkout.session.* event.
func CheckoutSessionEvent(id, typ string, created time.Time, livemode bool, cs CheckoutSession) []byte {
	return Event(id, typ, created, livemode, cs.object(livemode), nil)
}

// PaymentIntentEvent returns a payment_intent.* event.
func PaymentIntentEvent(id, typ string, created time.Time, livemode bool, pi PaymentIntent) []byte {
	return Event(id, typ, created, livemode, pi.object(livemode), nil)
}

// ChargeEvent returns a charge.* event carrying a charge (charge.refunded).
func ChargeEvent(id, typ string, created time.Time, livemode bool, ch Charge) []byte {
	return Event(id, typ, created, livemode, ch.object(livemode), nil)
}

// RefundEvent returns an event carrying a refund (refund.*, charge.refund.updated).
func RefundEvent(id, typ string, created time.Time, livemode bool, r Refund) []byte {
	return Event(id, typ, created, livemode, r.object(livemode), nil)
}
