package stripeemu

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"billing/internal/stripeevents"
)

// Catalog is the account's products, prices, product features and promotion codes, kept by the
// test and served by a Proxy in the shape of the pinned API (2024-06-20). stripe-mock answers
// every list with one fixture and every retrieve with the id asked for, so a sync of the catalog
// (the service's reconcile, a price's lookup key) has nothing true to read without it.
//
// It answers GET of:
//
//   - /v1/products and /v1/prices: lists newest first, with limit (10 by default, at most 100),
//     starting_after, has_more; filters active (both when absent), and for prices product,
//     lookup_keys[], type, currency, recurring[interval]; expand[] of data.product; tiers are
//     always in a tiered price (so expand[]=data.tiers is a no-op);
//   - /v1/products/{id}, /v1/prices/{id} (404 resource_missing when unknown);
//   - /v1/products/{id}/features: the product's features (product_feature objects), paged;
//   - /v1/promotion_codes (filters code, case-insensitive as Stripe's, active, customer, coupon)
//     and /v1/promotion_codes/{id}.
//
// Everything else under those paths (creates, updates, search) goes to stripe-mock as before.
// A promotion code is active while it is not Inactive, not past its ExpiresAt (by the catalog's
// clock) and not at its MaxRedemptions.
type Catalog struct {
	livemode bool

	mu         sync.Mutex
	now        func() time.Time
	products   map[string]stripeevents.Product
	prodOrder  []string // newest first
	prices     map[string]stripeevents.Price
	priceOrder []string
	features   map[string][]string // product → the lookup keys of its features, in order
	promos     map[string]*promo
	promoOrder []string
	seq        int
	idTag      string
}

// PromotionCodeSpec describes a promotion code and its coupon (duration forever). One of
// PercentOff and AmountOff is set.
type PromotionCodeSpec struct {
	ID         string // generated when empty (promo_…)
	Code       string // what the customer types; matched case-insensitively
	PercentOff float64
	AmountOff  int64
	Currency   string // of AmountOff; "usd" when empty
	// Inactive: the code was switched off (active false). The zero value is an active code.
	Inactive bool
	// ExpiresAt: the code stops being active then (zero: never).
	ExpiresAt time.Time
	// Customer restricts the code to one customer when set.
	Customer string
	// MaxRedemptions caps its redemptions (0: no cap); TimesRedeemed starts the count.
	MaxRedemptions int64
	TimesRedeemed  int64
	// CouponID is the coupon's id (generated from the code when empty).
	CouponID string
	Created  time.Time
}

type promo struct {
	spec PromotionCodeSpec
}

// NewCatalog serves a catalog of the given mode from p (and makes the Account of p, if any, show
// its prices in subscription items and price invoice previews with them).
func NewCatalog(p *Proxy, livemode bool) *Catalog {
	c := &Catalog{
		livemode: livemode, now: time.Now,
		products: map[string]stripeevents.Product{}, prices: map[string]stripeevents.Price{},
		features: map[string][]string{}, promos: map[string]*promo{},
	}
	p.mu.Lock()
	c.idTag = p.idTag
	p.catalog = c
	p.mu.Unlock()
	p.Handle("/v1/products", c.serveProducts)
	p.Handle("/v1/prices", c.servePrices)
	p.Handle("/v1/promotion_codes", c.servePromotionCodes)
	return c
}

// SetClock sets the clock that decides whether a promotion code has expired (time.Now by
// default; the dev Stripe's is its account's test clock).
func (c *Catalog) SetClock(now func() time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = now
}

