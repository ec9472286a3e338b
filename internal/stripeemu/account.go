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
)

// Account is a programmable Stripe account served by a Proxy: subscriptions (each with its latest
// invoice) and customers that the test sets up and changes, answered the way Stripe's API
// (version 2024-06-20) answers them. stripe-mock keeps no state, so a reconciliation needs this
// to have something true to compare with.
//
// It answers, under /v1/subscriptions, /v1/customers, /v1/invoices and
// /v1/entitlements/active_entitlements:
//
//   - lists newest first, with limit (10 by default, at most 100), starting_after, has_more,
//     status (all, or one status; canceled ones only when asked) and customer;
//   - expand[] of data.latest_invoice and data.customer (latest_invoice and customer on a
//     retrieve);
//   - retrieve, create, update (a few fields) and DELETE (cancel) of subscriptions; retrieve,
//     create, update and search by metadata of customers; retrieve of invoices;
//   - the pages of a customer's active entitlements (SetActiveEntitlements; none by default),
//     which stripe-mock answers with one fixture whatever the customer;
//   - with a Catalog on the same proxy, the catalog's price objects in subscription items, and
//     POST /v1/invoices/create_preview of a change to one of its subscriptions (preview.go; any
//     other preview is stripe-mock's).
//
// Throttle makes it answer 429s, SetPageDelay makes list pages slow; the proxy's own faults,
// gates and canned answers come first, as for any request.
//
// Its ids carry the proxy's tag (SetIDTag: unique across restarts). UseWallClock makes its clock
// the wall clock moved on by Advance (a test clock) instead of a counter from a fixed date, and
// SetNewCustomerCard gives a new customer that names no payment method a default one (both for
// the dev Stripe).
type Account struct {
	p        *Proxy
	livemode bool
	idTag    string
	// wall: the clock is the wall clock moved on by offset (UseWallClock).
	wall bool
	// newCustomerCard is the default payment method of a new customer that names none ("": none).
	newCustomerCard string
	// offset is how far Advance moved the wall clock on.
	offset time.Duration

	mu        sync.Mutex
	subs      map[string][]byte // subscription JSON with latest_invoice and customer as ids
	subOrder  []string          // newest first
	customers map[string][]byte
	custOrder []string
	invoices  map[string][]byte
	// entitlements are the lookup keys of each customer's active entitlements, in Stripe's order.
	entitlements map[string][]string
	// entPageSize caps a page of active entitlements (0: as asked).
	entPageSize int
	seq         int
	clock       int64 // created of the next object (unix seconds), counts up

	pageDelay   time.Duration
	holds       []*pageHold
	throttle    int
	throttleHdr http.Header
	pages       int
	entPages    int
	requests    int

	// subFields and invFields are fields of subscriptions and invoices beyond what a spec holds
	// (a discount, computed lines and totals), kept across puts.
	subFields map[string]map[string]any
	invFields map[string]map[string]any
	// pendingItems are each subscription's pending invoice items (prorations), which its next
	// invoice bills; balances are the customers' balances (negative: credit, Stripe's sign).
	pendingItems map[string][]InvoiceLine
	balances     map[string]int64
}

// NewAccount serves an account of the given mode from p.
func NewAccount(p *Proxy, livemode bool) *Account {
	a := &Account{
		p:            p,
		livemode:     livemode,
		subFields:    map[string]map[string]any{},
		invFields:    map[string]map[string]any{},
		pendingItems: map[string][]InvoiceLine{},
		balances:     map[string]int64{},
		subs:         map[string][]byte{},
		customers:    map[string][]byte{},
		invoices:     map[string][]byte{},
		entitlements: map[string][]string{},
		clock:        1700000000,
	}
	p.mu.Lock()
	a.idTag = p.idTag
	p.mu.Unlock()
	// Charges without a payment method use the default source of the account's customer.
	p.setCustomerSource(a.DefaultSource)
	p.Handle("/v1/subscriptions", a.serve)
	p.Handle("/v1/customers", a.serve)
	p.Handle("/v1/invoices", a.serve)
	p.Handle("/v1/entitlements/active_entitlements", a.serveEntitlements)
	// The preview of a change to a subscription of the account, priced from the catalog.
	p.Handle("/v1/invoices/create_preview", a.servePreview)
	return a
}

// CustomerSpec describes a customer to add.
type CustomerSpec struct {
	ID       string // generated when empty
	Email    string
	Name     string
	Metadata map[string]string
	// DefaultPaymentMethod is invoice_settings.default_payment_method (a test card: pm_card_…).
	DefaultPaymentMethod string
}

