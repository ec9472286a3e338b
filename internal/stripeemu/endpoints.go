package stripeemu

import (
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// WebhookEndpoints is the account's webhook endpoints, kept by the test: stripe-mock answers every
// list with the same fixture and forgets what was created, so a command that converges an
// endpoint (list, create, update, delete) cannot be tested against it.
type WebhookEndpoints struct {
	p *Proxy
	// Livemode is the mode of the endpoints created from now on.
	Livemode bool

	mu  sync.Mutex
	eps []map[string]any // oldest first; lists answer newest first, as Stripe does
}

// WebhookEndpoints makes the proxy serve /v1/webhook_endpoints (list with paging, create
// answering the signing secret once, retrieve, update, delete) from the returned state.
func (p *Proxy) WebhookEndpoints() *WebhookEndpoints {
	w := &WebhookEndpoints{p: p}
	p.Handle("/v1/webhook_endpoints", w.serve)
	return w
}

// Add puts an endpoint at Stripe as if made in the Dashboard: enabled, with apiVersion ("" for
// none: the account's default) and events. It returns its id.
func (w *WebhookEndpoints) Add(endpointURL, apiVersion string, events ...string) string {
	ep := w.newEndpoint(endpointURL, events)
	if apiVersion != "" {
		ep["api_version"] = apiVersion
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.eps = append(w.eps, ep)
	return ep["id"].(string)
}

// Disable sets an endpoint's status to disabled, as Stripe does after weeks of failed deliveries.
func (w *WebhookEndpoints) Disable(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if ep := w.find(id); ep != nil {
		ep["status"] = "disabled"
	}
}

// All returns a copy of the endpoints, oldest first, without secrets.
func (w *WebhookEndpoints) All() []map[string]any {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]map[string]any, 0, len(w.eps))
	for _, ep := range w.eps {
		out = append(out, copyEndpoint(ep))
	}
	return out
}

func (w *WebhookEndpoints) newEndpoint(endpointURL string, events []string) map[string]any {
	return map[string]any{
		"id":             w.p.newID("we_"),
		"object":         "webhook_endpoint",
		"api_version":    nil,
		"application":    nil,
		"created":        1700000000,
		"description":    nil,
		"enabled_events": append([]string{}, events...),
		"livemode":       w.Livemode,
		"metadata":       map[string]any{},
		"status":         "enabled",
		"url":            endpointURL,
	}
}

func (w *WebhookEndpoints) find(id string) map[string]any {
	for _, ep := range w.eps {
		if ep["id"] == id {
			return ep
		}
	}
	return nil
}

func (w *WebhookEndpoints) serve(r Request) Answer {
	const coll = "/v1/webhook_endpoints"
	id := strings.TrimPrefix(strings.TrimPrefix(r.Path, coll), "/")
	switch {
	case id == "" && r.Method == http.MethodGet:
		w.mu.Lock()
		defer w.mu.Unlock()
		newestFirst := make([]map[string]any, 0, len(w.eps))
		for i := len(w.eps) - 1; i >= 0; i-- {
			newestFirst = append(newestFirst, copyEndpoint(w.eps[i]))
		}
		return answerPage(coll, newestFirst, r.Query)
	case id == "" && r.Method == http.MethodPost:
		u := r.Form.Get("url")
		events := formArray(r.Form, "enabled_events")
		if u == "" || len(events) == 0 {
			return answerInvalid("Missing required param: url and enabled_events.")
		}
		ep := w.newEndpoint(u, events)
		if v := r.Form.Get("api_version"); v != "" {
			ep["api_version"] = v
		}
		if d := r.Form.Get("description"); d != "" {
			ep["description"] = d
		}
		var b [16]byte
		_, _ = rand.Read(b[:])
		created := copyEndpoint(ep)
		created["secret"] = "whsec_" + hex.EncodeToString(b[:])
		w.mu.Lock()
		defer w.mu.Unlock()
		w.eps = append(w.eps, ep)
		return Answer{Status: http.StatusOK, Body: created}
	}

	w.mu.Lock()
	defer w.mu.Unlock()
	ep := w.find(id)
	if ep == nil || strings.Contains(id, "/") {
		return Answer{Status: http.StatusNotFound, Body: map[string]any{"error": map[string]any{
			"type": "invalid_request_error", "code": "resource_missing", "param": "id",
			"message": "No such webhook endpoint: '" + id + "'",
		}}}
	}
	switch r.Method {
	case http.MethodGet:
		return Answer{Status: http.StatusOK, Body: copyEndpoint(ep)}
	case http.MethodDelete:
		for i := range w.eps {
			if w.eps[i]["id"] == id {
				w.eps = append(w.eps[:i], w.eps[i+1:]...)
				break
			}
		}
		return Answer{Status: http.StatusOK, Body: map[string]any{"id": id, "object": "webhook_endpoint", "deleted": true}}
	case http.MethodPost:
		// As at Stripe: the version an endpoint renders events in is fixed at creation.
		if r.Form.Has("api_version") {
			return answerInvalid("Received unknown parameter: api_version")
		}
		if events := formArray(r.Form, "enabled_events"); len(events) > 0 {
			ep["enabled_events"] = events
		}
		if r.Form.Has("disabled") {
			ep["status"] = "enabled"
			if r.Form.Get("disabled") == "true" {
				ep["status"] = "disabled"
			}
		}
		if u := r.Form.Get("url"); u != "" {
			ep["url"] = u
		}
		if r.Form.Has("description") {
			ep["description"] = r.Form.Get("description")
		}
		return Answer{Status: http.StatusOK, Body: copyEndpoint(ep)}
	}
	return Answer{Status: http.StatusMethodNotAllowed, Body: map[string]any{"error": map[string]any{
		"type": "invalid_request_error", "message": "Unrecognized request method " + r.Method,
	}}}
}

