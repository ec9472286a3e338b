// Package stripeemu emulates Stripe at the HTTP boundary for the tests and for the dev Stripe of
// `make run`: a proxy in front of
// stripe-mock that records every request and adds the parts of Stripe that a stateless mock
// lacks and that our idempotency guarantees depend on:
//
//   - idempotency keys: the same key with the same parameters replays the stored answer (header
//     Idempotent-Replayed: true) without executing again; the same key with other parameters is
//     a 400 idempotency_error; a key in use by a request still in flight is a 409;
//   - distinct ids for created objects, and metadata reflected into them;
//   - a confirmed PaymentIntent settled as test mode settles it for its card (stripe-mock leaves
//     every one requires_payment_method): pm_card_visa succeeds, pm_card_chargeDeclined… answer
//     card errors with their decline codes, 3-D Secure cards need authentication (cards.go);
//   - search (customers, payment_intents, by metadata) and the refunds list by payment_intent,
//     answered from the objects created through the proxy;
//   - faults: 500s, 429s and dropped connections before the request reaches "Stripe", and
//     dropped connections after it executed (the answer is lost, the key remembered), for the
//     next n requests or for a random share of them (InjectFaultShare);
//   - canned answers (card errors) and edits of stripe-mock's answers (requires_action).
//   - a slow Stripe: requests of a method and path executed only after a delay (Delay).
//
// Stateful resources are served by the types that Handle a path: Account (subscriptions,
// customers, invoices, invoice previews priced from the catalog), CheckoutSessions, MeterEvents
// (meter events by identifier) and Catalog (products, prices, features, promotion codes).
//
// A program built on the proxy extends it through Hooks and SetIDTag (the dev Stripe of
// `make run`, internal/devstripe): the proxy itself has no dev mode.
//
// Everything a test sets up applies to "the next n requests" of a method and path, in order.
package stripeemu

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Fault is a failure the proxy injects instead of or after executing a request.
type Fault int

const (
	FaultNone Fault = iota
	// Fault500 answers 500 api_error; the request never reaches Stripe.
	Fault500
	// FaultDrop closes the connection without an answer; the request never reaches Stripe.
	FaultDrop
	// FaultDropAfter executes the request (the object exists, the key is stored) and then closes
	// the connection: the caller never learns the answer. To the caller it is the timeout of a
	// request that Stripe applied: the answer never comes, whatever the wait.
	FaultDropAfter
	// Fault429 answers 429 rate_limit, with Retry-After when the rule has one; the request never
	// reaches Stripe and its key is not stored (Stripe's rate limiter comes first).
	Fault429
)

// String names the fault as the figures print it.
func (f Fault) String() string {
	switch f {
	case Fault500:
		return "500"
	case FaultDrop:
		return "reset"
	case FaultDropAfter:
		return "lost_after_applied"
	case Fault429:
		return "429"
	}
	return "none"
}

// Chaos injects faults at random into the requests whose path starts with one of Prefixes
// (every path when empty): each such request, with probability Rate, gets one of Faults (all
// four kinds when empty), picked at random. Rules set with InjectFault come first.
type Chaos struct {
	Prefixes []string
	Rate     float64
	Faults   []Fault
	// Seed makes the sequence of faults reproducible (given the same order of requests).
	Seed uint64
}

// Request is one request the proxy received.
type Request struct {
	Method         string
	Path           string
	Query          url.Values
	Form           url.Values
	IdempotencyKey string
	StripeVersion  string
	// Executed: "Stripe" acted on it (not faulted before, not replayed, not refused by the key
	// layer). Replayed: answered from the stored answer of its key.
	Executed bool
	Replayed bool
	Fault    Fault
	// Status is the HTTP status answered (0 for a dropped connection).
	Status int
}

// Answer is a canned response.
type Answer struct {
	Status int
	Body   any
	// Header is sent with a canned or served answer (Retry-After of a 429); not stored under an
	// idempotency key.
	Header http.Header
}

type rule struct {
	method, path string
	remaining    int // < 0: forever
	fault        Fault
	respond      func(Request) Answer
	mutate       func(Request, map[string]any)
	gate         *gate
	delay        time.Duration
	// share > 0: the rule applies to that share of the matching requests, drawn from the
	// proxy's seeded randomness (remaining counts only the requests it applied to).
	share      float64
	retryAfter time.Duration // Fault429's Retry-After
}

type gate struct {
	arrived chan struct{}
	release chan struct{}
}

