package reconcile

import (
	"strconv"
	"time"

	"github.com/stripe/stripe-go/v79"

	"billing/billing"
)

// Drift fields.
const (
	FieldStatus            = "status"
	FieldCustomer          = "customer"
	FieldPrice             = "price"
	FieldPeriodStart       = "current_period_start"
	FieldPeriodEnd         = "current_period_end"
	FieldCancelAtPeriodEnd = "cancel_at_period_end"
	FieldCancelAt          = "cancel_at"
	FieldCanceledAt        = "canceled_at"
	FieldEndedAt           = "ended_at"
	FieldTrialStart        = "trial_start"
	FieldTrialEnd          = "trial_end"
	FieldHold              = "hold"
	// FieldQuantity: the seats, the quantity of the licensed item.
	FieldQuantity = "quantity"
	// FieldFeatures: the customer's active entitlements (their lookup keys, sorted, comma
	// separated), recorded on the subscription that brought the customer into the run.
	FieldFeatures = "features"
	// FieldPauseCollection: pause_collection's behavior ("" when collection is not paused).
	FieldPauseCollection = "pause_collection"
	// FieldMissingLocally: Stripe has the subscription, the local state does not.
	FieldMissingLocally = "missing_locally"
	// FieldMissingAtStripe: the local state has a subscription Stripe did not list. Never deleted.
	FieldMissingAtStripe = "missing_at_stripe"
	// FieldLivemode: the id is known locally in the other mode.
	FieldLivemode = "livemode"
	// FieldCustomerLink: the subscription's customer names a user (metadata.user_id) that the
	// local customers table does not link to it.
	FieldCustomerLink = "customer_link"
)

// diff is one field that differs: the values as text, "" for none.
type diff struct {
	Field, Local, Stripe string
}

// compare lists the fields in which the local row differs from Stripe's subscription. A nil
// local row is one diff, FieldMissingLocally.
func compare(local *billing.Subscription, r *stripe.Subscription) []diff {
	if local == nil {
		return []diff{{Field: FieldMissingLocally, Stripe: string(r.Status)}}
	}
	var out []diff
	add := func(field, l, s string) {
		if l != s {
			out = append(out, diff{Field: field, Local: l, Stripe: s})
		}
	}
	customer := ""
	if r.Customer != nil {
		customer = r.Customer.ID
	}
	add(FieldStatus, local.Status, string(r.Status))
	add(FieldCustomer, local.StripeCustomerID, customer)
	add(FieldPrice, deref(local.PriceID), priceOf(r))
	add(FieldPeriodStart, timeText(local.CurrentPeriodStart), unixText(r.CurrentPeriodStart))
	add(FieldPeriodEnd, timeText(local.CurrentPeriodEnd), unixText(r.CurrentPeriodEnd))
	add(FieldCancelAtPeriodEnd, strconv.FormatBool(local.CancelAtPeriodEnd), strconv.FormatBool(r.CancelAtPeriodEnd))
	add(FieldCancelAt, timeText(local.CancelAt), unixText(r.CancelAt))
	add(FieldCanceledAt, timeText(local.CanceledAt), unixText(r.CanceledAt))
	add(FieldEndedAt, timeText(local.EndedAt), unixText(r.EndedAt))
	add(FieldTrialStart, timeText(local.TrialStart), unixText(r.TrialStart))
	add(FieldTrialEnd, timeText(local.TrialEnd), unixText(r.TrialEnd))
	add(FieldQuantity, quantityText(local.Quantity), quantityOf(r))
	pause := ""
	if r.PauseCollection != nil {
		pause = string(r.PauseCollection.Behavior)
	}
	add(FieldPauseCollection, deref(local.PauseCollectionBehavior), pause)
	if hold, known := stripeHold(r.LatestInvoice); known {
		add(FieldHold, strconv.FormatBool(local.PaymentHold), strconv.FormatBool(hold))
	}
	return out
}

// stripeHold is the payment hold Stripe's latest invoice implies, by the rule the invoice events
// and snapshots apply: open and attempted holds, paid or void lifts. known is false for a draft,
// an invoice not attempted yet, an uncollectible one or none: they say nothing about the hold
// (the previous invoice may still be open), so the hold is not compared.
func stripeHold(inv *stripe.Invoice) (hold, known bool) {
	if inv == nil || inv.Status == "" {
		return false, false
	}
	switch {
	case inv.Status == stripe.InvoiceStatusOpen && inv.AttemptCount > 0:
		return true, true
	case inv.Status == stripe.InvoiceStatusPaid || inv.Status == stripe.InvoiceStatusVoid:
		return false, true
	}
	return false, false
}

// priceOf is the price of the first item, or its plan: what billing keeps as price_id.
func priceOf(r *stripe.Subscription) string {
	if r.Items == nil {
		return ""
	}
	for _, it := range r.Items.Data {
		if it.Price != nil && it.Price.ID != "" {
			return it.Price.ID
		}
		if it.Plan != nil && it.Plan.ID != "" {
			return it.Plan.ID
		}
	}
	return ""
}

// quantityOf is the quantity of the first licensed (not metered) item, as billing keeps it: ""
// when there is none.
func quantityOf(r *stripe.Subscription) string {
	if r.Items == nil {
		return ""
	}
	for _, it := range r.Items.Data {
		metered := (it.Price != nil && it.Price.Recurring != nil && it.Price.Recurring.UsageType == stripe.PriceRecurringUsageTypeMetered) ||
			(it.Plan != nil && it.Plan.UsageType == stripe.PlanUsageTypeMetered)
		if !metered {
			return strconv.FormatInt(it.Quantity, 10)
		}
	}
	return ""
}

func quantityText(q *int64) string {
	if q == nil {
		return ""
	}
	return strconv.FormatInt(*q, 10)
}

// newerLocally reports whether the local row holds news of Stripe from the fetch's second or
// later: then the page (older) cannot say the row is wrong, and the subscription is read again.
func newerLocally(local *billing.Subscription, fetchedAt time.Time) bool {
	if local == nil {
		return false
	}
	sec := fetchedAt.UTC().Truncate(time.Second)
	for _, t := range []*time.Time{local.SubEventCreated, local.InvEventCreated} {
		if t != nil && !t.Before(sec) {
			return true
		}
	}
	return false
}

func timeText(t *time.Time) string {
	if t == nil {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}

func unixText(sec int64) string {
	if sec == 0 {
		return ""
	}
	return time.Unix(sec, 0).UTC().Format(time.RFC3339)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