// PortalConfigurations is the account's Customer Portal configurations, kept by the test:
// stripe-mock's fixture cannot say whether cancelling is allowed.
type PortalConfigurations struct {
	p *Proxy

	mu   sync.Mutex
	cfgs []map[string]any // oldest first
}

// PortalConfigurations makes the proxy answer GET /v1/billing_portal/configurations (with the
// active and is_default filters, paging) from the returned state. It starts empty, like an
// account whose portal settings were never saved.
func (p *Proxy) PortalConfigurations() *PortalConfigurations {
	c := &PortalConfigurations{p: p}
	p.Handle("/v1/billing_portal/configurations", c.serve)
	return c
}

// Add adds a configuration and returns its id. A default one replaces the previous default, as
// an account has at most one.
func (c *PortalConfigurations) Add(isDefault, active, cancelEnabled bool) string {
	id := c.p.newID("bpc_")
	c.mu.Lock()
	defer c.mu.Unlock()
	if isDefault {
		for _, cfg := range c.cfgs {
			cfg["is_default"] = false
		}
	}
	c.cfgs = append(c.cfgs, map[string]any{
		"id": id, "object": "billing_portal.configuration", "active": active, "is_default": isDefault,
		"livemode": false, "created": 1700000000, "updated": 1700000000, "application": nil,
		"business_profile":   map[string]any{"headline": nil, "privacy_policy_url": nil, "terms_of_service_url": nil},
		"default_return_url": nil, "login_page": map[string]any{"enabled": false, "url": nil}, "metadata": map[string]any{},
		"features": map[string]any{
			"customer_update":       map[string]any{"enabled": false, "allowed_updates": []string{}},
			"invoice_history":       map[string]any{"enabled": true},
			"payment_method_update": map[string]any{"enabled": true},
			"subscription_cancel": map[string]any{
				"enabled": cancelEnabled, "mode": "at_period_end", "proration_behavior": "none",
				"cancellation_reason": map[string]any{"enabled": false, "options": []string{}},
			},
			"subscription_update": map[string]any{"enabled": false, "default_allowed_updates": []string{}, "proration_behavior": "none", "products": []any{}},
		},
	})
	return id
}

func (c *PortalConfigurations) serve(r Request) Answer {
	const coll = "/v1/billing_portal/configurations"
	if r.Path != coll || r.Method != http.MethodGet {
		return Answer{Status: http.StatusNotFound, Body: map[string]any{"error": map[string]any{
			"type": "invalid_request_error", "message": "stripeemu: only the list of portal configurations is served",
		}}}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []map[string]any
	for i := len(c.cfgs) - 1; i >= 0; i-- {
		cfg := c.cfgs[i]
		if v := r.Query.Get("active"); v != "" && strconv.FormatBool(cfg["active"].(bool)) != v {
			continue
		}
		if v := r.Query.Get("is_default"); v != "" && strconv.FormatBool(cfg["is_default"].(bool)) != v {
			continue
		}
		out = append(out, copyEndpoint(cfg))
	}
	return answerPage(coll, out, r.Query)
}

// answerPage answers one page of a list, newest first, the way Stripe pages: limit (default 10,
// 1–100) objects after the one named by starting_after.
func answerPage(coll string, all []map[string]any, q url.Values) Answer {
	limit := 10
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			return answerInvalid("Invalid limit: must be between 1 and 100")
		}
		limit = n
	}
	start := 0
	if after := q.Get("starting_after"); after != "" {
		start = -1
		for i, o := range all {
			if o["id"] == after {
				start = i + 1
				break
			}
		}
		if start < 0 {
			return answerInvalid("No such object: '" + after + "'")
		}
	}
	page := all[start:]
	hasMore := len(page) > limit
	if hasMore {
		page = page[:limit]
	}
	if page == nil {
		page = []map[string]any{}
	}
	return Answer{Status: http.StatusOK, Body: map[string]any{"object": "list", "data": page, "has_more": hasMore, "url": coll}}
}

var formArrayIndex = regexp.MustCompile(`^\[(\d*)\]$`)

// formArray reads a list parameter however it was encoded: name[0]=a&name[1]=b (stripe-go) or
// name[]=a&name[]=b.
func formArray(form url.Values, name string) []string {
	type item struct {
		i int
		v string
	}
	var items []item
	for k, vs := range form {
		rest, ok := strings.CutPrefix(k, name)
		m := formArrayIndex.FindStringSubmatch(rest)
		if !ok || m == nil {
			continue
		}
		i, _ := strconv.Atoi(m[1])
		for _, v := range vs {
			items = append(items, item{i, v})
		}
	}
	sort.SliceStable(items, func(a, b int) bool { return items[a].i < items[b].i })
	out := make([]string, 0, len(items))
	for _, it := range items {
		out = append(out, it.v)
	}
	return out
}

// copyEndpoint copies an object's top level (and an endpoint's event list): what a later change
// through the proxy can modify while an answer is being encoded.
func copyEndpoint(ep map[string]any) map[string]any {
	c := make(map[string]any, len(ep))
	for k, v := range ep {
		c[k] = v
	}
	if ev, ok := ep["enabled_events"].([]string); ok {
		c["enabled_events"] = append([]string{}, ev...)
	}
	return c
}

func answerInvalid(msg string) Answer {
	return Answer{Status: http.StatusBadRequest, Body: map[string]any{"error": map[string]any{
		"type": "invalid_request_error", "message": msg,
	}}}
}