// InvoiceSpec describes a subscription's latest invoice.
type InvoiceSpec struct {
	ID                 string // generated when empty
	Status             string // draft, open, paid, void, uncollectible
	AttemptCount       int64
	AmountDue          int64
	Currency           string // "usd" when empty
	NextPaymentAttempt time.Time
	HostedInvoiceURL   string
	// Created is the invoice's own creation (zero: the subscription's); AmountPaid,
	// BillingReason (subscription_create, subscription_cycle) and the period it bills are
	// omitted when zero.
	Created       time.Time
	AmountPaid    int64
	BillingReason string
	PeriodStart   time.Time
	PeriodEnd     time.Time
}

// SubscriptionSpec describes a subscription to add or replace. Zero times are null.
type SubscriptionSpec struct {
	ID                 string // generated when empty
	Customer           string
	Status             string
	PriceID            string
	Quantity           int64 // 1 when zero
	Created            time.Time
	CurrentPeriodStart time.Time
	CurrentPeriodEnd   time.Time
	CancelAtPeriodEnd  bool
	CancelAt           time.Time
	CanceledAt         time.Time
	EndedAt            time.Time
	TrialStart         time.Time
	TrialEnd           time.Time
	Metadata           map[string]string
	LatestInvoice      *InvoiceSpec
}

// AddCustomer adds a customer and returns its id.
func (a *Account) AddCustomer(c CustomerSpec) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if c.ID == "" {
		c.ID = a.nextID("cus_")
	}
	md := map[string]any{}
	for k, v := range c.Metadata {
		md[k] = v
	}
	obj := map[string]any{
		"id": c.ID, "object": "customer", "email": nullable(c.Email), "name": nullable(c.Name),
		"metadata": md, "livemode": a.livemode, "created": a.tick(), "deleted": nil,
		"invoice_settings": map[string]any{"default_payment_method": nullable(c.DefaultPaymentMethod)},
		"default_source":   nil,
	}
	if _, ok := a.customers[c.ID]; !ok {
		a.custOrder = append([]string{c.ID}, a.custOrder...)
	}
	a.customers[c.ID] = mustJSON(obj)
	return c.ID
}

// PutSubscription adds a subscription, or replaces the one with the same id (keeping its place in
// the list), and returns its id.
func (a *Account) PutSubscription(s SubscriptionSpec) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.put(s)
}

func (a *Account) put(s SubscriptionSpec) string {
	if s.ID == "" {
		s.ID = a.nextID("sub_")
	}
	if s.Quantity == 0 {
		s.Quantity = 1
	}
	created := a.tick()
	if !s.Created.IsZero() {
		created = s.Created.Unix()
	}
	md := map[string]any{}
	for k, v := range s.Metadata {
		md[k] = v
	}
	var latest any
	if inv := s.LatestInvoice; inv != nil {
		if inv.ID == "" {
			inv.ID = a.nextID("in_")
		}
		cur := inv.Currency
		if cur == "" {
			cur = "usd"
		}
		obj := map[string]any{
			"id": inv.ID, "object": "invoice", "status": inv.Status, "customer": s.Customer,
			"subscription": s.ID, "attempt_count": inv.AttemptCount, "attempted": inv.AttemptCount > 0,
			"amount_due": inv.AmountDue, "currency": cur, "livemode": a.livemode,
			"next_payment_attempt": unixOrNull(inv.NextPaymentAttempt),
			"hosted_invoice_url":   nullable(inv.HostedInvoiceURL), "created": created,
		}
		if !inv.Created.IsZero() {
			obj["created"] = inv.Created.Unix()
		}
		if inv.AmountPaid != 0 {
			obj["amount_paid"] = inv.AmountPaid
		}
		if inv.BillingReason != "" {
			obj["billing_reason"] = inv.BillingReason
		}
		if !inv.PeriodStart.IsZero() {
			obj["period_start"], obj["period_end"] = inv.PeriodStart.Unix(), unixOrNull(inv.PeriodEnd)
		}
		for k, v := range a.invFields[inv.ID] {
			obj[k] = v
		}
		a.invoices[inv.ID] = mustJSON(obj)
		latest = inv.ID
	}
	price := a.p.PriceObject(s.PriceID, a.livemode)
	obj := map[string]any{
		"id": s.ID, "object": "subscription", "customer": s.Customer, "status": s.Status,
		"livemode": a.livemode, "created": created, "metadata": md, "quantity": s.Quantity,
		"current_period_start": unixOrNull(s.CurrentPeriodStart),
		"current_period_end":   unixOrNull(s.CurrentPeriodEnd),
		"cancel_at_period_end": s.CancelAtPeriodEnd,
		"cancel_at":            unixOrNull(s.CancelAt),
		"canceled_at":          unixOrNull(s.CanceledAt),
		"ended_at":             unixOrNull(s.EndedAt),
		"trial_start":          unixOrNull(s.TrialStart),
		"trial_end":            unixOrNull(s.TrialEnd),
		"latest_invoice":       latest,
		"items": map[string]any{"object": "list", "has_more": false, "url": "/v1/subscription_items?subscription=" + s.ID,
			"data": []any{map[string]any{
				"id": itemID(s.ID), "object": "subscription_item", "price": price,
				"quantity": s.Quantity, "subscription": s.ID, "created": created,
			}}},
	}
	for k, v := range a.subFields[s.ID] {
		obj[k] = v
	}
	if _, ok := a.subs[s.ID]; !ok {
		a.subOrder = append([]string{s.ID}, a.subOrder...)
	}
	a.subs[s.ID] = mustJSON(obj)
	return s.ID
}

