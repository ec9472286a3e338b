package stripeemu

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Invoices computed from the catalog's prices: the preview of a subscription change
// (POST /v1/invoices/create_preview) and, at the dev Stripe, the invoices of a subscription's
// life. Both prorate a mid-period change the way Stripe does: by the seconds left in the period,
// a credit for the unused time on the old price × quantity and a charge for the remaining time on
// the new one, each rounded to the nearest cent.

// PriceTerms is what a price charges.
type PriceTerms struct {
	ID, Name      string // Name: the product's
	UnitAmount    int64
	Currency      string
	Interval      string // month when unknown
	IntervalCount int64
}

// Next is the end of a period of the price starting at from.
func (t PriceTerms) Next(from time.Time) time.Time {
	n := int(max(t.IntervalCount, 1))
	switch t.Interval {
	case "year":
		return from.AddDate(n, 0, 0)
	case "week":
		return from.AddDate(0, 0, 7*n)
	case "day":
		return from.AddDate(0, 0, n)
	}
	return from.AddDate(0, n, 0)
}

func (t PriceTerms) SameInterval(o PriceTerms) bool {
	return t.Interval == o.Interval && max(t.IntervalCount, 1) == max(o.IntervalCount, 1)
}

// PriceTerms are a price's terms from the catalog; with Hooks.UnknownPriceAmount a price the
// catalog does not know costs that a month.
func (p *Proxy) PriceTerms(id string) (PriceTerms, bool) {
	p.mu.Lock()
	c, fallback := p.catalog, p.hooks.UnknownPriceAmount
	p.mu.Unlock()
	if c != nil {
		if pr, name, ok := c.price(id); ok && len(pr.Tiers) == 0 {
			return PriceTerms{ID: id, Name: name, UnitAmount: pr.UnitAmount, Currency: orUSD(pr.Currency),
				Interval: pr.Interval, IntervalCount: pr.IntervalCount}, true
		}
	}
	if fallback > 0 {
		return PriceTerms{ID: id, Name: id, UnitAmount: fallback, Currency: "usd", Interval: "month", IntervalCount: 1}, true
	}
	return PriceTerms{}, false
}

// PriceObject is the price object a subscription item carries: the catalog's, else a stub.
func (p *Proxy) PriceObject(id string, livemode bool) map[string]any {
	p.mu.Lock()
	c := p.catalog
	p.mu.Unlock()
	if c != nil {
		if obj := c.priceObject(id); obj != nil {
			return obj
		}
	}
	return map[string]any{"id": id, "object": "price", "active": true, "currency": "usd", "livemode": livemode, "type": "recurring"}
}

// InvoiceLine is a line of a computed invoice.
type InvoiceLine struct {
	Description string
	Amount      int64
	Currency    string
	Proration   bool
	Start, End  time.Time
	Price       string // "" for a line of no price (usage)
	Quantity    int64
}

// Prorate returns the proration lines of changing from old × oldQty to new × newQty at at, within
// the period [start, end): a credit for the unused time and a charge for the remaining time, by
// the seconds left. None when nothing is left of the period or nothing changes.
func Prorate(old PriceTerms, oldQty int64, new PriceTerms, newQty int64, start, end, at time.Time) []InvoiceLine {
	period, left := end.Unix()-start.Unix(), end.Unix()-at.Unix()
	if period <= 0 || left <= 0 || (old.ID == new.ID && oldQty == newQty) {
		return nil
	}
	left = min(left, period)
	return []InvoiceLine{
		{Description: "Unused time on " + seats(oldQty, old.Name) + " after " + at.UTC().Format("2 Jan 2006"),
			Amount: -prorated(old.UnitAmount*oldQty, left, period), Currency: old.Currency, Proration: true,
			Start: at, End: end, Price: old.ID, Quantity: oldQty},
		{Description: "Remaining time on " + seats(newQty, new.Name) + " after " + at.UTC().Format("2 Jan 2006"),
			Amount: prorated(new.UnitAmount*newQty, left, period), Currency: new.Currency, Proration: true,
			Start: at, End: end, Price: new.ID, Quantity: newQty},
	}
}

// UnusedTime is only the credit of Prorate (a change of interval bills the new price for a whole
// new period instead).
func UnusedTime(old PriceTerms, qty int64, start, end, at time.Time) []InvoiceLine {
	lines := Prorate(old, qty, PriceTerms{ID: "\x00"}, 0, start, end, at)
	if len(lines) == 0 {
		return nil
	}
	return lines[:1]
}

// prorated is amount × left / period rounded to the nearest cent, as Stripe rounds a proration.
func prorated(amount, left, period int64) int64 {
	return int64(math.Round(float64(amount) * float64(left) / float64(period)))
}

// PeriodLine is the line of a period of a price × quantity, billed in advance.
func PeriodLine(t PriceTerms, qty int64, start, end time.Time) InvoiceLine {
	return InvoiceLine{Description: fmt.Sprintf("%d × %s (at %s / %s)", qty, t.Name, Money(t.UnitAmount, t.Currency), t.Interval),
		Amount: t.UnitAmount * qty, Currency: t.Currency, Start: start, End: end, Price: t.ID, Quantity: qty}
}

