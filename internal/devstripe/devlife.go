package devstripe

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"billing/internal/stripeemu"
)

// The life of a subscription at the dev Stripe, played by a person at the dev loop: completing a
// Checkout session as its customer would, and moving the account's clock on (a test clock) so
// that periods renew, trials end and cancellations take effect. Each changes the Account and then
// sends the service the events Stripe would send, in Stripe's order.

// DevUnitAmount is what a price costs a seat a month at the dev Stripe when its catalog does not
// know the price, in cents of usd; the seeded price_pro costs the same. A price of the catalog
// costs its unit_amount per its interval.
const DevUnitAmount = 2000

// DevUsageUnitAmount is what a unit of usage (a meter event's value, any meter) costs at the dev
// Stripe, in cents of usd, billed in arrears on the customer's next renewal invoice.
const DevUsageUnitAmount = 1

// DevResult is what a dev action did, as the /dev/ endpoints answer it.
type DevResult struct {
	// Now is the account's clock after the action.
	Now     time.Time   `json:"now"`
	Session string      `json:"session,omitempty"`
	Changes []DevChange `json:"changes"`
	// Events are the events sent, in order (Status 0 and no attempts: not sent).
	Events []Delivery `json:"events"`
	Error  string     `json:"error,omitempty"`
}

// DevChange is what happened to one subscription.
type DevChange struct {
	Subscription string `json:"subscription"`
	// What: created, paid, payment_failed, renewed, renewal_failed, retry_paid, retry_failed,
	// retries_exhausted, canceled, expired, cancel_at_period_end, changed.
	What          string `json:"what"`
	Status        string `json:"status"`
	Invoice       string `json:"invoice,omitempty"`
	InvoiceStatus string `json:"invoice_status,omitempty"`
	// Usage is the units of usage a renewal's invoice bills (DevUsageUnitAmount each).
	Usage int64     `json:"usage,omitempty"`
	At    time.Time `json:"at"`
}

// DevError is a refused dev action, with the HTTP status it answers.
type DevError struct {
	Status int
	Msg    string
}

func (e *DevError) Error() string { return e.Msg }

func devErrorf(status int, format string, args ...any) error {
	return &DevError{Status: status, Msg: fmt.Sprintf(format, args...)}
}