// SetSubscriptionFields sets fields of a subscription's object that a spec does not hold (its
// discount, automatic_tax), now and on every later put.
func (a *Account) SetSubscriptionFields(id string, fields map[string]any) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.subFields[id] = mergeFields(a.subFields[id], fields)
	if raw, ok := a.subs[id]; ok {
		a.subs[id] = mustJSON(mergeFields(decode(raw), fields))
	}
}

// SetInvoiceFields sets fields of an invoice's object that a spec does not hold (lines, totals,
// discount), now and on every later put.
func (a *Account) SetInvoiceFields(id string, fields map[string]any) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.invFields[id] = mergeFields(a.invFields[id], fields)
	if raw, ok := a.invoices[id]; ok {
		a.invoices[id] = mustJSON(mergeFields(decode(raw), fields))
	}
}

// SubscriptionFields are the fields set by SetSubscriptionFields, as JSON decodes them.
func (a *Account) SubscriptionFields(id string) map[string]any {
	a.mu.Lock()
	defer a.mu.Unlock()
	return decode(mustJSON(a.subFields[id]))
}

func mergeFields(dst, src map[string]any) map[string]any {
	if dst == nil {
		dst = map[string]any{}
	}
	for k, v := range src {
		dst[k] = v
	}
	return dst
}

// PendingItems returns a subscription's pending invoice items (prorations not yet invoiced).
func (a *Account) PendingItems(subscriptionID string) []InvoiceLine {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.pendingItems[subscriptionID])
}

func (a *Account) AddPendingItems(subscriptionID string, lines ...InvoiceLine) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pendingItems[subscriptionID] = append(a.pendingItems[subscriptionID], lines...)
}

// TakePendingItems returns a subscription's pending items and clears them (an invoice bills them).
func (a *Account) TakePendingItems(subscriptionID string) []InvoiceLine {
	a.mu.Lock()
	defer a.mu.Unlock()
	lines := a.pendingItems[subscriptionID]
	delete(a.pendingItems, subscriptionID)
	return lines
}

// Balance is a customer's balance in cents (negative: a credit that the next invoice uses).
func (a *Account) Balance(customerID string) int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.balances[customerID]
}

func (a *Account) SetBalance(customerID string, b int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.balances[customerID] = b
}

// ActiveEntitlements returns the lookup keys of a customer's active entitlements.
func (a *Account) ActiveEntitlements(customerID string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.entitlements[customerID])
}

// PutSubscriptionJSON stores a subscription object as given (an event's data.object), replacing
// the one with the same id, and returns its id. An expanded latest_invoice is stored as the
// account's invoice and kept as its id.
func (a *Account) PutSubscriptionJSON(raw json.RawMessage) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	obj := decode(raw)
	id, _ := obj["id"].(string)
	if id == "" {
		panic("stripeemu: subscription object without id")
	}
	if inv, ok := obj["latest_invoice"].(map[string]any); ok {
		invID, _ := inv["id"].(string)
		a.invoices[invID] = mustJSON(inv)
		obj["latest_invoice"] = invID
	}
	if c, ok := obj["customer"].(map[string]any); ok {
		obj["customer"] = c["id"]
	}
	if _, ok := a.subs[id]; !ok {
		a.subOrder = append([]string{id}, a.subOrder...)
	}
	a.subs[id] = mustJSON(obj)
	return id
}

// UpdateSubscription edits a subscription's JSON object (latest_invoice and customer are ids).
func (a *Account) UpdateSubscription(id string, edit func(obj map[string]any)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	raw, ok := a.subs[id]
	if !ok {
		panic("stripeemu: no subscription " + id)
	}
	obj := decode(raw)
	edit(obj)
	a.subs[id] = mustJSON(obj)
}

// SetLatestInvoice replaces a subscription's latest invoice.
func (a *Account) SetLatestInvoice(subscriptionID string, inv InvoiceSpec) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	obj := decode(a.subs[subscriptionID])
	spec := specOf(obj, a.invoices)
	spec.LatestInvoice = &inv
	spec.Created = time.Unix(int64(obj["created"].(float64)), 0)
	a.put(spec)
	return inv.ID
}

// RemoveSubscription makes Stripe forget a subscription (as deleting test data does).
func (a *Account) RemoveSubscription(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.subs, id)
	a.subOrder = slices.DeleteFunc(a.subOrder, func(s string) bool { return s == id })
}