// PutProduct adds a product, or replaces the one with the same id (keeping its place).
func (c *Catalog) PutProduct(p stripeevents.Product) {
	if p.ID == "" {
		panic("stripeemu: product without id")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.products[p.ID]; !ok {
		c.prodOrder = append([]string{p.ID}, c.prodOrder...)
	}
	c.products[p.ID] = p
}

// PutPrice adds a price, or replaces the one with the same id (keeping its place). A lookup key
// in use by another price moves to this one, as Stripe's transfer_lookup_key does: lookup keys
// are unique.
func (c *Catalog) PutPrice(p stripeevents.Price) {
	if p.ID == "" {
		panic("stripeemu: price without id")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if p.LookupKey != "" {
		for id, other := range c.prices {
			if id != p.ID && other.LookupKey == p.LookupKey {
				other.LookupKey = ""
				c.prices[id] = other
			}
		}
	}
	if _, ok := c.prices[p.ID]; !ok {
		c.priceOrder = append([]string{p.ID}, c.priceOrder...)
	}
	c.prices[p.ID] = p
}

// SetProductFeatures makes the features (by lookup key; their ids are feat_<key>) the product's,
// in this order. No keys: none.
func (c *Catalog) SetProductFeatures(productID string, lookupKeys ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.features[productID] = slices.Clone(lookupKeys)
}

// ProductFeatures returns the lookup keys of a product's features.
func (c *Catalog) ProductFeatures(productID string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.features[productID])
}

// PutPromotionCode adds a promotion code (or replaces the one with the same id) and returns its id.
func (c *Catalog) PutPromotionCode(s PromotionCodeSpec) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s.ID == "" {
		c.seq++
		s.ID = fmt.Sprintf("promo_proxy%s%06d", c.idTag, c.seq)
	}
	if s.CouponID == "" {
		s.CouponID = "coupon_" + strings.ToLower(s.Code)
	}
	if s.Currency == "" {
		s.Currency = "usd"
	}
	if _, ok := c.promos[s.ID]; !ok {
		c.promoOrder = append([]string{s.ID}, c.promoOrder...)
	}
	c.promos[s.ID] = &promo{spec: s}
	return s.ID
}

// Product returns a product's JSON object (nil when unknown).
func (c *Catalog) Product(id string) json.RawMessage {
	c.mu.Lock()
	defer c.mu.Unlock()
	p, ok := c.products[id]
	if !ok {
		return nil
	}
	return mustJSON(p.Object(c.livemode))
}

// Price returns a price's JSON object (nil when unknown).
func (c *Catalog) Price(id string) json.RawMessage {
	c.mu.Lock()
	defer c.mu.Unlock()
	p, ok := c.prices[id]
	if !ok {
		return nil
	}
	return mustJSON(p.Object(c.livemode))
}

// PromotionCode returns a promotion code's JSON object (nil when unknown).
func (c *Catalog) PromotionCode(id string) json.RawMessage {
	now := c.clock()
	c.mu.Lock()
	defer c.mu.Unlock()
	pc, ok := c.promos[id]
	if !ok {
		return nil
	}
	return mustJSON(c.promoObject(pc, now))
}

// Products returns the products, oldest first (the order of their product.created events).
func (c *Catalog) Products() []stripeevents.Product {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]stripeevents.Product, 0, len(c.prodOrder))
	for i := len(c.prodOrder) - 1; i >= 0; i-- {
		out = append(out, c.products[c.prodOrder[i]])
	}
	return out
}

// Prices returns the prices, oldest first.
func (c *Catalog) Prices() []stripeevents.Price {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]stripeevents.Price, 0, len(c.priceOrder))
	for i := len(c.priceOrder) - 1; i >= 0; i-- {
		out = append(out, c.prices[c.priceOrder[i]])
	}
	return out
}

// ArchiveProduct makes a product inactive (archived in the Dashboard); false when unknown.
func (c *Catalog) ArchiveProduct(id string) bool {
	now := c.clock()
	c.mu.Lock()
	defer c.mu.Unlock()
	p, ok := c.products[id]
	if ok {
		p.Inactive = true
		p.Updated = now
		c.products[id] = p
	}
	return ok
}

// ArchivePrice makes a price inactive; false when unknown.
func (c *Catalog) ArchivePrice(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	p, ok := c.prices[id]
	if ok {
		p.Inactive = true
		c.prices[id] = p
	}
	return ok
}

// DeletePrice forgets a price (as deleting test data does: a retrieve is then a 404); false when
// unknown.
func (c *Catalog) DeletePrice(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.prices[id]; !ok {
		return false
	}
	delete(c.prices, id)
	c.priceOrder = slices.DeleteFunc(c.priceOrder, func(s string) bool { return s == id })
	return true
}