func seats(qty int64, name string) string {
	if qty == 1 {
		return name
	}
	return fmt.Sprintf("%d × %s", qty, name)
}

func Money(cents int64, cur string) string {
	if cur == "usd" || cur == "" {
		return fmt.Sprintf("$%d.%02d", cents/100, cents%100)
	}
	return fmt.Sprintf("%d.%02d %s", cents/100, cents%100, strings.ToUpper(cur))
}

// InvoiceTotals are an invoice's sums. A credit (negative total) is not charged: amount_due is 0
// and the rest goes to the customer's balance, used by the next invoice (Stripe's way).
type InvoiceTotals struct {
	Subtotal, Discount, Total int64
	// StartingBalance and EndingBalance are the customer's balance before and after (negative:
	// credit, Stripe's sign).
	StartingBalance, EndingBalance int64
	AmountDue                      int64
}

// TotalsOf sums lines, takes the coupon off (never below 0: a discount lowers what is charged,
// not a credit), then applies the customer's balance.
func TotalsOf(lines []InvoiceLine, coupon *CouponTerms, balance int64) InvoiceTotals {
	var t InvoiceTotals
	for _, l := range lines {
		t.Subtotal += l.Amount
	}
	if coupon != nil && t.Subtotal > 0 {
		if coupon.AmountOff > 0 {
			t.Discount = min(coupon.AmountOff, t.Subtotal)
		} else {
			t.Discount = int64(math.Round(float64(t.Subtotal) * coupon.PercentOff / 100))
		}
	}
	t.Total = t.Subtotal - t.Discount
	t.StartingBalance = balance
	due := t.Total + balance
	t.AmountDue, t.EndingBalance = max(due, 0), min(due, 0)
	return t
}

// InvoiceFields are the fields of a computed invoice beyond what an InvoiceSpec holds.
func InvoiceFields(invoiceID, subscription string, lines []InvoiceLine, t InvoiceTotals, discount map[string]any,
	automaticTax bool, livemode bool, priceObject func(string) map[string]any) map[string]any {
	data := make([]any, len(lines))
	for i, l := range lines {
		typ, discounts := "subscription", []any{}
		if l.Proration {
			typ = "invoiceitem"
		}
		var price any
		if l.Price != "" {
			price = priceObject(l.Price)
		}
		data[i] = map[string]any{
			"id": fmt.Sprintf("il_%s_%d", strings.TrimPrefix(invoiceID, "in_"), i), "object": "line_item",
			"amount": l.Amount, "amount_excluding_tax": l.Amount, "currency": l.Currency, "description": l.Description,
			"discountable": true, "discount_amounts": []any{}, "discounts": discounts, "invoice": invoiceID,
			"livemode": livemode, "metadata": map[string]any{}, "period": map[string]any{"start": l.Start.Unix(), "end": l.End.Unix()},
			"price": price, "proration": l.Proration, "proration_details": map[string]any{"credited_items": nil},
			"quantity": l.Quantity, "subscription": nullable(subscription), "tax_amounts": []any{}, "tax_rates": []any{}, "type": typ,
		}
	}
	autoTax := map[string]any{"enabled": false, "liability": nil, "status": nil}
	if automaticTax {
		autoTax = map[string]any{"enabled": true, "liability": map[string]any{"type": "self"}, "status": "complete"}
	}
	out := map[string]any{
		"subtotal": t.Subtotal, "subtotal_excluding_tax": t.Subtotal, "tax": 0, "total": t.Total,
		"total_excluding_tax": t.Total, "total_tax_amounts": []any{}, "automatic_tax": autoTax,
		"starting_balance": t.StartingBalance, "ending_balance": t.EndingBalance,
		"lines": map[string]any{"object": "list", "data": data, "has_more": false, "total_count": len(data),
			"url": "/v1/invoices/" + invoiceID + "/lines"},
		"discount": nil, "discounts": []any{}, "total_discount_amounts": []any{},
	}
	if discount != nil {
		out["discount"], out["discounts"] = discount, []any{discount["id"]}
		out["total_discount_amounts"] = []any{map[string]any{"amount": t.Discount, "discount": discount["id"]}}
	}
	return out
}

// CouponOf reads the terms of a subscription's discount object (nil when none).
func CouponOf(discount any) *CouponTerms {
	d, _ := discount.(map[string]any)
	coupon, _ := d["coupon"].(map[string]any)
	if coupon == nil {
		return nil
	}
	t := &CouponTerms{Coupon: coupon}
	t.PromotionCode, _ = d["promotion_code"].(string)
	if f, ok := coupon["percent_off"].(float64); ok {
		t.PercentOff = f
	}
	if f, ok := coupon["amount_off"].(float64); ok {
		t.AmountOff = int64(f)
	}
	return t
}

