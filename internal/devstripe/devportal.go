package devstripe

import (
	"context"
	"net/http"

	"billing/internal/stripeemu"
)

// The Customer Portal at the dev Stripe: what a customer confirms on a portal session's page,
// applied to the Account as Stripe's portal applies it, then customer.subscription.updated sent.

// PortalChoice is what the customer confirms in a portal session. Zero fields take the session's
// flow: subscription_cancel cancels its subscription, subscription_update_confirm applies its item's
// price and quantity; subscription_update (the choice of a plan) and a session without a flow need
// Price or Quantity, or Cancel.
type PortalChoice struct {
	Cancel       bool
	Subscription string // default the flow's, else the customer's newest live subscription
	Price        string
	Quantity     int64
}

// ApplyPortal applies a portal session's choice. A cancellation is at the period's end (the
// portal's default mode): cancel_at_period_end, cancel_at the period's end, canceled_at now; the
// subscription stays entitled until AdvanceClock reaches that end. A plan or seat change takes
// effect at once, prorated as Stripe's portal does (create_prorations): within the same billing
// interval, the credit for the unused time and the charge for the remaining time become pending
// items that the next renewal's invoice bills; a change of interval (monthly to yearly) restarts
// the billing cycle now, with an invoice of the new period charged at once and the unused time
// credited on it. A trial is not prorated. The customer's entitlements follow the new plan.
func (d *DevStripe) ApplyPortal(ctx context.Context, sessionID string, choice PortalChoice) (DevResult, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var sess map[string]any
	for _, s := range d.Proxy.Objects("/v1/billing_portal/sessions") {
		if s["id"] == sessionID {
			sess = s
		}
	}
	if sess == nil {
		return DevResult{}, devErrorf(http.StatusNotFound, "no portal session %s at this dev Stripe (it keeps sessions as long as it runs)", sessionID)
	}
	customer, _ := sess["customer"].(string)
	flow, _ := sess["flow"].(map[string]any)
	flowType, _ := flow["type"].(string)
	sub := choice.Subscription
	flowSub := func(key string) string {
		f, _ := flow[key].(map[string]any)
		s, _ := f["subscription"].(string)
		return s
	}
	update := choice.Price != "" || choice.Quantity != 0
	switch flowType {
	case "subscription_cancel":
		if update {
			return DevResult{}, devErrorf(http.StatusBadRequest, "portal session %s opens a cancellation (subscription_cancel), not a plan change", sessionID)
		}
		choice.Cancel, sub = true, flowSub(flowType)
	case "subscription_update_confirm":
		if choice.Cancel {
			return DevResult{}, devErrorf(http.StatusBadRequest, "portal session %s confirms a plan change (subscription_update_confirm), not a cancellation", sessionID)
		}
		sub = flowSub(flowType)
		f, _ := flow[flowType].(map[string]any)
		if items, _ := f["items"].([]any); len(items) > 0 {
			item, _ := items[0].(map[string]any)
			if p, _ := item["price"].(string); p != "" && choice.Price == "" {
				choice.Price = p
			}
			if q, ok := item["quantity"].(int64); ok && choice.Quantity == 0 { // as flowOf keeps it
				choice.Quantity = q
			}
		}
		update = true
	case "subscription_update":
		sub = flowSub(flowType)
		fallthrough
	default:
		if update == choice.Cancel {
			return DevResult{}, devErrorf(http.StatusBadRequest, "portal session %s lets the customer choose: give a price or a quantity, or cancel", sessionID)
		}
	}
	if choice.Quantity < 0 || choice.Quantity > 10000 {
		return DevResult{}, devErrorf(http.StatusBadRequest, "quantity %d: the portal sells 1 to 10000 seats", choice.Quantity)
	}
	if sub == "" {
		sub = d.liveSubscriptionOf(customer)
	}
	spec, ok := d.Account.Spec(sub)
	switch {
	case sub == "" || !ok:
		return DevResult{}, devErrorf(http.StatusNotFound, "customer %s has no live subscription %s at this dev Stripe", customer, sub)
	case spec.Customer != customer:
		return DevResult{}, devErrorf(http.StatusForbidden, "subscription %s is not of the portal session's customer %s", sub, customer)
	case !liveStatus(spec.Status):
		return DevResult{}, devErrorf(http.StatusConflict, "subscription %s is %s: the portal changes only a live subscription", sub, spec.Status)
	}
	now := d.Account.Now()
	ch := DevChange{Subscription: sub, At: now}
	if choice.Cancel {
		if spec.CancelAtPeriodEnd {
			return DevResult{}, devErrorf(http.StatusConflict, "subscription %s is already canceling at its period's end", sub)
		}
		spec.CancelAtPeriodEnd, spec.CancelAt, spec.CanceledAt = true, spec.CurrentPeriodEnd, now
		ch.What = "cancel_at_period_end"
	} else {
		old, _ := d.Proxy.PriceTerms(spec.PriceID)
		oldQty := max(spec.Quantity, 1)
		if choice.Price != "" {
			spec.PriceID = choice.Price
		}
		if choice.Quantity != 0 {
			spec.Quantity = choice.Quantity
		}
		ch.What = "changed"
		nt, _ := d.Proxy.PriceTerms(spec.PriceID)
		inPeriod := spec.Status != "trialing" && !now.Before(spec.CurrentPeriodStart) && now.Before(spec.CurrentPeriodEnd)
		switch {
		case !inPeriod:
		case old.SameInterval(nt) || spec.CancelAtPeriodEnd:
			d.Account.AddPendingItems(sub, stripeemu.Prorate(old, oldQty, nt, max(spec.Quantity, 1), spec.CurrentPeriodStart, spec.CurrentPeriodEnd, now)...)
		default:
			d.Account.AddPendingItems(sub, stripeemu.UnusedTime(old, oldQty, spec.CurrentPeriodStart, spec.CurrentPeriodEnd, now)...)
			ch, events, _ := d.renew(spec, now, "subscription_update", ch)
			ch.What = "changed"
			events = append(events, d.syncEntitlements(customer, now)...)
			return d.send(ctx, DevResult{Now: now, Session: sessionID, Changes: []DevChange{ch}}, events)
		}
	}
	d.Account.PutSubscription(spec)
	ch.Status = spec.Status
	res := DevResult{Now: now, Session: sessionID, Changes: []DevChange{ch}}
	events := [][]byte{d.event("customer.subscription.updated", d.subscriptionObject(sub), now)}
	return d.send(ctx, res, append(events, d.syncEntitlements(customer, now)...))
}

// liveStatus reports whether the portal may change a subscription of status.
func liveStatus(status string) bool {
	return status == "active" || status == "trialing" || status == "past_due"
}

// liveSubscriptionOf is the customer's newest live subscription ("" when none).
func (d *DevStripe) liveSubscriptionOf(customer string) string {
	for _, id := range d.Account.SubscriptionIDs() { // newest first
		if s, ok := d.Account.Spec(id); ok && s.Customer == customer && liveStatus(s.Status) {
			return id
		}
	}
	return ""
}