// DeleteProduct forgets a product and its features; false when unknown.
func (c *Catalog) DeleteProduct(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.products[id]; !ok {
		return false
	}
	delete(c.products, id)
	delete(c.features, id)
	c.prodOrder = slices.DeleteFunc(c.prodOrder, func(s string) bool { return s == id })
	return true
}

// price returns a price and its product's name (false when the price is unknown).
func (c *Catalog) price(id string) (stripeevents.Price, string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p, ok := c.prices[id]
	if !ok {
		return p, "", false
	}
	name := c.products[p.Product].Name
	if name == "" {
		name = p.ID
	}
	return p, name, true
}

// priceObject is a price's JSON object (nil when unknown), as a subscription item carries it.
func (c *Catalog) priceObject(id string) map[string]any {
	c.mu.Lock()
	defer c.mu.Unlock()
	p, ok := c.prices[id]
	if !ok {
		return nil
	}
	return p.Object(c.livemode)
}

// PriceFeatures are the lookup keys of the features of a price's product.
func (c *Catalog) PriceFeatures(priceID string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	p, ok := c.prices[priceID]
	if !ok {
		return nil
	}
	return slices.Clone(c.features[p.Product])
}

// CouponTerms is what a promotion code takes off an invoice.
type CouponTerms struct {
	PromotionCode string
	Coupon        map[string]any // the coupon object
	PercentOff    float64
	AmountOff     int64
}

// redeemable checks that a promotion code may be redeemed by customer now and returns its
// terms; the error is Stripe's kind of refusal.
func (c *Catalog) redeemable(id, customer string) (CouponTerms, Answer, bool) {
	now := c.clock()
	c.mu.Lock()
	defer c.mu.Unlock()
	pc, ok := c.promos[id]
	if !ok {
		return CouponTerms{}, Answer{Status: http.StatusBadRequest, Body: apiError("invalid_request_error", "resource_missing",
			"No such promotion code: '"+id+"'")}, false
	}
	if !c.active(pc, now) {
		return CouponTerms{}, Answer{Status: http.StatusBadRequest, Body: apiError("invalid_request_error", "",
			"The promotion code '"+pc.spec.Code+"' is not active.")}, false
	}
	if pc.spec.Customer != "" && pc.spec.Customer != customer {
		return CouponTerms{}, Answer{Status: http.StatusBadRequest, Body: apiError("invalid_request_error", "",
			"The promotion code '"+pc.spec.Code+"' cannot be redeemed by this customer.")}, false
	}
	return CouponTerms{PromotionCode: id, Coupon: c.couponObject(pc), PercentOff: pc.spec.PercentOff, AmountOff: pc.spec.AmountOff}, Answer{}, true
}

// Coupon is a promotion code's coupon object (nil when the code is unknown).
func (c *Catalog) Coupon(id string) map[string]any {
	c.mu.Lock()
	defer c.mu.Unlock()
	if pc, ok := c.promos[id]; ok {
		return c.couponObject(pc)
	}
	return nil
}

// Redeem counts a redemption of a promotion code.
func (c *Catalog) Redeem(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if pc, ok := c.promos[id]; ok {
		pc.spec.TimesRedeemed++
	}
}

// clock reads the catalog's clock. Not under mu: the dev clock is the account's, whose lock may be
// held by a caller waiting for the catalog's.
func (c *Catalog) clock() time.Time {
	c.mu.Lock()
	now := c.now
	c.mu.Unlock()
	return now()
}

// active: call with mu held.
func (c *Catalog) active(pc *promo, now time.Time) bool {
	s := pc.spec
	return !s.Inactive && (s.ExpiresAt.IsZero() || now.Before(s.ExpiresAt)) &&
		(s.MaxRedemptions == 0 || s.TimesRedeemed < s.MaxRedemptions)
}

