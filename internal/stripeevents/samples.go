package stripeevents

// The sample events of `billing trigger`: a plausible event of each handled type, ids derived
// from one suffix so that the events of one run belong together.

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// Sample returns a plausible event of typ for `billing trigger`, ids derived from suffix (the
// event's too).
func Sample(typ, suffix string, now time.Time, livemode bool) ([]byte, error) {
	return SampleWith(typ, SampleOptions{Suffix: suffix, Now: now, Livemode: livemode})
}

// SampleOptions shape a sample event. Empty fields take their defaults.
type SampleOptions struct {
	// Suffix names the objects: sub_<suffix>, cus_<suffix>, in_<suffix>, cs_test_<suffix>
	// (cs_live_ in live mode), pi_<suffix>, ch_<suffix>, re_<suffix>; and the event,
	// evt_<suffix>, unless EventID is set.
	Suffix string
	// EventID, Customer, Subscription, Invoice, Session, PaymentIntent, Charge and Refund replace
	// the ids derived from Suffix.
	EventID, Customer, Subscription, Invoice string
	Session, PaymentIntent, Charge, Refund   string
	// Status is the status of the event's object (the subscription's, the invoice's, the
	// session's, the PaymentIntent's or the refund's) in place of the type's usual one.
	Status string
	// APIVersion stamps the event (default the pinned one).
	APIVersion string
	// Quantity is the subscription's seats (customer.subscription.*; default 1).
	Quantity int64
	// Features are the lookup keys of entitlements.active_entitlement_summary.updated (default
	// one, "premium"); FeaturesHaveMore says Stripe has more than these.
	Features         []string
	FeaturesHaveMore bool
	// UserID is the app's user as the service's own Checkout sessions name it
	// (client_reference_id and metadata user_id) and its PaymentIntents (metadata user_id);
	// default none, so that a session's user is the one linked to its customer.
	UserID string
	// OrderID is metadata order_id of PaymentIntents, charges and refunds, as POST /v1/charges
	// sets it (default o_<suffix>); RefundID is a refund's metadata refund_id, as POST
	// /v1/charges/{order_id}/refunds sets it (default r_<suffix>).
	OrderID, RefundID string
	// Amount is the PaymentIntent's, the charge's and the refund's amount (default 2000);
	// AmountRefunded the charge's refunded part (charge.refunded; default all of it).
	Amount, AmountRefunded int64
	// DeclineCode is the decline of payment_intent.payment_failed (default generic_decline).
	DeclineCode string
	Now         time.Time
	Livemode    bool
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// sample is one SampleWith call: the options with their defaults, and the objects' builders.
type sample struct {
	o                                     SampleOptions
	now                                   time.Time
	sub                                   Subscription
	inv                                   Invoice
	customer, session, pi, charge, refund string
	order, refundID                       string
	amount                                int64
}

func (s *sample) subscription() map[string]any {
	if s.o.Status != "" {
		s.sub.Status = s.o.Status
		if s.o.Status != "trialing" {
			s.sub.TrialStart, s.sub.TrialEnd = time.Time{}, time.Time{}
		}
	}
	return s.sub.object(s.o.Livemode)
}

func (s *sample) invoice() map[string]any {
	if s.o.Status != "" {
		s.inv.Status = s.o.Status
	}
	return s.inv.object(s.o.Livemode)
}

func (s *sample) customerObject() map[string]any {
	return map[string]any{"id": s.customer, "object": "customer", "email": s.inv.CustomerEmail, "name": nil,
		"livemode": s.o.Livemode, "created": s.now.AddDate(0, -1, 0).Unix(), "metadata": map[string]any{}}
}

func (s *sample) checkoutSession(status, paymentStatus string) map[string]any {
	cs := CheckoutSession{
		ID: s.session, Customer: s.customer, Subscription: s.sub.ID, ClientReferenceID: s.o.UserID,
		Status: orDefault(s.o.Status, status), PaymentStatus: paymentStatus, Metadata: map[string]string{},
		Created: s.now.Add(-10 * time.Minute), ExpiresAt: s.now.Add(24 * time.Hour), AmountTotal: 2000, Currency: "usd",
	}
	if s.o.UserID != "" {
		cs.Metadata["user_id"] = s.o.UserID
	}
	switch cs.Status {
	case "expired":
		// An expired session never made a subscription.
		cs.Subscription, cs.ExpiresAt = "", s.now
	case "open":
		cs.Subscription, cs.URL = "", "https://checkout.stripe.com/c/pay/"+s.session
	}
	return cs.object(s.o.Livemode)
}

func (s *sample) paymentIntent(status string) map[string]any {
	pi := PaymentIntent{
		ID: s.pi, Customer: s.customer, Status: orDefault(s.o.Status, status), Amount: s.amount, Currency: "usd",
		Metadata: s.chargeMetadata(), LatestCharge: s.charge, Created: s.now,
	}
	switch pi.Status {
	case "requires_payment_method":
		pi.ErrorCode, pi.DeclineCode = "card_declined", orDefault(s.o.DeclineCode, "generic_decline")
	case "canceled":
		pi.LatestCharge = ""
	}
	return pi.object(s.o.Livemode)
}

// chargeMetadata is what POST /v1/charges puts on its PaymentIntent (and Stripe on its charges).
func (s *sample) chargeMetadata() map[string]string {
	md := map[string]string{"order_id": s.order}
	if s.o.UserID != "" {
		md["user_id"] = s.o.UserID
	}
	return md
}

func (s *sample) chargeObject() map[string]any {
	refunded := s.o.AmountRefunded
	if refunded == 0 {
		refunded = s.amount
	}
	return Charge{ID: s.charge, Customer: s.customer, PaymentIntent: s.pi, Amount: s.amount, AmountRefunded: refunded,
		Currency: "usd", Metadata: s.chargeMetadata(), Created: s.now}.object(s.o.Livemode)
}

func (s *sample) refundObject(status string) map[string]any {
	r := Refund{ID: s.refund, Charge: s.charge, PaymentIntent: s.pi, Status: orDefault(s.o.Status, status),
		Amount: s.amount, Currency: "usd", Metadata: map[string]string{"order_id": s.order, "refund_id": s.refundID}, Created: s.now}
	if r.Status == "failed" {
		r.FailureReason = "expired_or_canceled_card"
	}
	return r.object(s.o.Livemode)
}

// samples builds the object of each event type SampleWith knows.
var samples = map[string]func(s *sample) map[string]any{
	"customer.subscription.created": func(s *sample) map[string]any {
		s.sub.Status = "trialing"
		s.sub.TrialStart, s.sub.TrialEnd = s.now, s.now.AddDate(0, 0, 14)
		return s.subscription()
	},
	"customer.subscription.updated": (*sample).subscription,
	"customer.subscription.deleted": func(s *sample) map[string]any {
		s.sub.Status, s.sub.CanceledAt, s.sub.EndedAt = "canceled", s.now, s.now
		return s.subscription()
	},
	"customer.subscription.trial_will_end": func(s *sample) map[string]any {
		s.sub.Status = "trialing"
		s.sub.TrialStart, s.sub.TrialEnd = s.now.AddDate(0, 0, -11), s.now.AddDate(0, 0, 3)
		return s.subscription()
	},
	// Paused: the trial ended without a payment method.
	"customer.subscription.paused": func(s *sample) map[string]any {
		s.sub.Status = "paused"
		s.sub.TrialStart, s.sub.TrialEnd = s.now.AddDate(0, 0, -14), s.now
		return s.subscription()
	},
	"customer.subscription.resumed": (*sample).subscription,
	"invoice.payment_failed": func(s *sample) map[string]any {
		s.inv.Status, s.inv.AttemptCount, s.inv.NextPaymentAttempt = "open", 1, s.now.AddDate(0, 0, 3)
		return s.invoice()
	},
	"invoice.payment_action_required": func(s *sample) map[string]any {
		s.inv.Status, s.inv.AttemptCount = "open", 1
		return s.invoice()
	},
	"invoice.payment_succeeded": paidInvoice,
	"invoice.paid":              paidInvoice,
	"invoice.finalized":         invoiceIn("open"),
	"invoice.updated":           invoiceIn("open"),
	"invoice.voided":            invoiceIn("void"),
	"invoice.marked_uncollectible": func(s *sample) map[string]any {
		s.inv.Status, s.inv.AttemptCount = "uncollectible", 4
		return s.invoice()
	},
	"customer.created": (*sample).customerObject,
	"customer.updated": (*sample).customerObject,
	// A deleted customer's event carries the customer as it was.
	"customer.deleted": (*sample).customerObject,
	"entitlements.active_entitlement_summary.updated": func(s *sample) map[string]any {
		keys := s.o.Features
		if len(keys) == 0 {
			keys = []string{"premium"}
		}
		return EntitlementSummary{Customer: s.customer, LookupKeys: keys, HasMore: s.o.FeaturesHaveMore}.object(s.o.Livemode)
	},
	"checkout.session.completed":               func(s *sample) map[string]any { return s.checkoutSession("complete", "paid") },
	"checkout.session.async_payment_succeeded": func(s *sample) map[string]any { return s.checkoutSession("complete", "paid") },
	"checkout.session.async_payment_failed":    func(s *sample) map[string]any { return s.checkoutSession("complete", "unpaid") },
	"checkout.session.expired":                 func(s *sample) map[string]any { return s.checkoutSession("expired", "unpaid") },
	"payment_intent.succeeded":                 func(s *sample) map[string]any { return s.paymentIntent("succeeded") },
	"payment_intent.processing":                func(s *sample) map[string]any { return s.paymentIntent("processing") },
	"payment_intent.payment_failed":            func(s *sample) map[string]any { return s.paymentIntent("requires_payment_method") },
	"payment_intent.canceled":                  func(s *sample) map[string]any { return s.paymentIntent("canceled") },
	"charge.refunded":                          (*sample).chargeObject,
	"refund.created":                           func(s *sample) map[string]any { return s.refundObject("succeeded") },
	"refund.updated":                           func(s *sample) map[string]any { return s.refundObject("succeeded") },
	"charge.refund.updated":                    func(s *sample) map[string]any { return s.refundObject("succeeded") },
	"product.created":                          (*sample).product,
	"product.updated":                          (*sample).product,
	"product.deleted":                          (*sample).product,
	"price.created":                            (*sample).price,
	"price.updated":                            (*sample).price,
	"price.deleted":                            (*sample).price,
}

func paidInvoice(s *sample) map[string]any {
	s.inv.Status, s.inv.AttemptCount, s.inv.AmountPaid = "paid", 1, s.inv.AmountDue
	return s.invoice()
}

func invoiceIn(status string) func(s *sample) map[string]any {
	return func(s *sample) map[string]any {
		s.inv.Status = status
		return s.invoice()
	}
}

// SampleTypes lists the event types SampleWith has a sample of, sorted.
func SampleTypes() []string {
	out := make([]string, 0, len(samples))
	for typ := range samples {
		out = append(out, typ)
	}
	sort.Strings(out)
	return out
}

// SampleWith is Sample with every id, the status and the API version open to choice, so that a
// whole lifecycle of one linked customer can be played by hand.
func SampleWith(typ string, o SampleOptions) ([]byte, error) {
	build, ok := samples[typ]
	if !ok {
		return nil, fmt.Errorf("no sample for event type %q (samples: %s)", typ, strings.Join(SampleTypes(), ", "))
	}
	now := o.Now
	if now.IsZero() {
		now = time.Now()
	}
	s := &sample{o: o, now: now,
		customer: orDefault(o.Customer, "cus_"+o.Suffix),
		session:  orDefault(o.Session, "cs_test_"+o.Suffix),
		pi:       orDefault(o.PaymentIntent, "pi_"+o.Suffix),
		charge:   orDefault(o.Charge, "ch_"+o.Suffix),
		refund:   orDefault(o.Refund, "re_"+o.Suffix),
		order:    orDefault(o.OrderID, "o_"+o.Suffix),
		refundID: orDefault(o.RefundID, "r_"+o.Suffix),
		amount:   o.Amount,
	}
	if s.amount == 0 {
		s.amount = 2000
	}
	if o.Livemode && o.Session == "" {
		s.session = "cs_live_" + o.Suffix
	}
	subID := orDefault(o.Subscription, "sub_"+o.Suffix)
	invID := orDefault(o.Invoice, "in_"+o.Suffix)
	s.sub = Subscription{
		ID: subID, Customer: s.customer, Status: "active", PriceID: "price_monthly",
		CurrentPeriodStart: now, CurrentPeriodEnd: now.AddDate(0, 1, 0), Quantity: o.Quantity,
	}
	s.inv = Invoice{
		ID: invID, Customer: s.customer, Subscription: subID, Currency: "usd",
		AmountDue: 2000, HostedInvoiceURL: "https://invoice.stripe.com/i/acct_test/" + invID,
		CustomerEmail: "customer+" + o.Suffix + "@example.com",
	}
	id := orDefault(o.EventID, "evt_"+o.Suffix)
	return event(id, typ, orDefault(o.APIVersion, APIVersion), now, o.Livemode, build(s), nil), nil
}
