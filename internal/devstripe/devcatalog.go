package devstripe

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"billing/internal/stripeemu"
	"billing/internal/stripeevents"
)

// The dev Stripe's catalog (products, prices, features, promotion codes), what its invoices bill
// from it (prices, prorations, discounts), and the entitlements its subscriptions grant.

// The seeded catalog of the dev Stripe.
const (
	DevProductPro  = "prod_dev_pro"
	DevProductTeam = "prod_dev_team"
	// DevPricePro costs DevUnitAmount, so that the dev tests' prices and it agree.
	DevPricePro        = "price_pro"
	DevPriceProYearly  = "price_pro_yearly"
	DevPriceTeam       = "price_team"
	DevPriceTeamYearly = "price_team_yearly"
	// DevPromoWelcome20 (code WELCOME20) takes 20 % off, DevPromoTenOff (code TENOFF) 1000 cents,
	// on every invoice (duration forever).
	DevPromoWelcome20 = "promo_dev_welcome20"
	DevPromoTenOff    = "promo_dev_tenoff"
)

// seedDevCatalog puts the dev loop's plans in c, created at created.
func seedDevCatalog(c *stripeemu.Catalog, created time.Time) {
	c.PutProduct(stripeevents.Product{ID: DevProductPro, Name: "Pro", Created: created})
	c.PutProduct(stripeevents.Product{ID: DevProductTeam, Name: "Team", Created: created})
	c.SetProductFeatures(DevProductPro, "api")
	c.SetProductFeatures(DevProductTeam, "api", "sso")
	for _, p := range []stripeevents.Price{
		{ID: DevPricePro, Product: DevProductPro, LookupKey: "pro_monthly", Nickname: "Pro monthly", UnitAmount: DevUnitAmount, Interval: "month"},
		{ID: DevPriceProYearly, Product: DevProductPro, LookupKey: "pro_yearly", Nickname: "Pro yearly", UnitAmount: 20000, Interval: "year"},
		{ID: DevPriceTeam, Product: DevProductTeam, LookupKey: "team_monthly", Nickname: "Team monthly", UnitAmount: 5000, Interval: "month"},
		{ID: DevPriceTeamYearly, Product: DevProductTeam, LookupKey: "team_yearly", Nickname: "Team yearly", UnitAmount: 50000, Interval: "year"},
	} {
		p.Currency, p.IntervalCount, p.Created = "usd", 1, created
		c.PutPrice(p)
	}
	c.PutPromotionCode(stripeemu.PromotionCodeSpec{ID: DevPromoWelcome20, Code: "WELCOME20", PercentOff: 20, CouponID: "dev_welcome20", Created: created})
	c.PutPromotionCode(stripeemu.PromotionCodeSpec{ID: DevPromoTenOff, Code: "TENOFF", AmountOff: 1000, Currency: "usd", CouponID: "dev_tenoff", Created: created})
}

// CatalogEvents are the events that tell the service the catalog: product.created for every
// product, then price.created for every price (a price names its product), oldest first.
func (d *DevStripe) CatalogEvents() [][]byte {
	now := d.Account.Now()
	var events [][]byte
	for _, p := range d.Catalog.Products() {
		events = append(events, stripeevents.ProductEvent(d.Proxy.NewID("evt_"), "product.created", now, false, p))
	}
	for _, p := range d.Catalog.Prices() {
		events = append(events, stripeevents.PriceEvent(d.Proxy.NewID("evt_"), "price.created", now, false, p))
	}
	return events
}

// SendCatalog sends CatalogEvents, each retried for up to within while the service is not there
// yet (make run starts the dev Stripe before the service). Other dev actions wait meanwhile, so
// that the service learns the prices before a subscription names one.
func (d *DevStripe) SendCatalog(ctx context.Context, within time.Duration) ([]Delivery, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	events := d.CatalogEvents()
	if d.Webhooks == nil {
		res, _ := d.send(ctx, DevResult{}, events)
		return res.Events, nil
	}
	return d.Webhooks.SendWithin(ctx, within, events...)
}

// devDiscount is the discount a Checkout session's promotion code gives its subscription (nil
// when none or unknown to the catalog).
func (d *DevStripe) devDiscount(form map[string][]string, sessionID, subID, customer string, now time.Time) map[string]any {
	var promo string
	if v := form["discounts[0][promotion_code]"]; len(v) > 0 {
		promo = v[0]
	}
	if promo == "" {
		return nil
	}
	// The session's create checked the code; it applies even if it expired since.
	coupon := d.Catalog.Coupon(promo)
	if coupon == nil {
		return nil
	}
	return map[string]any{
		"id": "di_" + strings.TrimPrefix(subID, "sub_"), "object": "discount", "coupon": coupon,
		"customer": customer, "promotion_code": promo, "subscription": subID, "start": now.Unix(), "end": nil,
		"checkout_session": sessionID, "invoice": nil, "invoice_item": nil, "subscription_item": nil,
	}
}

// bill prices an invoice of a subscription from its lines: the subscription's discount and the
// customer's balance applied (a net credit makes amount_due 0 and is kept as the customer's
// balance, which the next invoice uses, as at Stripe); sets inv.AmountDue and the invoice's
// lines and totals.
func (d *DevStripe) bill(subID, customer string, inv *stripeemu.InvoiceSpec, lines []stripeemu.InvoiceLine) {
	sub := d.Account.SubscriptionFields(subID)
	var discount map[string]any
	if obj, ok := sub["discount"].(map[string]any); ok {
		discount = obj
	}
	autoTax := false
	if m, ok := sub["automatic_tax"].(map[string]any); ok && m["enabled"] == true {
		autoTax = true
	}
	t := stripeemu.TotalsOf(lines, stripeemu.CouponOf(discount), d.Account.Balance(customer))
	d.Account.SetBalance(customer, t.EndingBalance)
	inv.AmountDue = t.AmountDue
	d.Account.SetInvoiceFields(inv.ID, stripeemu.InvoiceFields(inv.ID, subID, lines, t, discount, autoTax, false, func(p string) map[string]any {
		return d.Proxy.PriceObject(p, false)
	}))
}

// syncEntitlements makes the customer's active entitlements the features of the products of its
// live subscriptions; when they change, the event that says so
// (entitlements.active_entitlement_summary.updated, after the subscription's, as Stripe sends it).
func (d *DevStripe) syncEntitlements(customer string, at time.Time) [][]byte {
	var keys []string
	ids := d.Account.SubscriptionIDs()
	slices.Reverse(ids) // oldest first
	for _, id := range ids {
		spec, ok := d.Account.Spec(id)
		if !ok || spec.Customer != customer || !liveStatus(spec.Status) {
			continue
		}
		for _, k := range d.Catalog.PriceFeatures(spec.PriceID) {
			if !slices.Contains(keys, k) {
				keys = append(keys, k)
			}
		}
	}
	if slices.Equal(keys, d.Account.ActiveEntitlements(customer)) {
		return nil
	}
	d.Account.SetActiveEntitlements(customer, keys...)
	return [][]byte{d.event("entitlements.active_entitlement_summary.updated", d.Account.ActiveEntitlementSummary(customer, 10), at)}
}

// usageLine bills units of usage (DevUsageUnitAmount each) in arrears, up to at.
func usageLine(units int64, from, at time.Time) stripeemu.InvoiceLine {
	return stripeemu.InvoiceLine{Description: fmt.Sprintf("%d units of usage", units), Amount: DevUsageUnitAmount * units,
		Currency: "usd", Start: from, End: at, Quantity: units}
}