// servePreview answers POST /v1/invoices/create_preview for a subscription of the account whose
// prices are known (the catalog's; any at the dev Stripe), as Stripe previews the next invoice
// after a change given in subscription_details: the pending invoice items, the proration of the
// change at proration_date (now when absent; none with proration_behavior=none), and the next
// period's line, the subscription's discount and the customer's balance applied. Anything else
// goes to stripe-mock.
func (a *Account) servePreview(r Request) Answer {
	if r.Method != http.MethodPost || r.Path != "/v1/invoices/create_preview" || a.p == nil {
		return pass()
	}
	f := r.Form
	subID := f.Get("subscription")
	if subID == "" {
		subID = f.Get("subscription_details[subscription]")
	}
	spec, ok := a.Spec(subID)
	if !ok {
		return pass()
	}
	if cus := f.Get("customer"); cus != "" && cus != spec.Customer {
		return Answer{Status: http.StatusBadRequest, Body: apiError("invalid_request_error", "",
			"The subscription '"+subID+"' does not belong to the customer '"+cus+"'.")}
	}
	const item = "subscription_details[items][0]"
	if id := f.Get(item + "[id]"); id != "" && id != itemID(subID) {
		return Answer{Status: http.StatusBadRequest, Body: apiError("invalid_request_error", "resource_missing",
			"No such subscription item: '"+id+"'")}
	}
	old, ok := a.p.PriceTerms(spec.PriceID)
	if !ok {
		return pass()
	}
	newT := old
	if id := f.Get(item + "[price]"); id != "" {
		if newT, ok = a.p.PriceTerms(id); !ok {
			return pass()
		}
	}
	qty := max(spec.Quantity, 1)
	newQty := qty
	if s := f.Get(item + "[quantity]"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 {
			return Answer{Status: http.StatusBadRequest, Body: apiError("invalid_request_error", "parameter_invalid_integer", "Invalid integer: "+s)}
		}
		newQty = n
	}
	at := a.Now()
	if s := f.Get("subscription_details[proration_date]"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return Answer{Status: http.StatusBadRequest, Body: apiError("invalid_request_error", "parameter_invalid_integer", "Invalid integer: "+s)}
		}
		at = time.Unix(n, 0)
	}
	if at.Before(spec.CurrentPeriodStart) {
		at = spec.CurrentPeriodStart
	}
	prorations := f.Get("subscription_details[proration_behavior]") != "none"

	lines := a.PendingItems(subID)
	start, end := spec.CurrentPeriodEnd, newT.Next(spec.CurrentPeriodEnd)
	nextAttempt := spec.CurrentPeriodEnd
	if !old.SameInterval(newT) {
		// A change of interval restarts the billing cycle now: the new price's whole period is
		// invoiced at once, with the unused time of the old one credited.
		start, end, nextAttempt = at, newT.Next(at), at
		if prorations {
			lines = append(lines, UnusedTime(old, qty, spec.CurrentPeriodStart, spec.CurrentPeriodEnd, at)...)
		}
	} else if prorations {
		lines = append(lines, Prorate(old, qty, newT, newQty, spec.CurrentPeriodStart, spec.CurrentPeriodEnd, at)...)
	}
	lines = append(lines, PeriodLine(newT, newQty, start, end))

	sub := decode(a.Subscription(subID))
	coupon := CouponOf(sub["discount"])
	autoTax := f.Get("automatic_tax[enabled]") == "true"
	if m, ok := sub["automatic_tax"].(map[string]any); ok && m["enabled"] == true {
		autoTax = true
	}
	t := TotalsOf(lines, coupon, a.Balance(spec.Customer))
	id := "upcoming_in_" + strings.TrimPrefix(subID, "sub_")
	inv := map[string]any{
		"id": id, "object": "invoice", "status": "draft", "customer": spec.Customer, "subscription": subID,
		"currency": newT.Currency, "amount_due": t.AmountDue, "amount_paid": 0, "amount_remaining": t.AmountDue,
		"attempt_count": 0, "attempted": false, "billing_reason": "upcoming", "collection_method": "charge_automatically",
		"created": at.Unix(), "livemode": a.livemode, "next_payment_attempt": nextAttempt.Unix(),
		"period_start": spec.CurrentPeriodStart.Unix(), "period_end": spec.CurrentPeriodEnd.Unix(),
		"hosted_invoice_url": nil, "paid": false, "metadata": map[string]any{},
		"subscription_proration_date": at.Unix(),
	}
	var discount map[string]any
	if d, ok := sub["discount"].(map[string]any); ok {
		discount = d
	}
	for k, v := range InvoiceFields(id, subID, lines, t, discount, autoTax, a.livemode, func(p string) map[string]any {
		return a.p.PriceObject(p, a.livemode)
	}) {
		inv[k] = v
	}
	return Answer{Status: http.StatusOK, Body: inv}
}

// itemID is the id of a subscription's (only) item.
func itemID(subscriptionID string) string {
	return "si_" + strings.TrimPrefix(subscriptionID, "sub_")
}
