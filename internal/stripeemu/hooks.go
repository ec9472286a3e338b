package stripeemu

import (
	"encoding/json"
	"net/http"
	"strings"
)

// Hooks are what a program built on the proxy adds to it (the dev Stripe, internal/devstripe):
// the proxy calls them at fixed points and knows nothing of what they are for, so that the
// emulator the tests use has no mode of its own.
type Hooks struct {
	// Created completes an object stripe-mock created, before a test's Mutate and before the
	// proxy keeps it.
	Created func(req Request, obj map[string]any)
	// Answered may replace stripe-mock's answer to any other request it accepted.
	Answered func(req Request, obj map[string]any) map[string]any
	// Pages serves the requests whose path starts with one of PagePrefixes, instead of the API.
	Pages        http.Handler
	PagePrefixes []string
	// UnknownPriceAmount, when > 0, is the monthly amount (usd, cents) of a price the catalog does
	// not know, so that previews and invoices of any price have terms.
	UnknownPriceAmount int64
}

// SetHooks replaces the proxy's hooks.
func (p *Proxy) SetHooks(h Hooks) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hooks = h
}

// Hooks are the proxy's hooks (to extend them: SetHooks).
func (p *Proxy) Hooks() Hooks {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.hooks
}

// SetIDTag puts tag in the ids the proxy and what is mounted on it afterwards (NewAccount,
// NewCheckoutSessions, NewCatalog) make, so that ids are unique across processes as Stripe's are.
func (p *Proxy) SetIDTag(tag string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.idTag = tag
}

// NewID makes a fresh id with the prefix (evt_…), unique like the proxy's other ids.
func (p *Proxy) NewID(prefix string) string { return p.newID(prefix) }

// UpdateKept calls fn, under the proxy's lock, on the kept object of coll with the id and
// answers a copy of it after fn (nil when none is kept).
func (p *Proxy) UpdateKept(coll, id string, fn func(obj map[string]any)) map[string]any {
	p.mu.Lock()
	defer p.mu.Unlock()
	var kept map[string]any
	for _, o := range p.objects[coll] {
		if o["id"] == id {
			kept = o
		}
	}
	if kept == nil {
		return nil
	}
	if fn != nil {
		fn(kept)
	}
	// A copy: the kept object changes under the lock, the answer is encoded outside it.
	b, _ := json.Marshal(kept)
	var out map[string]any
	_ = json.Unmarshal(b, &out)
	return out
}

// hooked serves hr by the hooks' pages when its path is theirs.
func (p *Proxy) hooked(w http.ResponseWriter, hr *http.Request) bool {
	h := p.Hooks()
	if h.Pages == nil {
		return false
	}
	for _, pre := range h.PagePrefixes {
		if strings.HasPrefix(hr.URL.Path, pre) {
			h.Pages.ServeHTTP(w, hr)
			return true
		}
	}
	return false
}