type keyEntry struct {
	fingerprint string
	done        bool
	status      int
	body        []byte
}

// Proxy is the test double. Its zero value is not usable; call New.
type Proxy struct {
	// URL is the base URL to give the Stripe client.
	URL string

	upstream string
	client   *http.Client

	mu      sync.Mutex
	reqs    []Request
	keys    map[string]*keyEntry
	rules   []*rule
	seq     int
	objects map[string][]map[string]any // created objects by collection path
	chaos   *Chaos
	rng     *rand.Rand
	faulted map[Fault]int // faults injected, by kind
	routes  []route       // stateful resources served here, not by stripe-mock
	idTag   string        // see SetIDTag
	onReq   func(Request) // see OnRequest
	// customerSource answers a customer's default_source when an Account keeps the customers.
	customerSource func(customerID string) string
	hooks          Hooks // see SetHooks
	// catalog is the products, prices and promotion codes served here (NewCatalog); nil: none,
	// and stripe-mock answers them.
	catalog *Catalog
}

// route serves the requests under a path prefix from the test's own state. An Answer with
// Status 0 passes the request on: to the route of the next shorter prefix, else to stripe-mock.
type route struct {
	prefix string
	serve  func(Request) Answer
}

// TB is the part of testing.TB that New uses: declared here so that the dev Stripe, which is
// built from this package, links no testing package into its binary.
type TB interface {
	Helper()
	Fatal(args ...any)
	Cleanup(func())
}

// New starts a proxy in front of upstreamURL (stripe-mock) and stops it when the test ends.
func New(t TB, upstreamURL string) *Proxy {
	t.Helper()
	p, stop, err := Start(upstreamURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return p
}

// Start starts a proxy on a free loopback port in front of upstreamURL (stripe-mock). stop
// closes it.
func Start(upstreamURL string) (p *Proxy, stop func(), err error) {
	return Listen("127.0.0.1:0", upstreamURL)
}

// Listen starts a proxy on addr ("host:port"; an empty host means loopback) in front of
// upstreamURL. stop closes the listener and every connection.
func Listen(addr, upstreamURL string) (p *Proxy, stop func(), err error) {
	if upstreamURL == "" {
		return nil, nil, fmt.Errorf("stripeemu: no upstream URL")
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, nil, fmt.Errorf("stripeemu: listen address %q: %w", addr, err)
	}
	if host == "" {
		// A double of Stripe with no authentication is for this machine only.
		host = "127.0.0.1"
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, port))
	if err != nil {
		return nil, nil, fmt.Errorf("stripeemu: %w", err)
	}
	p = &Proxy{
		upstream: strings.TrimRight(upstreamURL, "/"),
		client:   &http.Client{},
		keys:     map[string]*keyEntry{},
		objects:  map[string][]map[string]any{},
		rng:      rand.New(rand.NewPCG(1, 2)),
		faulted:  map[Fault]int{},
	}
	srv := &http.Server{Handler: http.HandlerFunc(p.serve), ReadHeaderTimeout: 10 * time.Second}
	// One connection per request: Go's transport silently resends a request that carries an
	// Idempotency-Key when a reused connection drops, which would make injected faults
	// disappear in a way that depends on connection reuse.
	srv.SetKeepAlivesEnabled(false)
	go func() { _ = srv.Serve(ln) }()
	p.URL = "http://" + ln.Addr().String()
	return p, func() { _ = srv.Close() }, nil
}

// collections whose POST creates an object (the only ones the service creates).
var collections = map[string]bool{
	"/v1/customers": true, "/v1/payment_intents": true, "/v1/refunds": true,
	"/v1/billing_portal/sessions": true,
}

// InjectFault makes the next times requests to method and path fail with f (a 429 with
// Retry-After: 1; Throttle chooses its own).
func (p *Proxy) InjectFault(method, path string, f Fault, times int) {
	p.addRule(&rule{method: method, path: path, remaining: times, fault: f, retryAfter: time.Second})
}

// Throttle answers the next times requests to method and path with 429 rate_limit, before
// Stripe's key layer as Stripe's rate limiter does; retryAfter > 0 is sent as Retry-After.
func (p *Proxy) Throttle(method, path string, times int, retryAfter time.Duration) {
	p.addRule(&rule{method: method, path: path, remaining: times, fault: Fault429, retryAfter: retryAfter})
}

