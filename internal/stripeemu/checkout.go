package stripeemu

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// CheckoutSessions is Stripe's Checkout Sessions kept by the test, served at
// /v1/checkout/sessions: create (the form's customer, client_reference_id, URLs and metadata
// reflected into the object; the request itself is in the proxy's record), retrieve, and the list
// by customer and created[gte], newest first. stripe-mock answers every session
// with the same fixture; a session that the success page reads back, or that a lookup past the
// key window must find, needs this state. The test plays the customer: Complete pays a session.
type CheckoutSessions struct {
	mu       sync.Mutex
	seq      int
	byID     map[string]map[string]any
	order    []string // ids in creation order
	livemode bool
	now      func() time.Time
	// forms are the creates' parameters by session: what Stripe knows of a session beyond the
	// object (line items, subscription_data), which completing it needs.
	forms map[string]url.Values
	idTag string // the proxy's (SetIDTag): ids unique across restarts
	// pageBase: a session's url is pageBase+id instead of Stripe's page (SetPageBase).
	pageBase string
	p        *Proxy
}

// NewCheckoutSessions serves the sessions of one mode on p.
func NewCheckoutSessions(p *Proxy, livemode bool) *CheckoutSessions {
	c := &CheckoutSessions{byID: map[string]map[string]any{}, livemode: livemode, now: time.Now, forms: map[string]url.Values{}, p: p}
	p.mu.Lock()
	c.idTag = p.idTag
	p.mu.Unlock()
	p.Handle("/v1/checkout/sessions", c.serve)
	return c
}

// Request returns the parameters of the create that made a session (nil when it was added).
func (c *CheckoutSessions) Request(id string) url.Values {
	c.mu.Lock()
	defer c.mu.Unlock()
	if f, ok := c.forms[id]; ok {
		return maps.Clone(f)
	}
	return nil
}

// Complete marks a session paid and complete with its subscription, as Stripe does when the
// customer finishes Checkout, and returns the object (the data.object of its events).
func (c *CheckoutSessions) Complete(id, subscriptionID string) map[string]any {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.byID[id]
	if s == nil {
		panic(fmt.Sprintf("stripeemu: no checkout session %s", id))
	}
	s["status"] = "complete"
	s["payment_status"] = "paid"
	s["subscription"] = subscriptionID
	s["url"] = nil
	return checkoutCopy(s)
}

// Add stores a session made elsewhere (a Payment Link, the Dashboard) and returns its id.
func (c *CheckoutSessions) Add(obj map[string]any) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := checkoutCopy(obj)
	id, _ := s["id"].(string)
	if id == "" {
		id = c.nextID()
		s["id"] = id
	}
	s["object"] = "checkout.session"
	if _, ok := s["livemode"]; !ok {
		s["livemode"] = c.livemode
	}
	if _, ok := s["created"]; !ok {
		s["created"] = c.now().Unix()
	}
	c.byID[id] = s
	c.order = append(c.order, id)
	return id
}

// Get returns a copy of a session, nil when there is none.
func (c *CheckoutSessions) Get(id string) map[string]any {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.byID[id]; s != nil {
		return checkoutCopy(s)
	}
	return nil
}

// Len is the number of sessions.
func (c *CheckoutSessions) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.order)
}

func (c *CheckoutSessions) serve(r Request) Answer {
	rest := strings.Trim(strings.TrimPrefix(r.Path, "/v1/checkout/sessions"), "/")
	switch {
	case rest == "" && r.Method == http.MethodPost:
		return c.create(r)
	case rest == "" && r.Method == http.MethodGet:
		return c.list(r)
	case !strings.Contains(rest, "/") && r.Method == http.MethodGet:
		if s := c.Get(rest); s != nil {
			return Answer{Status: http.StatusOK, Body: s}
		}
		return checkoutError(http.StatusNotFound, "resource_missing", "No such checkout.session: '"+rest+"'")
	}
	return checkoutError(http.StatusNotFound, "resource_missing", "proxy: unsupported checkout session request "+r.Method+" "+r.Path)
}

