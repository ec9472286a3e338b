package stripeevents

import "time"

// Product is the part of a Stripe product the service reads.
type Product struct {
	ID          string
	Name        string
	Description string
	// Inactive: the product is archived (active false).
	Inactive bool
	Created  time.Time
	Updated  time.Time
}

// Object is the product as the API (2024-06-20) returns it.
func (p Product) Object(livemode bool) map[string]any {
	created := p.Created
	if created.IsZero() {
		created = time.Unix(1700000000, 0)
	}
	updated := p.Updated
	if updated.IsZero() {
		updated = created
	}
	return map[string]any{
		"id": p.ID, "object": "product", "active": !p.Inactive, "livemode": livemode,
		"name": p.Name, "description": nullIfEmpty(p.Description), "metadata": map[string]any{},
		"created": created.Unix(), "updated": updated.Unix(), "type": "service",
		"default_price": nil, "images": []any{}, "marketing_features": []any{},
		"package_dimensions": nil, "shippable": nil, "statement_descriptor": nil,
		"tax_code": nil, "unit_label": nil, "url": nil,
	}
}

// Tier is one tier of a tiered price.
type Tier struct {
	// UpTo is the tier's upper bound; 0 is "inf".
	UpTo       int64
	UnitAmount int64
	FlatAmount int64
}

// Price is the part of a Stripe price the service reads.
type Price struct {
	ID        string
	Product   string
	LookupKey string
	Nickname  string
	// Currency is "usd" when empty.
	Currency   string
	UnitAmount int64
	// Interval is "month", "year", …; empty: a one-time price.
	Interval      string
	IntervalCount int64
	// UsageType is "licensed" when empty (recurring prices only).
	UsageType string
	Meter     string
	// Tiers make the price tiered (billing_scheme "tiered", tiers_mode "graduated").
	Tiers    []Tier
	Inactive bool
	Created  time.Time
}

// Object is the price as the API (2024-06-20) returns it, tiers expanded.
func (p Price) Object(livemode bool) map[string]any {
	created := p.Created
	if created.IsZero() {
		created = time.Unix(1700000000, 0)
	}
	obj := map[string]any{
		"id": p.ID, "object": "price", "active": !p.Inactive, "livemode": livemode,
		"product": p.Product, "lookup_key": nullIfEmpty(p.LookupKey), "nickname": nullIfEmpty(p.Nickname),
		"currency": orDefault(p.Currency, "usd"), "unit_amount": p.UnitAmount,
		"unit_amount_decimal": nil, "billing_scheme": "per_unit", "tiers_mode": nil,
		"created": created.Unix(), "metadata": map[string]any{}, "tax_behavior": "unspecified",
		"transform_quantity": nil, "custom_unit_amount": nil, "type": "one_time", "recurring": nil,
	}
	if p.Interval != "" {
		count := p.IntervalCount
		if count == 0 {
			count = 1
		}
		obj["type"] = "recurring"
		obj["recurring"] = map[string]any{
			"interval": p.Interval, "interval_count": count, "usage_type": orDefault(p.UsageType, "licensed"),
			"meter": nullIfEmpty(p.Meter), "aggregate_usage": nil, "trial_period_days": nil,
		}
	}
	if len(p.Tiers) > 0 {
		tiers := make([]any, len(p.Tiers))
		for i, t := range p.Tiers {
			var upTo any
			if t.UpTo > 0 {
				upTo = t.UpTo
			}
			tiers[i] = map[string]any{"up_to": upTo, "unit_amount": t.UnitAmount, "flat_amount": t.FlatAmount,
				"unit_amount_decimal": nil, "flat_amount_decimal": nil}
		}
		obj["billing_scheme"], obj["tiers_mode"], obj["tiers"], obj["unit_amount"] = "tiered", "graduated", tiers, nil
	}
	return obj
}

// ProductEvent is a signed-ready product.created|updated|deleted event.
func ProductEvent(id, typ string, created time.Time, livemode bool, p Product) []byte {
	return Event(id, typ, created, livemode, p.Object(livemode), nil)
}

// PriceEvent is a signed-ready price.created|updated|deleted event.
func PriceEvent(id, typ string, created time.Time, livemode bool, p Price) []byte {
	return Event(id, typ, created, livemode, p.Object(livemode), nil)
}

// product is the sample product of `billing trigger product.*`: prod_<suffix>.
func (s *sample) product() map[string]any {
	return Product{ID: "prod_" + s.o.Suffix, Name: "Sample " + s.o.Suffix, Created: s.now, Updated: s.now}.Object(s.o.Livemode)
}

// price is the sample price of `billing trigger price.*`: price_<suffix> of prod_<suffix>, 20.00
// a month, with the lookup key sample_<suffix>.
func (s *sample) price() map[string]any {
	return Price{ID: "price_" + s.o.Suffix, Product: "prod_" + s.o.Suffix, LookupKey: "sample_" + s.o.Suffix,
		UnitAmount: 2000, Interval: "month", Created: s.now}.Object(s.o.Livemode)
}