// InjectFaultShare makes a random share (0–1) of the requests to method and path fail with f,
// for as long as the proxy runs. For Fault429, retryAfter > 0 is sent as Retry-After, in
// seconds with a fraction when it is not whole (Stripe's own header is whole seconds; a test
// need not wait that long). The draws follow Seed.
func (p *Proxy) InjectFaultShare(method, path string, f Fault, share float64, retryAfter time.Duration) {
	p.addRule(&rule{method: method, path: path, remaining: -1, fault: f, share: share, retryAfter: retryAfter})
}

// Seed makes the draws of InjectFaultShare reproducible from seed.
func (p *Proxy) Seed(seed uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rng = rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}

// Respond replaces Stripe's answer to the next times requests to method and path (times < 0:
// all). The answer is stored under the request's idempotency key like a real one.
func (p *Proxy) Respond(method, path string, times int, fn func(Request) Answer) {
	p.addRule(&rule{method: method, path: path, remaining: times, respond: fn})
}

// Mutate edits the JSON object that stripe-mock answers to the next times requests to method
// and path (times < 0: all), before it is stored and sent.
func (p *Proxy) Mutate(method, path string, times int, fn func(Request, map[string]any)) {
	p.addRule(&rule{method: method, path: path, remaining: times, mutate: fn})
}

// CardError makes the next times creates at path answer 402 card_error with code and
// declineCode; for /v1/payment_intents the error carries the failed PaymentIntent, as Stripe's does.
func (p *Proxy) CardError(path, code, declineCode string, times int) {
	p.Respond(http.MethodPost, path, times, func(r Request) Answer {
		e := map[string]any{
			"type": "card_error", "code": code, "message": "Your card was declined.",
		}
		if declineCode != "" {
			e["decline_code"] = declineCode
		}
		if path == "/v1/payment_intents" {
			pi := map[string]any{
				"id": p.newID("pi_"), "object": "payment_intent", "status": "requires_payment_method",
				"currency": r.Form.Get("currency"), "metadata": metadataOf(r.Form),
			}
			if n, err := strconv.ParseInt(r.Form.Get("amount"), 10, 64); err == nil {
				pi["amount"] = n
			}
			if code == "authentication_required" {
				pi["status"] = "requires_action"
			}
			e["payment_intent"] = pi
		}
		return Answer{Status: http.StatusPaymentRequired, Body: map[string]any{"error": e}}
	})
}

// Delay makes "Stripe" take d to execute each of the next times requests to method and path
// (times < 0: all), as a slow Stripe does: the idempotency key is in flight meanwhile (a retry
// under it is answered 409), and the request is executed after d even if the caller gave up.
func (p *Proxy) Delay(method, path string, d time.Duration, times int) {
	p.addRule(&rule{method: method, path: path, remaining: times, delay: d})
}

// Gate holds the next request to method and path after it is recorded and before it is
// executed. arrived is closed when it is held; it goes on when release is called.
func (p *Proxy) Gate(method, path string) (arrived <-chan struct{}, release func()) {
	g := &gate{arrived: make(chan struct{}), release: make(chan struct{})}
	p.addRule(&rule{method: method, path: path, remaining: 1, gate: g})
	var once sync.Once
	return g.arrived, func() { once.Do(func() { close(g.release) }) }
}

// SetChaos starts (or, with nil, stops) random faults; see Chaos.
func (p *Proxy) SetChaos(c *Chaos) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.chaos = c
	if c != nil {
		p.rng = rand.New(rand.NewPCG(c.Seed, 27))
	}
}

// Faulted counts the faults injected so far (by rules and by chaos), by kind.
func (p *Proxy) Faulted() map[Fault]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[Fault]int{}
	for k, v := range p.faulted {
		out[k] = v
	}
	return out
}

func (p *Proxy) chaosFault(path string) Fault {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.chaos
	if c == nil || c.Rate <= 0 {
		return FaultNone
	}
	match := len(c.Prefixes) == 0
	for _, pre := range c.Prefixes {
		match = match || strings.HasPrefix(path, pre)
	}
	if !match || p.rng.Float64() >= c.Rate {
		return FaultNone
	}
	kinds := c.Faults
	if len(kinds) == 0 {
		kinds = []Fault{Fault429, Fault500, FaultDrop, FaultDropAfter}
	}
	return kinds[p.rng.IntN(len(kinds))]
}

// ForgetKeys drops every stored idempotency key, as Stripe does after 24 hours.
func (p *Proxy) ForgetKeys() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.keys = map[string]*keyEntry{}
}