// CompleteCheckout pays an open subscription-mode session as its customer would with card (its
// default payment method when empty; a card given becomes the default, as Checkout saves it for
// renewals). The subscription is created for the session's customer with the price, quantity,
// trial and metadata the service asked for, its first invoice paid; then
// customer.subscription.created, invoice.paid, invoice.payment_succeeded and
// checkout.session.completed go out. A declining card leaves the session open and the
// subscription incomplete with its first invoice open (invoice.payment_failed); completing the
// session again pays that invoice.
func (d *DevStripe) CompleteCheckout(ctx context.Context, sessionID, card string) (DevResult, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	sess := d.Sessions.Get(sessionID)
	switch {
	case sess == nil:
		return DevResult{}, devErrorf(http.StatusNotFound, "no checkout session %s at this dev Stripe (it keeps sessions as long as it runs)", sessionID)
	case sess["status"] != "open":
		return DevResult{}, devErrorf(http.StatusConflict, "checkout session %s is %v, not open", sessionID, sess["status"])
	case sess["mode"] != "subscription":
		return DevResult{}, devErrorf(http.StatusBadRequest, "checkout session %s is of mode %v; only subscription sessions are played here", sessionID, sess["mode"])
	}
	customer, _ := sess["customer"].(string)
	if customer == "" {
		return DevResult{}, devErrorf(http.StatusBadRequest, "checkout session %s has no customer", sessionID)
	}
	if card == "" {
		card = d.Account.DefaultPaymentMethod(customer)
	} else if !d.Account.SetDefaultPaymentMethod(customer, card) {
		return DevResult{}, devErrorf(http.StatusNotFound, "no customer %s at this dev Stripe", customer)
	}
	if card == "" {
		card = DefaultCard
	}
	now := d.Account.Now()
	declined := stripeemu.CardDeclines(card, false)

	var events [][]byte
	subID, retry := d.pending[sessionID]
	var spec stripeemu.SubscriptionSpec
	if retry {
		spec, _ = d.Account.Spec(subID)
	} else {
		form := d.Sessions.Request(sessionID)
		var lines []stripeemu.InvoiceLine
		var err error
		if spec, lines, err = d.checkoutSpec(form, customer, now); err != nil {
			return DevResult{}, err
		}
		// The session's promotion code and automatic tax are the subscription's, for every invoice.
		spec.ID = d.Account.NewSubscriptionID()
		fields := map[string]any{"discount": nil, "discounts": []any{},
			"automatic_tax": map[string]any{"enabled": false, "liability": nil}}
		if disc := d.devDiscount(form, sessionID, spec.ID, customer, now); disc != nil {
			fields["discount"], fields["discounts"] = disc, []any{disc["id"]}
			d.Catalog.Redeem(disc["promotion_code"].(string))
		}
		if v := form["automatic_tax[enabled]"]; len(v) > 0 && v[0] == "true" {
			fields["automatic_tax"] = map[string]any{"enabled": true, "liability": map[string]any{"type": "self"}}
		}
		d.Account.SetSubscriptionFields(spec.ID, fields)
		d.bill(spec.ID, customer, spec.LatestInvoice, lines)
	}
	inv := spec.LatestInvoice
	inv.AttemptCount++
	change := DevChange{What: "created"}
	switch {
	case declined && inv.AmountDue > 0:
		inv.Status = "open"
		change.What = "payment_failed"
	case inv.AmountDue == 0:
		// Nothing to charge (a trial, a discount of it all): paid at once.
		inv.Status = "paid"
		if spec.Status == "incomplete" {
			spec.Status = "active"
		}
	default:
		inv.Status, inv.AmountPaid = "paid", inv.AmountDue
		spec.Status = "active"
		if retry {
			change.What = "paid"
		}
	}
	subID = d.Account.PutSubscription(spec)
	if !retry {
		events = append(events, d.event("customer.subscription.created", d.subscriptionObject(subID), now))
	}
	if inv.Status == "open" {
		events = append(events, d.event("invoice.payment_failed", d.invoiceObject(inv.ID), now))
		d.pending[sessionID] = subID
	} else {
		events = append(events,
			d.event("invoice.paid", d.invoiceObject(inv.ID), now),
			d.event("invoice.payment_succeeded", d.invoiceObject(inv.ID), now))
		if retry {
			events = append(events, d.event("customer.subscription.updated", d.subscriptionObject(subID), now))
		}
		delete(d.pending, sessionID)
		events = append(events, d.event("checkout.session.completed", d.Sessions.Complete(sessionID, subID), now))
		events = append(events, d.syncEntitlements(customer, now)...)
	}
	change.Subscription, change.Status, change.Invoice, change.InvoiceStatus, change.At = subID, spec.Status, inv.ID, inv.Status, now
	res := DevResult{Now: now, Session: sessionID, Changes: []DevChange{change}}
	return d.send(ctx, res, events)
}