func (c *CheckoutSessions) create(r Request) Answer {
	f := r.Form
	if f.Get("mode") == "" || f.Get("line_items[0][price]") == "" {
		return checkoutError(http.StatusBadRequest, "parameter_missing", "mode and line_items are required")
	}
	md := metadataOf(f)
	promo := f.Get("discounts[0][promotion_code]")
	if promo != "" && f.Get("allow_promotion_codes") == "true" {
		return checkoutError(http.StatusBadRequest, "", "You may only specify one of these parameters: allow_promotion_codes, discounts.")
	}
	// A promotion code is checked against the catalog when there is one (else, as before, taken
	// as given).
	c.p.mu.Lock()
	catalog := c.p.catalog
	c.p.mu.Unlock()
	if promo != "" && catalog != nil {
		if _, refusal, ok := catalog.redeemable(promo, f.Get("customer")); !ok {
			return refusal
		}
	}
	discounts := []any{}
	if promo != "" {
		discounts = append(discounts, map[string]any{"coupon": nil, "promotion_code": promo})
	}
	autoTax := map[string]any{"enabled": false, "liability": nil, "status": nil}
	if f.Get("automatic_tax[enabled]") == "true" {
		// Tax is 0 everywhere at the test double; the calculation is complete.
		autoTax = map[string]any{"enabled": true, "liability": map[string]any{"type": "self"}, "status": "complete"}
	}
	var allowCodes any // null unless asked, as Stripe answers it
	if f.Has("allow_promotion_codes") {
		allowCodes = f.Get("allow_promotion_codes") == "true"
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	id := c.nextID()
	now := c.now()
	s := map[string]any{
		"id": id, "object": "checkout.session", "livemode": c.livemode, "mode": f.Get("mode"),
		"status": "open", "payment_status": "unpaid", "created": now.Unix(), "expires_at": now.Add(24 * time.Hour).Unix(),
		"customer": checkoutNullable(f.Get("customer")), "client_reference_id": checkoutNullable(f.Get("client_reference_id")),
		"success_url": f.Get("success_url"), "cancel_url": f.Get("cancel_url"),
		"url":          c.pageURL(id),
		"metadata":     md,
		"subscription": nil,
		"discounts":    discounts, "automatic_tax": autoTax,
		"allow_promotion_codes": allowCodes,
	}
	c.byID[id] = s
	c.order = append(c.order, id)
	c.forms[id] = maps.Clone(f)
	return Answer{Status: http.StatusOK, Body: checkoutCopy(s)}
}

// SetPageBase makes a new session's url base+id, a page of the program serving the sessions (the
// dev Stripe's), instead of Stripe's, which knows no session of ours.
func (c *CheckoutSessions) SetPageBase(base string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pageBase = base
}

func (c *CheckoutSessions) pageURL(id string) string {
	if c.pageBase != "" {
		return c.pageBase + id
	}
	return "https://checkout.stripe.com/c/pay/" + id
}

func (c *CheckoutSessions) list(r Request) Answer {
	customer := r.Query.Get("customer")
	var since int64
	if v := r.Query.Get("created[gte]"); v != "" {
		since, _ = strconv.ParseInt(v, 10, 64)
	}
	c.mu.Lock()
	data := []map[string]any{}
	for _, id := range c.order {
		s := c.byID[id]
		created := checkoutInt(s["created"])
		if (customer == "" || s["customer"] == customer) && created >= since {
			data = append(data, checkoutCopy(s))
		}
	}
	c.mu.Unlock()
	// Newest first, as Stripe lists.
	for i, j := 0, len(data)-1; i < j; i, j = i+1, j-1 {
		data[i], data[j] = data[j], data[i]
	}
	return Answer{Status: http.StatusOK, Body: map[string]any{"object": "list", "data": data, "has_more": false, "url": "/v1/checkout/sessions"}}
}

func (c *CheckoutSessions) nextID() string {
	c.seq++
	mode := "test"
	if c.livemode {
		mode = "live"
	}
	return fmt.Sprintf("cs_%s_proxy%s%06d", mode, c.idTag, c.seq)
}

func checkoutCopy(m map[string]any) map[string]any {
	b, _ := json.Marshal(m)
	var out map[string]any
	_ = json.Unmarshal(b, &out)
	return out
}

func checkoutInt(v any) int64 {
	switch n := v.(type) {
	case int64:
		return n
	case float64:
		return int64(n)
	}
	return 0
}

func checkoutNullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func checkoutError(status int, code, msg string) Answer {
	return Answer{Status: status, Body: map[string]any{"error": map[string]any{
		"type": "invalid_request_error", "code": code, "message": msg}}}
}