// Requests returns a copy of every request received so far, in the order their outcome was
// decided (answered or dropped): for requests in flight at once, not necessarily the order in
// which they arrived.
func (p *Proxy) Requests() []Request {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Request(nil), p.reqs...)
}

// Filter returns the recorded requests to method and path.
func (p *Proxy) Filter(method, path string) []Request {
	var out []Request
	for _, r := range p.Requests() {
		if r.Method == method && r.Path == path {
			out = append(out, r)
		}
	}
	return out
}

// Executed counts the requests to method and path that Stripe acted on.
func (p *Proxy) Executed(method, path string) int {
	n := 0
	for _, r := range p.Filter(method, path) {
		if r.Executed {
			n++
		}
	}
	return n
}

// Handle makes the proxy answer every request whose path is prefix or lies under prefix+"/" with
// serve, instead of forwarding it to stripe-mock: the way to give a test stateful Stripe
// resources (lists that page, retrieves of what was created, updates). Faults, gates, canned
// answers and the idempotency layer still apply first, as for any request. The longest matching
// prefix wins; an Answer with Status 0 passes the request to the next matching prefix, then to
// stripe-mock.
func (p *Proxy) Handle(prefix string, serve func(Request) Answer) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.routes = append(p.routes, route{prefix: strings.TrimRight(prefix, "/"), serve: serve})
	sort.SliceStable(p.routes, func(i, j int) bool { return len(p.routes[i].prefix) > len(p.routes[j].prefix) })
}

// routesFor returns the routes of a path, longest prefix first.
func (p *Proxy) routesFor(path string) []func(Request) Answer {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []func(Request) Answer
	for _, r := range p.routes {
		if path == r.prefix || strings.HasPrefix(path, r.prefix+"/") {
			out = append(out, r.serve)
		}
	}
	return out
}

// pass is a route's answer that leaves the request to the next route or stripe-mock.
func pass() Answer { return Answer{} }

// setCustomerSource makes fn the lookup of a customer's default_source (an Account's).
func (p *Proxy) setCustomerSource(fn func(customerID string) string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.customerSource = fn
}

func (p *Proxy) addRule(r *rule) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rules = append(p.rules, r)
}

// take returns the first live rule of a kind for the request and uses one of its turns.
func (p *Proxy) take(method, path string, kind func(*rule) bool) *rule {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range p.rules {
		if r.remaining != 0 && r.method == method && r.path == path && kind(r) {
			if r.share > 0 && p.rng.Float64() >= r.share {
				continue
			}
			if r.remaining > 0 {
				r.remaining--
			}
			return r
		}
	}
	return nil
}

func (p *Proxy) newID(prefix string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seq++
	return fmt.Sprintf("%sproxy%s%06d", prefix, p.idTag, p.seq)
}

func (p *Proxy) record(r Request) {
	p.mu.Lock()
	p.reqs = append(p.reqs, r)
	on := p.onReq
	p.mu.Unlock()
	if on != nil {
		on(r)
	}
}

// OnRequest calls fn with every request once its outcome is decided (for a log).
func (p *Proxy) OnRequest(fn func(Request)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.onReq = fn
}