// Subscription returns a subscription as a retrieve with latest_invoice expanded answers it
// (nil when unknown): what an event's data.object or a snapshot carries.
func (a *Account) Subscription(id string) json.RawMessage {
	a.mu.Lock()
	defer a.mu.Unlock()
	raw, ok := a.subs[id]
	if !ok {
		return nil
	}
	return mustJSON(a.expand(decode(raw), map[string]bool{"latest_invoice": true}))
}

// Spec returns a subscription as a spec (with its latest invoice and its created), to change and
// put back; false when unknown.
func (a *Account) Spec(id string) (SubscriptionSpec, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	raw, ok := a.subs[id]
	if !ok {
		return SubscriptionSpec{}, false
	}
	obj := decode(raw)
	spec := specOf(obj, a.invoices)
	spec.Created = time.Unix(int64(obj["created"].(float64)), 0)
	return spec, true
}

// Now is the account's clock: with UseWallClock the wall clock moved on by Advance.
func (a *Account) Now() time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.now()
}

// UseWallClock makes the account's clock the wall clock (moved on by Advance), from now on.
func (a *Account) UseWallClock() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.wall = true
	a.clock = max(a.clock, time.Now().Unix())
}

// SetNewCustomerCard gives a customer created through the API that names no payment method pm
// as its invoice_settings.default_payment_method ("": none).
func (a *Account) SetNewCustomerCard(pm string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.newCustomerCard = pm
}

// Advance moves the account's clock on by d (a test clock); it never goes back.
func (a *Account) Advance(d time.Duration) time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case d <= 0:
	case a.wall:
		a.offset += d
	default:
		a.clock += int64(d / time.Second)
	}
	return a.now()
}

// NewInvoiceID makes an id for an invoice to put (unique like the account's other ids).
func (a *Account) NewInvoiceID() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.nextID("in_")
}

// NewSubscriptionID makes an id for a subscription to put (to set its fields first).
func (a *Account) NewSubscriptionID() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.nextID("sub_")
}

// SetDefaultPaymentMethod sets a customer's invoice_settings.default_payment_method, as an update
// does.
func (a *Account) SetDefaultPaymentMethod(customerID, pm string) bool {
	return a.saveCustomer(customerID, url.Values{"invoice_settings[default_payment_method]": {pm}}).Status == http.StatusOK
}

// Invoice returns an invoice's JSON object, nil when unknown.
func (a *Account) Invoice(id string) json.RawMessage {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.invoices[id]
}

// SubscriptionIDs returns every subscription id, newest first.
func (a *Account) SubscriptionIDs() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.subOrder)
}

// Throttle answers the next n requests to the account with 429 rate_limit. retryAfter > 0 sends
// it as Retry-After (whole seconds, rounded up); shouldRetry sets Stripe-Should-Retry: true, which
// makes stripe-go retry the request itself.
func (a *Account) Throttle(n int, retryAfter time.Duration, shouldRetry bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.throttle = n
	a.throttleHdr = http.Header{}
	if retryAfter > 0 {
		secs := int64((retryAfter + time.Second - 1) / time.Second)
		a.throttleHdr.Set("Retry-After", strconv.FormatInt(secs, 10))
	}
	if shouldRetry {
		a.throttleHdr.Set("Stripe-Should-Retry", "true")
	}
}

// SetPageDelay makes every list page take d at the account (its own work included) before it
// is answered.
func (a *Account) SetPageDelay(d time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pageDelay = d
}

// pageHold holds a list page after it is computed.
type pageHold struct {
	computed chan struct{}
	release  chan struct{}
}

// HoldNextPage holds the next list page after its answer is computed from the state and before
// it is sent: computed is closed then, and the page goes out when release is called. What the
// test changes meanwhile is not in that page (a read that raced a change at Stripe).
func (a *Account) HoldNextPage() (computed <-chan struct{}, release func()) {
	h := &pageHold{computed: make(chan struct{}), release: make(chan struct{})}
	a.mu.Lock()
	a.holds = append(a.holds, h)
	a.mu.Unlock()
	var once sync.Once
	return h.computed, func() { once.Do(func() { close(h.release) }) }
}

// Stats are what the account has answered.
type Stats struct {
	// Requests counts every request that reached the account, throttled ones included.
	Requests int
	// Pages counts the list pages of subscriptions and customers answered (not throttled).
	Pages int
	// EntitlementPages counts the pages of active entitlements answered.
	EntitlementPages int
}

// Stats returns the counters.
func (a *Account) Stats() Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return Stats{Requests: a.requests, Pages: a.pages, EntitlementPages: a.entPages}
}