// couponObject: call with mu held.
func (c *Catalog) couponObject(pc *promo) map[string]any {
	s := pc.spec
	var pct, amt, cur any
	if s.AmountOff > 0 {
		amt, cur = s.AmountOff, s.Currency
	} else {
		pct = s.PercentOff
	}
	return map[string]any{
		"id": s.CouponID, "object": "coupon", "amount_off": amt, "currency": cur, "percent_off": pct,
		"duration": "forever", "duration_in_months": nil, "livemode": c.livemode, "metadata": map[string]any{},
		"name": s.Code, "created": createdOr(s.Created), "max_redemptions": nil, "redeem_by": nil,
		"times_redeemed": s.TimesRedeemed, "valid": true,
	}
}

// promoObject: call with mu held.
func (c *Catalog) promoObject(pc *promo, now time.Time) map[string]any {
	s := pc.spec
	var maxR any
	if s.MaxRedemptions > 0 {
		maxR = s.MaxRedemptions
	}
	return map[string]any{
		"id": s.ID, "object": "promotion_code", "active": c.active(pc, now), "code": s.Code,
		"coupon": c.couponObject(pc), "created": createdOr(s.Created), "customer": nullable(s.Customer),
		"expires_at": unixOrNull(s.ExpiresAt), "livemode": c.livemode, "max_redemptions": maxR,
		"metadata": map[string]any{}, "times_redeemed": s.TimesRedeemed,
		"restrictions": map[string]any{"currency_options": map[string]any{}, "first_time_transaction": false,
			"minimum_amount": nil, "minimum_amount_currency": nil},
	}
}

func createdOr(t time.Time) int64 {
	if t.IsZero() {
		return 1700000000
	}
	return t.Unix()
}

func (c *Catalog) serveProducts(r Request) Answer {
	if r.Method != http.MethodGet {
		return pass()
	}
	parts := strings.Split(strings.Trim(r.Path, "/"), "/") // v1 products [id [features]]
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case len(parts) == 2:
		var ids map[string]bool
		if v := listParam(r.Query, "ids"); len(v) > 0 {
			ids = map[string]bool{}
			for _, id := range v {
				ids[id] = true
			}
		}
		active := r.Query.Get("active")
		return page("/v1/products", c.prodOrder, r.Query, func(id string) (any, bool) {
			p := c.products[id]
			if (active != "" && strconv.FormatBool(!p.Inactive) != active) || (ids != nil && !ids[id]) {
				return nil, false
			}
			return p.Object(c.livemode), true
		})
	case len(parts) == 3 && parts[2] == "search":
		return pass()
	case len(parts) == 3:
		p, ok := c.products[parts[2]]
		if !ok {
			return notFound(parts[2])
		}
		return Answer{Status: http.StatusOK, Body: p.Object(c.livemode)}
	case len(parts) == 4 && parts[3] == "features":
		if _, ok := c.products[parts[2]]; !ok {
			return notFound(parts[2])
		}
		keys := c.features[parts[2]]
		ids := make([]string, len(keys))
		byID := map[string]string{}
		for i, k := range keys {
			ids[i] = productFeatureID(parts[2], k)
			byID[ids[i]] = k
		}
		return page(r.Path, ids, r.Query, func(id string) (any, bool) {
			k := byID[id]
			return map[string]any{
				"id": id, "object": "product_feature", "livemode": c.livemode,
				"entitlement_feature": map[string]any{
					"id": "feat_" + k, "object": "entitlements.feature", "active": true, "livemode": c.livemode,
					"lookup_key": k, "metadata": map[string]any{}, "name": k,
				},
			}, true
		})
	}
	return pass()
}

func productFeatureID(productID, key string) string {
	return "prodft_" + strings.TrimPrefix(productID, "prod_") + "_" + key
}