func (p *Proxy) serve(w http.ResponseWriter, hr *http.Request) {
	if p.hooked(w, hr) {
		return
	}
	body, _ := io.ReadAll(hr.Body)
	form, _ := url.ParseQuery(string(body))
	req := Request{
		Method: hr.Method, Path: hr.URL.Path, Query: hr.URL.Query(), Form: form,
		IdempotencyKey: hr.Header.Get("Idempotency-Key"), StripeVersion: hr.Header.Get("Stripe-Version"),
	}
	if g := p.take(req.Method, req.Path, func(r *rule) bool { return r.gate != nil }); g != nil {
		close(g.gate.arrived)
		<-g.gate.release
	}

	// Faults in front of Stripe.
	fault := FaultNone
	retryAfter := time.Second // a chaos 429's
	if f := p.take(req.Method, req.Path, func(r *rule) bool { return r.fault != FaultNone }); f != nil {
		fault, retryAfter = f.fault, f.retryAfter
	} else {
		fault = p.chaosFault(req.Path)
	}
	if fault != FaultNone {
		req.Fault = fault
		p.mu.Lock()
		p.faulted[fault]++
		p.mu.Unlock()
		switch fault {
		case Fault500:
			req.Status = http.StatusInternalServerError
			p.record(req)
			writeJSON(w, http.StatusInternalServerError, map[string]any{"error": map[string]any{
				"type": "api_error", "message": "injected internal error"}})
			return
		case FaultDrop:
			p.record(req)
			drop(w)
			return
		case Fault429:
			req.Status = http.StatusTooManyRequests
			p.record(req)
			if retryAfter > 0 {
				w.Header().Set("Retry-After", strconv.FormatFloat(retryAfter.Seconds(), 'f', -1, 64))
			}
			writeJSON(w, http.StatusTooManyRequests, map[string]any{"error": map[string]any{
				"type": "invalid_request_error", "code": "rate_limit",
				"message": "Request rate limit exceeded. Learn more about rate limits here https://stripe.com/docs/rate-limits."}})
			return
		}
	}

	// Stripe's idempotency layer.
	fp := fingerprint(req.Method, req.Path, body)
	if req.IdempotencyKey != "" {
		p.mu.Lock()
		e, ok := p.keys[req.IdempotencyKey]
		switch {
		case ok && e.fingerprint != fp:
			p.mu.Unlock()
			req.Status = http.StatusBadRequest
			p.record(req)
			writeJSON(w, http.StatusBadRequest, map[string]any{"error": map[string]any{
				"type":    "idempotency_error",
				"message": "Keys for idempotent requests can only be used with the same parameters they were first used with.",
			}})
			return
		case ok && !e.done:
			p.mu.Unlock()
			req.Status = http.StatusConflict
			p.record(req)
			writeJSON(w, http.StatusConflict, map[string]any{"error": map[string]any{
				"type": "idempotency_error", "code": "idempotency_key_in_use",
				"message": "There is currently another in-progress request using this Idempotent Key.",
			}})
			return
		case ok:
			p.mu.Unlock()
			req.Replayed, req.Status = true, e.status
			p.record(req)
			if req.Fault == FaultDropAfter {
				drop(w)
				return
			}
			w.Header().Set("Idempotent-Replayed", "true")
			writeRaw(w, e.status, e.body)
			return
		}
		p.keys[req.IdempotencyKey] = &keyEntry{fingerprint: fp}
		p.mu.Unlock()
	}

	if r := p.take(req.Method, req.Path, func(r *rule) bool { return r.delay > 0 }); r != nil {
		time.Sleep(r.delay)
	}
	status, out := p.execute(w, req, hr, body)
	req.Executed, req.Status = true, status
	if req.IdempotencyKey != "" {
		p.mu.Lock()
		if e := p.keys[req.IdempotencyKey]; e != nil {
			e.done, e.status, e.body = true, status, out
		}
		p.mu.Unlock()
	}
	p.record(req)
	if req.Fault == FaultDropAfter {
		drop(w)
		return
	}
	writeRaw(w, status, out)
}

var searchQuery = regexp.MustCompile(`^metadata\['([^']+)'\]:'([^']*)'$`)