// checkoutSpec is the subscription a session's create asked for, starting at now, and the lines
// of its first invoice.
func (d *DevStripe) checkoutSpec(f map[string][]string, customer string, now time.Time) (stripeemu.SubscriptionSpec, []stripeemu.InvoiceLine, error) {
	get := func(k string) string {
		if v := f[k]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	price := get("line_items[0][price]")
	if price == "" {
		return stripeemu.SubscriptionSpec{}, nil, devErrorf(http.StatusBadRequest, "the session was not created through this dev Stripe's API: its line items are unknown")
	}
	qty := int64(1)
	if q := get("line_items[0][quantity]"); q != "" {
		n, err := strconv.ParseInt(q, 10, 64)
		if err != nil || n < 1 {
			return stripeemu.SubscriptionSpec{}, nil, devErrorf(http.StatusBadRequest, "line_items[0][quantity] %q", q)
		}
		qty = n
	}
	md := map[string]string{}
	for k, v := range f {
		if name, ok := strings.CutPrefix(k, "subscription_data[metadata]["); ok && len(v) > 0 {
			md[strings.TrimSuffix(name, "]")] = v[0]
		}
	}
	terms, _ := d.Proxy.PriceTerms(price) // Dev mode: every price has terms
	spec := stripeemu.SubscriptionSpec{
		Customer: customer, Status: "incomplete", PriceID: price, Quantity: qty, Metadata: md, Created: now,
		CurrentPeriodStart: now, CurrentPeriodEnd: terms.Next(now),
	}
	inv := &stripeemu.InvoiceSpec{ID: d.Account.NewInvoiceID(), Currency: terms.Currency, AmountDue: terms.UnitAmount * qty, Created: now,
		BillingReason: "subscription_create", PeriodStart: now, PeriodEnd: spec.CurrentPeriodEnd}
	lines := []stripeemu.InvoiceLine{stripeemu.PeriodLine(terms, qty, now, spec.CurrentPeriodEnd)}
	if days, _ := strconv.Atoi(get("subscription_data[trial_period_days]")); days > 0 {
		// A trial's period is the trial; its first invoice is of nothing, paid at once.
		spec.Status, spec.TrialStart, spec.TrialEnd = "trialing", now, now.AddDate(0, 0, days)
		spec.CurrentPeriodEnd = spec.TrialEnd
		inv.AmountDue, inv.PeriodEnd = 0, spec.TrialEnd
		lines = []stripeemu.InvoiceLine{{Description: "Trial period for " + terms.Name, Currency: terms.Currency,
			Start: now, End: spec.TrialEnd, Price: price, Quantity: qty}}
	}
	spec.LatestInvoice = inv
	return spec, lines, nil
}

// AdvanceClock moves the account's clock on by by and plays what falls due meanwhile, period by
// period: a subscription set to cancel at its period's end is canceled
// (customer.subscription.deleted); any other active, trialing or past_due one renews into its
// next period with an invoice charged to the customer's default payment method —
// customer.subscription.updated, invoice.paid and invoice.payment_succeeded when it pays;
// invoice.payment_failed and customer.subscription.updated (past_due) when it declines, after which
// Smart Retries charge the invoice again (retryDue). A renewal's invoice bills the seats of the
// new period and the usage not yet billed (unbilledUsage). An incomplete subscription expires 23 hours
// after its creation, as at Stripe.
func (d *DevStripe) AdvanceClock(ctx context.Context, by time.Duration) (DevResult, error) {
	if by <= 0 {
		return DevResult{}, devErrorf(http.StatusBadRequest, "advance by a positive time, not %s", by)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	to := d.Account.Advance(by)
	res := DevResult{Now: to, Changes: []DevChange{}}
	var events [][]byte
	ids := d.Account.SubscriptionIDs()
	slices.Reverse(ids) // oldest first
	for _, id := range ids {
		for {
			ch, evs, ok := d.nextDue(id, to)
			if !ok {
				break
			}
			res.Changes = append(res.Changes, ch)
			events = append(events, evs...)
			if spec, ok := d.Account.Spec(id); ok {
				// A subscription that ends takes its features with it.
				events = append(events, d.syncEntitlements(spec.Customer, ch.At)...)
			}
		}
	}
	return d.send(ctx, res, events)
}

// nextDue plays the next thing due on a subscription by to, if any.
func (d *DevStripe) nextDue(id string, to time.Time) (DevChange, [][]byte, bool) {
	spec, ok := d.Account.Spec(id)
	if !ok {
		return DevChange{}, nil, false
	}
	ch := DevChange{Subscription: id}
	switch spec.Status {
	case "incomplete":
		at := spec.Created.Add(23 * time.Hour)
		if at.After(to) {
			return ch, nil, false
		}
		spec.Status, spec.EndedAt = "incomplete_expired", at
		d.Account.PutSubscription(spec)
		ch.What, ch.Status, ch.At = "expired", spec.Status, at
		return ch, [][]byte{d.event("customer.subscription.updated", d.subscriptionObject(id), at)}, true
	case "active", "trialing", "past_due":
	default:
		return ch, nil, false
	}
	due := spec.CurrentPeriodEnd
	if spec.Status == "trialing" && !spec.TrialEnd.IsZero() {
		due = spec.TrialEnd
	}
	if inv := spec.LatestInvoice; spec.Status == "past_due" && inv != nil && inv.Status == "open" &&
		!inv.NextPaymentAttempt.IsZero() && !inv.NextPaymentAttempt.After(to) && (due.IsZero() || inv.NextPaymentAttempt.Before(due)) {
		return d.retryDue(spec, ch)
	}
	if due.IsZero() || due.After(to) {
		return ch, nil, false
	}
	ch.At = due
	if spec.CancelAtPeriodEnd || (!spec.CancelAt.IsZero() && !spec.CancelAt.After(due)) {
		spec.Status, spec.EndedAt = "canceled", due
		if spec.CanceledAt.IsZero() {
			spec.CanceledAt = due
		}
		d.Account.PutSubscription(spec)
		ch.What, ch.Status = "canceled", spec.Status
		return ch, [][]byte{d.event("customer.subscription.deleted", d.subscriptionObject(id), due)}, true
	}
	return d.renew(spec, due, "subscription_cycle", ch)
}

// renew starts a subscription's next period at due, with its invoice: the pending items
// (prorations of changes), the seats of the new period in advance, the usage of the past one in
// arrears; the discount and the customer's balance applied. Charged to the customer's card: paid,
// the subscription is active; declined, past_due and Stripe retries (retryDue).
func (d *DevStripe) renew(spec stripeemu.SubscriptionSpec, due time.Time, reason string, ch DevChange) (DevChange, [][]byte, bool) {
	id := spec.ID
	terms, _ := d.Proxy.PriceTerms(spec.PriceID)
	prevStart := spec.CurrentPeriodStart
	spec.CurrentPeriodStart, spec.CurrentPeriodEnd = due, terms.Next(due)
	qty := max(spec.Quantity, 1)
	ch.Usage = d.unbilledUsage(spec.Customer)
	lines := append(d.Account.TakePendingItems(id), stripeemu.PeriodLine(terms, qty, due, spec.CurrentPeriodEnd))
	if ch.Usage > 0 {
		lines = append(lines, usageLine(ch.Usage, prevStart, due))
	}
	inv := &stripeemu.InvoiceSpec{ID: d.Account.NewInvoiceID(), Currency: terms.Currency,
		AttemptCount: 1, Created: due, BillingReason: reason, PeriodStart: due, PeriodEnd: spec.CurrentPeriodEnd}
	d.bill(id, spec.Customer, inv, lines)
	spec.LatestInvoice = inv
	pm := d.renewalCard(spec.Customer)
	ch.Invoice = inv.ID
	if inv.AmountDue > 0 && stripeemu.CardDeclines(pm, true) {
		// Stripe retries a failed renewal (retryDue).
		inv.Status, inv.NextPaymentAttempt = "open", due.AddDate(0, 0, devRetryGaps[0])
		spec.Status = "past_due"
		d.Account.PutSubscription(spec)
		ch.What, ch.Status, ch.InvoiceStatus = "renewal_failed", spec.Status, inv.Status
		return ch, [][]byte{
			d.event("invoice.payment_failed", d.invoiceObject(inv.ID), due),
			d.event("customer.subscription.updated", d.subscriptionObject(id), due),
		}, true
	}
	inv.Status, inv.AmountPaid = "paid", inv.AmountDue
	spec.Status = "active"
	d.Account.PutSubscription(spec)
	ch.What, ch.Status, ch.InvoiceStatus = "renewed", spec.Status, inv.Status
	return ch, [][]byte{
		d.event("customer.subscription.updated", d.subscriptionObject(id), due),
		d.event("invoice.paid", d.invoiceObject(inv.ID), due),
		d.event("invoice.payment_succeeded", d.invoiceObject(inv.ID), due),
	}, true
}

// unbilledUsage sums the customer's meter events that no invoice has billed yet, and marks them
// billed. Meter events carry the service's wall-clock timestamps while the account's clock runs
// ahead, so usage is billed by "not yet billed" rather than by the period's dates.
func (d *DevStripe) unbilledUsage(customer string) int64 {
	var n int64
	for _, ev := range d.Meter.Events() {
		if ev.Customer == customer && !d.billedUsage[ev.Identifier] {
			d.billedUsage[ev.Identifier] = true
			n += ev.Value
		}
	}
	return n
}

// renewalCard is what a renewal or its retry charges: the customer's default payment method,
// else its default source.
func (d *DevStripe) renewalCard(customer string) string {
	if pm := d.Account.DefaultPaymentMethod(customer); pm != "" {
		return pm
	}
	return d.Account.DefaultSource(customer)
}

// devRetryGaps are the days between a failed renewal's attempts (Smart Retries, as Stripe's
// default of four attempts within about two weeks); after the last one fails, the subscription is
// canceled, Stripe's default for a subscription whose retries are exhausted.
var devRetryGaps = []int{3, 5, 7}

// retryDue charges a past_due subscription's open invoice again, at its next_payment_attempt, to
// the customer's default payment method as it is now: paid, the subscription is active again
// (invoice.paid, invoice.payment_succeeded, customer.subscription.updated); declined, the next
// attempt is scheduled (invoice.payment_failed), or, after the last, the subscription is canceled
// (invoice.payment_failed with no next attempt, customer.subscription.deleted).
func (d *DevStripe) retryDue(spec stripeemu.SubscriptionSpec, ch DevChange) (DevChange, [][]byte, bool) {
	inv := spec.LatestInvoice
	at := inv.NextPaymentAttempt
	inv.AttemptCount++
	ch.At, ch.Invoice = at, inv.ID
	pm := d.renewalCard(spec.Customer)
	var events [][]byte
	switch {
	case !stripeemu.CardDeclines(pm, true):
		inv.Status, inv.AmountPaid, inv.NextPaymentAttempt = "paid", inv.AmountDue, time.Time{}
		spec.Status = "active"
		d.Account.PutSubscription(spec)
		ch.What = "retry_paid"
		events = [][]byte{
			d.event("invoice.paid", d.invoiceObject(inv.ID), at),
			d.event("invoice.payment_succeeded", d.invoiceObject(inv.ID), at),
			d.event("customer.subscription.updated", d.subscriptionObject(spec.ID), at),
		}
	case int(inv.AttemptCount) > len(devRetryGaps):
		inv.NextPaymentAttempt = time.Time{}
		spec.Status, spec.EndedAt = "canceled", at
		if spec.CanceledAt.IsZero() {
			spec.CanceledAt = at
		}
		d.Account.PutSubscription(spec)
		ch.What = "retries_exhausted"
		events = [][]byte{
			d.event("invoice.payment_failed", d.invoiceObject(inv.ID), at),
			d.event("customer.subscription.deleted", d.subscriptionObject(spec.ID), at),
		}
	default:
		inv.NextPaymentAttempt = at.AddDate(0, 0, devRetryGaps[inv.AttemptCount-1])
		d.Account.PutSubscription(spec)
		ch.What = "retry_failed"
		events = [][]byte{d.event("invoice.payment_failed", d.invoiceObject(inv.ID), at)}
	}
	ch.Status, ch.InvoiceStatus = spec.Status, inv.Status
	return ch, events, true
}

// send delivers the events of an action (or lists them unsent without Webhooks).
func (d *DevStripe) send(ctx context.Context, res DevResult, events [][]byte) (DevResult, error) {
	if d.Webhooks == nil {
		for _, ev := range events {
			res.Events = append(res.Events, deliveryOf(ev))
		}
		return res, nil
	}
	ds, err := d.Webhooks.Send(ctx, events...)
	res.Events = ds
	if err != nil {
		res.Error = err.Error()
		return res, devErrorf(http.StatusBadGateway, "%s", err.Error())
	}
	return res, nil
}

func deliveryOf(ev []byte) Delivery {
	var head struct{ ID, Type string }
	_ = json.Unmarshal(ev, &head)
	return Delivery{EventID: head.ID, Type: head.Type, Error: "not sent: the dev Stripe has no webhook URL"}
}

// subscriptionObject is a subscription as an event carries it: latest_invoice an id.
func (d *DevStripe) subscriptionObject(id string) map[string]any {
	obj := decode(d.Account.Subscription(id))
	if inv, ok := obj["latest_invoice"].(map[string]any); ok {
		obj["latest_invoice"] = inv["id"]
	}
	return obj
}

func (d *DevStripe) invoiceObject(id string) map[string]any {
	return decode(d.Account.Invoice(id))
}

// serveDev answers the dev loop's own endpoints:
//
//	GET  /dev/checkout/sessions/{id}           the session's page (its url): a card form
//	POST /dev/checkout/sessions/{id}/complete  card=pm_…  (CompleteCheckout)
//	POST /dev/portal/sessions/{id}/apply       action=cancel|update price= quantity= subscription= (ApplyPortal)
//	POST /dev/advance                          days=N     (AdvanceClock)
//
// A form of a page posts page=1: success then redirects (303) where Stripe would send the
// customer — the session's success URL, the portal's return URL — instead of answering JSON.
func (d *DevStripe) serveDev() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /dev/checkout/sessions/{id}", d.checkoutPage)
	mux.HandleFunc("POST /dev/checkout/sessions/{id}/complete", func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		res, err := d.CompleteCheckout(r.Context(), id, r.FormValue("card"))
		if err == nil && r.FormValue("page") != "" && res.Changes[0].What != "payment_failed" {
			if to := successURL(d.Sessions.Get(id)); to != "" {
				http.Redirect(w, r, to, http.StatusSeeOther)
				return
			}
		}
		answerDev(w, res, err)
	})
	mux.HandleFunc("POST /dev/portal/sessions/{id}/apply", func(w http.ResponseWriter, r *http.Request) {
		choice := PortalChoice{Subscription: r.FormValue("subscription"), Price: r.FormValue("price")}
		switch a := r.FormValue("action"); a {
		case "", "update":
		case "cancel":
			choice.Cancel = true
		default:
			answerDev(w, DevResult{}, devErrorf(http.StatusBadRequest, "action must be cancel or update, not %q", a))
			return
		}
		if q := r.FormValue("quantity"); q != "" {
			n, err := strconv.ParseInt(q, 10, 64)
			if err != nil || n < 1 {
				answerDev(w, DevResult{}, devErrorf(http.StatusBadRequest, "quantity must be a whole number of seats from 1, not %q", q))
				return
			}
			choice.Quantity = n
		}
		id := r.PathValue("id")
		res, err := d.ApplyPortal(r.Context(), id, choice)
		if err == nil && r.FormValue("page") != "" {
			if to := portalReturnURL(d.Proxy, id); to != "" {
				http.Redirect(w, r, to, http.StatusSeeOther)
				return
			}
		}
		answerDev(w, res, err)
	})
	mux.HandleFunc("POST /dev/advance", func(w http.ResponseWriter, r *http.Request) {
		days, err := strconv.ParseFloat(r.FormValue("days"), 64)
		if err != nil || days <= 0 || days > 3660 {
			answerDev(w, DevResult{}, devErrorf(http.StatusBadRequest, "days must be a number of days above 0 (and at most 3660), not %q", r.FormValue("days")))
			return
		}
		res, err := d.AdvanceClock(r.Context(), time.Duration(days*float64(24*time.Hour)))
		answerDev(w, res, err)
	})
	return mux
}

func answerDev(w http.ResponseWriter, res DevResult, err error) {
	status := http.StatusOK
	if err != nil {
		var de *DevError
		status = http.StatusInternalServerError
		if errors.As(err, &de) {
			status = de.Status
		}
		res.Error = err.Error()
	}
	writeJSON(w, status, res)
}