func (c *Catalog) servePrices(r Request) Answer {
	if r.Method != http.MethodGet {
		return pass()
	}
	parts := strings.Split(strings.Trim(r.Path, "/"), "/")
	expand := expansions(r.Query)
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case len(parts) == 2:
		q := r.Query
		var keys map[string]bool
		if v := listParam(q, "lookup_keys"); len(v) > 0 {
			keys = map[string]bool{}
			for _, k := range v {
				keys[k] = true
			}
		}
		return page("/v1/prices", c.priceOrder, q, func(id string) (any, bool) {
			p := c.prices[id]
			typ := "one_time"
			if p.Interval != "" {
				typ = "recurring"
			}
			switch {
			case q.Get("active") != "" && strconv.FormatBool(!p.Inactive) != q.Get("active"),
				q.Get("product") != "" && p.Product != q.Get("product"),
				keys != nil && !keys[p.LookupKey],
				q.Get("type") != "" && q.Get("type") != typ,
				q.Get("currency") != "" && !strings.EqualFold(q.Get("currency"), orUSD(p.Currency)),
				q.Get("recurring[interval]") != "" && q.Get("recurring[interval]") != p.Interval:
				return nil, false
			}
			return c.expandPrice(p, expand["data.product"]), true
		})
	case len(parts) == 3 && parts[2] == "search":
		return pass()
	case len(parts) == 3:
		p, ok := c.prices[parts[2]]
		if !ok {
			return notFound(parts[2])
		}
		return Answer{Status: http.StatusOK, Body: c.expandPrice(p, expand["product"])}
	}
	return pass()
}

// expandPrice: call with mu held.
func (c *Catalog) expandPrice(p stripeevents.Price, product bool) map[string]any {
	obj := p.Object(c.livemode)
	if prod, ok := c.products[p.Product]; ok && product {
		obj["product"] = prod.Object(c.livemode)
	}
	return obj
}

func (c *Catalog) servePromotionCodes(r Request) Answer {
	if r.Method != http.MethodGet {
		return pass()
	}
	parts := strings.Split(strings.Trim(r.Path, "/"), "/")
	now := c.clock()
	c.mu.Lock()
	defer c.mu.Unlock()
	switch len(parts) {
	case 2:
		q := r.Query
		return page("/v1/promotion_codes", c.promoOrder, q, func(id string) (any, bool) {
			pc := c.promos[id]
			switch {
			case q.Get("code") != "" && !strings.EqualFold(q.Get("code"), pc.spec.Code),
				q.Get("active") != "" && strconv.FormatBool(c.active(pc, now)) != q.Get("active"),
				q.Get("customer") != "" && q.Get("customer") != pc.spec.Customer,
				q.Get("coupon") != "" && q.Get("coupon") != pc.spec.CouponID:
				return nil, false
			}
			return c.promoObject(pc, now), true
		})
	case 3:
		pc, ok := c.promos[parts[2]]
		if !ok {
			return notFound(parts[2])
		}
		return Answer{Status: http.StatusOK, Body: c.promoObject(pc, now)}
	}
	return pass()
}

// page answers a list page over ids (in list order) as Stripe pages it: limit (10 by default, 1
// to 100), starting_after (an id of the list, filtered out or not) and has_more. obj gives an
// id's object, false for one the filters leave out.
func page(listURL string, ids []string, q url.Values, obj func(id string) (any, bool)) Answer {
	limit := 10
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 100 {
			return Answer{Status: http.StatusBadRequest, Body: apiError("invalid_request_error", "parameter_invalid_integer", "limit must be between 1 and 100")}
		}
		limit = n
	}
	start := 0
	if after := q.Get("starting_after"); after != "" {
		i := slices.Index(ids, after)
		if i < 0 {
			return Answer{Status: http.StatusBadRequest, Body: apiError("invalid_request_error", "resource_missing", "No such object: '"+after+"'")}
		}
		start = i + 1
	}
	data := []any{}
	hasMore := false
	for _, id := range ids[start:] {
		o, ok := obj(id)
		if !ok {
			continue
		}
		if len(data) == limit {
			hasMore = true
			break
		}
		data = append(data, o)
	}
	return Answer{Status: http.StatusOK, Body: map[string]any{"object": "list", "url": listURL, "has_more": hasMore, "data": data}}
}

// listParam reads an array parameter as stripe-go sends it (name[0], name[1], …) or as name[].
func listParam(q url.Values, name string) []string {
	var out []string
	out = append(out, q[name+"[]"]...)
	for i := 0; ; i++ {
		v, ok := q[name+"["+strconv.Itoa(i)+"]"]
		if !ok {
			break
		}
		out = append(out, v...)
	}
	return out
}

func orUSD(cur string) string {
	if cur == "" {
		return "usd"
	}
	return cur
}