// execute is "Stripe": canned answers, local search and lists, else stripe-mock plus the edits.
func (p *Proxy) execute(w http.ResponseWriter, req Request, hr *http.Request, body []byte) (int, []byte) {
	if r := p.take(req.Method, req.Path, func(r *rule) bool { return r.respond != nil }); r != nil {
		a := r.respond(req)
		setHeader(w, a.Header)
		b, _ := json.Marshal(a.Body)
		return a.Status, b
	}
	for _, serve := range p.routesFor(req.Path) {
		a := serve(req)
		if a.Status == 0 {
			continue
		}
		setHeader(w, a.Header)
		b, _ := json.Marshal(a.Body)
		return a.Status, b
	}
	if req.Method == http.MethodGet {
		if coll, ok := strings.CutSuffix(req.Path, "/search"); ok && collections[coll] {
			return p.search(coll, req.Query.Get("query"))
		}
		if req.Path == "/v1/refunds" && req.Query.Get("payment_intent") != "" {
			return p.list("/v1/refunds", "payment_intent", req.Query.Get("payment_intent"))
		}
	}

	up, err := http.NewRequest(req.Method, p.upstream+hr.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		return http.StatusInternalServerError, []byte(`{"error":{"type":"api_error","message":"proxy: bad request"}}`)
	}
	for _, h := range []string{"Authorization", "Content-Type", "Stripe-Version", "Idempotency-Key"} {
		if v := hr.Header.Get(h); v != "" {
			up.Header.Set(h, v)
		}
	}
	resp, err := p.client.Do(up)
	if err != nil {
		return http.StatusBadGateway, []byte(fmt.Sprintf(`{"error":{"type":"api_error","message":%q}}`, err.Error()))
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 300 {
		return resp.StatusCode, out
	}
	var obj map[string]any
	if err := json.Unmarshal(out, &obj); err != nil {
		return resp.StatusCode, out
	}
	create := req.Method == http.MethodPost && collections[req.Path]
	if create {
		prefix := "obj_"
		if id, _ := obj["id"].(string); strings.Contains(id, "_") {
			prefix = id[:strings.Index(id, "_")+1]
		}
		obj["id"] = p.newID(prefix)
		if md := metadataOf(req.Form); len(md) > 0 {
			obj["metadata"] = md
		}
		if req.Path == "/v1/payment_intents" && req.Form.Get("confirm") == "true" {
			if status, b, refused := p.confirmPaymentIntent(req, obj); refused {
				p.keep(req.Path, obj)
				return status, b
			}
		}
		if h := p.Hooks(); h.Created != nil {
			h.Created(req, obj)
		}
	}
	if h := p.Hooks(); !create && h.Answered != nil {
		obj = h.Answered(req, obj)
	}
	if r := p.take(req.Method, req.Path, func(r *rule) bool { return r.mutate != nil }); r != nil {
		r.mutate(req, obj)
	}
	if create {
		p.keep(req.Path, obj)
	}
	b, _ := json.Marshal(obj)
	return resp.StatusCode, b
}

// keep stores an object created at a collection path.
func (p *Proxy) keep(coll string, obj map[string]any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.objects[coll] = append(p.objects[coll], obj)
}

func (p *Proxy) search(coll, query string) (int, []byte) {
	m := searchQuery.FindStringSubmatch(query)
	if m == nil {
		return http.StatusBadRequest, []byte(`{"error":{"type":"invalid_request_error","message":"proxy: unsupported search query"}}`)
	}
	data := p.matching(coll, func(o map[string]any) bool {
		md, _ := o["metadata"].(map[string]any)
		return md[m[1]] == m[2]
	})
	b, _ := json.Marshal(map[string]any{
		"object": "search_result", "data": data, "has_more": false, "next_page": nil, "url": coll + "/search",
	})
	return http.StatusOK, b
}

func (p *Proxy) list(coll, field, value string) (int, []byte) {
	data := p.matching(coll, func(o map[string]any) bool { return o[field] == value })
	b, _ := json.Marshal(map[string]any{"object": "list", "data": data, "has_more": false, "url": coll})
	return http.StatusOK, b
}

func (p *Proxy) matching(coll string, keep func(map[string]any) bool) []map[string]any {
	p.mu.Lock()
	defer p.mu.Unlock()
	data := []map[string]any{}
	for _, o := range p.objects[coll] {
		if keep(o) {
			data = append(data, o)
		}
	}
	return data
}

// Objects returns the objects created through the proxy at a collection path.
func (p *Proxy) Objects(coll string) []map[string]any {
	return p.matching(coll, func(map[string]any) bool { return true })
}

func metadataOf(form url.Values) map[string]any {
	md := map[string]any{}
	for k, v := range form {
		if name, ok := strings.CutPrefix(k, "metadata["); ok && strings.HasSuffix(name, "]") && len(v) > 0 {
			md[strings.TrimSuffix(name, "]")] = v[0]
		}
	}
	return md
}

// fingerprint identifies "the same parameters" for the key layer: method, path and the form,
// order-insensitive.
func fingerprint(method, path string, body []byte) string {
	form, _ := url.ParseQuery(string(body))
	keys := make([]string, 0, len(form))
	for k := range form {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString(method + " " + path + "?")
	for _, k := range keys {
		for _, v := range form[k] {
			b.WriteString(url.QueryEscape(k) + "=" + url.QueryEscape(v) + "&")
		}
	}
	return b.String()
}

func drop(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if conn, _, err := hj.Hijack(); err == nil {
			conn.Close()
			return
		}
	}
	panic(http.ErrAbortHandler)
}

func setHeader(w http.ResponseWriter, h http.Header) {
	for k, v := range h {
		w.Header()[k] = v
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	writeRaw(w, status, b)
}

func writeRaw(w http.ResponseWriter, status int, b []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Request-Id", "req_proxy")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