func (a *Account) serve(r Request) Answer {
	if r.Path == "/v1/invoices/create_preview" {
		return pass() // servePreview's, when it knows the subscription; else stripe-mock's
	}
	if ans, throttled := a.admit(); throttled {
		return ans
	}
	a.mu.Lock()
	delay := a.pageDelay
	a.mu.Unlock()
	return a.serveAdmitted(r, delay)
}

// admit counts a request and answers 429 while the account is throttled.
func (a *Account) admit() (Answer, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.requests++
	if a.throttle > 0 {
		a.throttle--
		h := a.throttleHdr.Clone()
		return Answer{Status: http.StatusTooManyRequests, Header: h, Body: apiError("invalid_request_error", "rate_limit",
			"Request rate limit exceeded. Learn more about rate limits here https://stripe.com/docs/rate-limits."),
		}, true
	}
	return Answer{}, false
}

func (a *Account) serveAdmitted(r Request, delay time.Duration) Answer {

	parts := strings.Split(strings.Trim(r.Path, "/"), "/") // v1, collection, [id]
	coll, id := parts[1], ""
	if len(parts) > 2 {
		id = parts[2]
	}
	if len(parts) > 3 {
		return notFound(r.Path)
	}
	params := r.Query
	if r.Method != http.MethodGet {
		params = r.Form
	}
	expand := expansions(params)

	switch {
	case r.Method == http.MethodGet && id == "" && coll != "invoices":
		began := time.Now()
		ans := a.list(coll, params, expand)
		if delay > 0 {
			// The page takes delay at the double, its own work included: the encoding of a
			// hundred expanded objects is Stripe's time, not the caller's.
			ans.Body = json.RawMessage(mustJSON(ans.Body))
			time.Sleep(delay - time.Since(began)) // a slow Stripe, not a synchronisation
		}
		a.mu.Lock()
		var h *pageHold
		if len(a.holds) > 0 {
			h, a.holds = a.holds[0], a.holds[1:]
		}
		a.mu.Unlock()
		if h != nil {
			close(h.computed)
			<-h.release
		}
		return ans
	case r.Method == http.MethodGet && coll == "customers" && id == "search":
		return a.searchCustomers(params.Get("query"))
	case r.Method == http.MethodGet:
		return a.retrieve(coll, id, expand)
	case r.Method == http.MethodPost && coll == "subscriptions":
		return a.saveSubscription(id, params, expand)
	case r.Method == http.MethodDelete && coll == "subscriptions" && id != "":
		return a.cancel(id, expand)
	case r.Method == http.MethodPost && coll == "customers":
		return a.saveCustomer(id, params)
	}
	return Answer{Status: http.StatusBadRequest, Body: apiError("invalid_request_error", "", "stripeemu account: unsupported request "+r.Method+" "+r.Path)}
}

func (a *Account) list(coll string, q url.Values, expand map[string]bool) Answer {
	limit := 10
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 100 {
			return Answer{Status: http.StatusBadRequest, Body: apiError("invalid_request_error", "parameter_invalid_integer", "limit must be between 1 and 100")}
		}
		limit = n
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	order, objects := a.subOrder, a.subs
	if coll == "customers" {
		order, objects = a.custOrder, a.customers
	}
	start := 0
	if after := q.Get("starting_after"); after != "" {
		i := slices.Index(order, after)
		if i < 0 {
			return Answer{Status: http.StatusBadRequest, Body: apiError("invalid_request_error", "resource_missing", "No such object: '"+after+"'")}
		}
		start = i + 1
	}
	status, customer := q.Get("status"), q.Get("customer")
	data := []json.RawMessage{}
	hasMore := false
	for _, oid := range order[start:] {
		obj := decode(objects[oid])
		if coll == "subscriptions" {
			st, _ := obj["status"].(string)
			if (status == "" && (st == "canceled" || st == "incomplete_expired")) || (status != "" && status != "all" && status != st) {
				continue
			}
			if customer != "" && obj["customer"] != customer {
				continue
			}
		}
		if len(data) == limit {
			hasMore = true
			break
		}
		if coll == "subscriptions" {
			obj = a.expand(obj, map[string]bool{"latest_invoice": expand["data.latest_invoice"], "customer": expand["data.customer"]})
		}
		data = append(data, mustJSON(obj))
	}
	a.pages++
	return Answer{Status: http.StatusOK, Body: map[string]any{"object": "list", "url": "/v1/" + coll, "has_more": hasMore, "data": data}}
}

// expand replaces the ids of latest_invoice and customer by their objects, as asked. Call with mu held.
func (a *Account) expand(obj map[string]any, what map[string]bool) map[string]any {
	if id, ok := obj["latest_invoice"].(string); ok && what["latest_invoice"] {
		if raw, ok := a.invoices[id]; ok {
			obj["latest_invoice"] = json.RawMessage(raw)
		}
	}
	if id, ok := obj["customer"].(string); ok && what["customer"] {
		if raw, ok := a.customers[id]; ok {
			obj["customer"] = json.RawMessage(raw)
		}
	}
	return obj
}

func (a *Account) retrieve(coll, id string, expand map[string]bool) Answer {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch coll {
	case "subscriptions":
		raw, ok := a.subs[id]
		if !ok {
			return notFound(id)
		}
		return Answer{Status: http.StatusOK, Body: a.expand(decode(raw), expand)}
	case "customers":
		if raw, ok := a.customers[id]; ok {
			return Answer{Status: http.StatusOK, Body: json.RawMessage(raw)}
		}
	case "invoices":
		if raw, ok := a.invoices[id]; ok {
			return Answer{Status: http.StatusOK, Body: json.RawMessage(raw)}
		}
	}
	return notFound(id)
}

// saveSubscription creates (no id) or updates a subscription from form parameters: customer,
// items[0][price], cancel_at_period_end, metadata, trial_end.
func (a *Account) saveSubscription(id string, f url.Values, expand map[string]bool) Answer {
	a.mu.Lock()
	defer a.mu.Unlock()
	var spec SubscriptionSpec
	if id == "" {
		if f.Get("customer") == "" {
			return Answer{Status: http.StatusBadRequest, Body: apiError("invalid_request_error", "parameter_missing", "Missing required param: customer.")}
		}
		now := a.now()
		spec = SubscriptionSpec{Customer: f.Get("customer"), Status: "active", CurrentPeriodStart: now, CurrentPeriodEnd: now.AddDate(0, 1, 0)}
	} else {
		raw, ok := a.subs[id]
		if !ok {
			return notFound(id)
		}
		obj := decode(raw)
		spec = specOf(obj, a.invoices)
		spec.Created = time.Unix(int64(obj["created"].(float64)), 0)
	}
	if p := f.Get("items[0][price]"); p != "" {
		spec.PriceID = p
	}
	if v := f.Get("cancel_at_period_end"); v != "" {
		spec.CancelAtPeriodEnd = v == "true"
		spec.CancelAt = time.Time{}
		if spec.CancelAtPeriodEnd {
			spec.CancelAt = spec.CurrentPeriodEnd
		}
	}
	if v := f.Get("trial_end"); v != "" {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			spec.TrialEnd, spec.Status = time.Unix(n, 0), "trialing"
			spec.TrialStart = a.now()
		}
	}
	if md := metadataOf(f); len(md) > 0 {
		if spec.Metadata == nil {
			spec.Metadata = map[string]string{}
		}
		for k, v := range md {
			spec.Metadata[k], _ = v.(string)
		}
	}
	sid := a.put(spec)
	return Answer{Status: http.StatusOK, Body: a.expand(decode(a.subs[sid]), expand)}
}

// cancel cancels a subscription now, as DELETE /v1/subscriptions/{id} does.
func (a *Account) cancel(id string, expand map[string]bool) Answer {
	a.mu.Lock()
	defer a.mu.Unlock()
	raw, ok := a.subs[id]
	if !ok {
		return notFound(id)
	}
	obj := decode(raw)
	now := a.tick()
	obj["status"], obj["canceled_at"], obj["ended_at"] = "canceled", now, now
	a.subs[id] = mustJSON(obj)
	return Answer{Status: http.StatusOK, Body: a.expand(obj, expand)}
}

func (a *Account) saveCustomer(id string, f url.Values) Answer {
	if id == "" {
		md := map[string]string{}
		for k, v := range metadataOf(f) {
			md[k], _ = v.(string)
		}
		spec := CustomerSpec{Email: f.Get("email"), Name: f.Get("name"), Metadata: md}
		if !f.Has("invoice_settings[default_payment_method]") && !f.Has("source") {
			spec.DefaultPaymentMethod = a.newCustomerCard
		}
		id = a.AddCustomer(spec)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	raw, ok := a.customers[id]
	if !ok {
		return notFound(id)
	}
	obj := decode(raw)
	for _, k := range []string{"email", "name", "description"} {
		if f.Has(k) {
			obj[k] = nullable(f.Get(k))
		}
	}
	if f.Has("invoice_settings[default_payment_method]") {
		obj["invoice_settings"] = map[string]any{"default_payment_method": nullable(f.Get("invoice_settings[default_payment_method]"))}
	}
	if f.Has("source") {
		// Stripe charges a customer's default source when a payment names no method.
		obj["default_source"] = nullable(f.Get("source"))
	}
	if md := metadataOf(f); len(md) > 0 {
		cur, _ := obj["metadata"].(map[string]any)
		if cur == nil {
			cur = map[string]any{}
		}
		for k, v := range md {
			// An empty value unsets the key, as in Stripe.
			if v == "" {
				delete(cur, k)
			} else {
				cur[k] = v
			}
		}
		obj["metadata"] = cur
	}
	a.customers[id] = mustJSON(obj)
	return Answer{Status: http.StatusOK, Body: obj}
}

// DefaultSource is a customer's default_source ("" when unknown or none).
func (a *Account) DefaultSource(customerID string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	s, _ := decode(a.customers[customerID])["default_source"].(string)
	return s
}

// DefaultPaymentMethod is a customer's invoice_settings.default_payment_method ("" when unknown
// or none).
func (a *Account) DefaultPaymentMethod(customerID string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	settings, _ := decode(a.customers[customerID])["invoice_settings"].(map[string]any)
	pm, _ := settings["default_payment_method"].(string)
	return pm
}

func (a *Account) searchCustomers(query string) Answer {
	m := searchQuery.FindStringSubmatch(query)
	if m == nil {
		return Answer{Status: http.StatusBadRequest, Body: apiError("invalid_request_error", "", "stripeemu account: unsupported search query")}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	data := []json.RawMessage{}
	for _, id := range a.custOrder {
		obj := decode(a.customers[id])
		if md, _ := obj["metadata"].(map[string]any); md[m[1]] == m[2] {
			data = append(data, a.customers[id])
		}
	}
	return Answer{Status: http.StatusOK, Body: map[string]any{"object": "search_result", "url": "/v1/customers/search",
		"has_more": false, "next_page": nil, "data": data}}
}

// SetActiveEntitlements makes lookupKeys the customer's active entitlements, in this order (the
// features' ids are feat_<lookup key>). No keys: none.
func (a *Account) SetActiveEntitlements(customerID string, lookupKeys ...string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.entitlements[customerID] = slices.Clone(lookupKeys)
}

// SetEntitlementPageSize makes every page of active entitlements hold at most n, whatever limit
// the caller asks for: a short list then pages as a long one does.
func (a *Account) SetEntitlementPageSize(n int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.entPageSize = n
}

// ActiveEntitlementSummary is the data.object of the customer's
// entitlements.active_entitlement_summary.updated as Stripe sends it: the first pageSize
// entitlements (10 in Stripe's events) and whether the list has more.
func (a *Account) ActiveEntitlementSummary(customerID string, pageSize int) map[string]any {
	a.mu.Lock()
	defer a.mu.Unlock()
	data, more := a.entitlementPage(customerID, 0, pageSize)
	return map[string]any{
		"object": "entitlements.active_entitlement_summary", "customer": customerID, "livemode": a.livemode,
		"entitlements": map[string]any{"object": "list", "data": data, "has_more": more,
			"url": "/v1/customer/" + customerID + "/entitlements"},
	}
}

// entitlementPage is the page of a customer's active entitlements from index start; call with mu
// held.
func (a *Account) entitlementPage(customerID string, start, limit int) ([]map[string]any, bool) {
	keys := a.entitlements[customerID]
	data := []map[string]any{}
	for i := start; i < len(keys) && len(data) < limit; i++ {
		data = append(data, map[string]any{
			"id": entitlementID(customerID, i), "object": "entitlements.active_entitlement",
			"feature": "feat_" + keys[i], "livemode": a.livemode, "lookup_key": keys[i],
		})
	}
	return data, start+len(data) < len(keys)
}

func entitlementID(customerID string, i int) string {
	return fmt.Sprintf("ent_%s_%04d", strings.TrimPrefix(customerID, "cus_"), i)
}

// serveEntitlements answers GET /v1/entitlements/active_entitlements?customer= with limit (10 by
// default, at most 100), starting_after and has_more, as Stripe pages it.
func (a *Account) serveEntitlements(r Request) Answer {
	if ans, throttled := a.admit(); throttled {
		return ans
	}
	if r.Method != http.MethodGet || r.Path != "/v1/entitlements/active_entitlements" {
		return Answer{Status: http.StatusBadRequest, Body: apiError("invalid_request_error", "", "stripeemu account: unsupported request "+r.Method+" "+r.Path)}
	}
	customerID := r.Query.Get("customer")
	if customerID == "" {
		return Answer{Status: http.StatusBadRequest, Body: apiError("invalid_request_error", "parameter_missing", "Missing required param: customer.")}
	}
	limit := 10
	if s := r.Query.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 100 {
			return Answer{Status: http.StatusBadRequest, Body: apiError("invalid_request_error", "parameter_invalid_integer", "limit must be between 1 and 100")}
		}
		limit = n
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.entPageSize > 0 {
		limit = min(limit, a.entPageSize)
	}
	start := 0
	if after := r.Query.Get("starting_after"); after != "" {
		start = -1
		for i := range a.entitlements[customerID] {
			if entitlementID(customerID, i) == after {
				start = i + 1
			}
		}
		if start < 0 {
			return Answer{Status: http.StatusBadRequest, Body: apiError("invalid_request_error", "resource_missing", "No such object: '"+after+"'")}
		}
	}
	data, more := a.entitlementPage(customerID, start, limit)
	a.entPages++
	return Answer{Status: http.StatusOK, Body: map[string]any{"object": "list", "url": "/v1/entitlements/active_entitlements",
		"has_more": more, "data": data}}
}

// specOf reads a stored subscription back into a spec (with its latest invoice).
func specOf(obj map[string]any, invoices map[string][]byte) SubscriptionSpec {
	t := func(k string) time.Time {
		if f, ok := obj[k].(float64); ok {
			return time.Unix(int64(f), 0)
		}
		return time.Time{}
	}
	s := SubscriptionSpec{
		ID: obj["id"].(string), Status: obj["status"].(string),
		CurrentPeriodStart: t("current_period_start"), CurrentPeriodEnd: t("current_period_end"),
		CancelAt: t("cancel_at"), CanceledAt: t("canceled_at"), EndedAt: t("ended_at"),
		TrialStart: t("trial_start"), TrialEnd: t("trial_end"),
	}
	s.Customer, _ = obj["customer"].(string)
	s.CancelAtPeriodEnd, _ = obj["cancel_at_period_end"].(bool)
	if q, ok := obj["quantity"].(float64); ok {
		s.Quantity = int64(q)
	}
	if items, ok := obj["items"].(map[string]any); ok {
		if data, ok := items["data"].([]any); ok && len(data) > 0 {
			if it, ok := data[0].(map[string]any); ok {
				if p, ok := it["price"].(map[string]any); ok {
					s.PriceID, _ = p["id"].(string)
				}
			}
		}
	}
	if md, ok := obj["metadata"].(map[string]any); ok && len(md) > 0 {
		s.Metadata = map[string]string{}
		for k, v := range md {
			s.Metadata[k], _ = v.(string)
		}
	}
	if id, ok := obj["latest_invoice"].(string); ok {
		if inv := decode(invoices[id]); inv != nil {
			spec := &InvoiceSpec{ID: id}
			spec.Status, _ = inv["status"].(string)
			spec.Currency, _ = inv["currency"].(string)
			spec.HostedInvoiceURL, _ = inv["hosted_invoice_url"].(string)
			if f, ok := inv["attempt_count"].(float64); ok {
				spec.AttemptCount = int64(f)
			}
			if f, ok := inv["amount_due"].(float64); ok {
				spec.AmountDue = int64(f)
			}
			if f, ok := inv["next_payment_attempt"].(float64); ok {
				spec.NextPaymentAttempt = time.Unix(int64(f), 0)
			}
			if f, ok := inv["created"].(float64); ok {
				spec.Created = time.Unix(int64(f), 0)
			}
			if f, ok := inv["amount_paid"].(float64); ok {
				spec.AmountPaid = int64(f)
			}
			spec.BillingReason, _ = inv["billing_reason"].(string)
			if f, ok := inv["period_start"].(float64); ok {
				spec.PeriodStart = time.Unix(int64(f), 0)
			}
			if f, ok := inv["period_end"].(float64); ok {
				spec.PeriodEnd = time.Unix(int64(f), 0)
			}
			s.LatestInvoice = spec
		}
	}
	return s
}

// expansions reads expand[] and expand[N] parameters.
func expansions(v url.Values) map[string]bool {
	out := map[string]bool{}
	for k, vals := range v {
		if k == "expand" || strings.HasPrefix(k, "expand[") {
			for _, e := range vals {
				out[e] = true
			}
		}
	}
	return out
}

// nextID makes a fresh id; call with mu held.
func (a *Account) nextID(prefix string) string {
	a.seq++
	return fmt.Sprintf("%sacct%s%08d", prefix, a.idTag, a.seq)
}

// tick returns the created time of a new object; call with mu held. The dev clock never goes
// back, and objects of one second share it, as at Stripe.
func (a *Account) tick() int64 {
	if a.wall {
		a.clock = max(a.clock, time.Now().Add(a.offset).Unix())
		return a.clock
	}
	a.clock++
	return a.clock
}

// now is the account's present: the dev clock, or else the time of the newest object; call with
// mu held.
func (a *Account) now() time.Time {
	if a.wall {
		return time.Unix(max(a.clock, time.Now().Add(a.offset).Unix()), 0)
	}
	return time.Unix(a.clock, 0)
}

func apiError(typ, code, msg string) map[string]any {
	e := map[string]any{"type": typ, "message": msg}
	if code != "" {
		e["code"] = code
	}
	return map[string]any{"error": e}
}

func notFound(id string) Answer {
	return Answer{Status: http.StatusNotFound, Body: apiError("invalid_request_error", "resource_missing", "No such object: '"+id+"'")}
}

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func unixOrNull(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.Unix()
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Errorf("stripeemu: %w", err))
	}
	return b
}

func decode(raw []byte) map[string]any {
	if raw == nil {
		return nil
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		panic(fmt.Errorf("stripeemu: %w", err))
	}
	return m
}
