package main

import (
	"bytes"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"billing/internal/apitest"
	"billing/internal/stripeevents"
	"billing/openapi"
)

var echoParam = regexp.MustCompile(`:([A-Za-z0-9_]+)`)

// The OpenAPI document names exactly the routes newApp registers: a new route fails here until
// it is described in openapi/openapi.yaml, and so does a described route that is gone.
func TestOpenAPIDocumentsEveryRoute(t *testing.T) {
	t.Parallel()
	d := newDevService(t)
	registered := map[openapi.Operation]bool{}
	for _, r := range d.app.Echo.Routes() {
		if !slices.Contains([]string{"GET", "PUT", "POST", "DELETE", "PATCH"}, r.Method) {
			continue // echo's own not-found routes of groups
		}
		registered[openapi.Operation{Method: r.Method, Path: echoParam.ReplaceAllString(r.Path, "{$1}")}] = true
	}
	documented := map[openapi.Operation]bool{}
	for _, op := range openapi.Operations() {
		documented[op] = true
		if !registered[op] {
			t.Errorf("openapi/openapi.yaml describes %s %s, which the service does not serve", op.Method, op.Path)
		}
	}
	for op := range registered {
		if !documented[op] {
			t.Errorf("%s %s is served but not described in openapi/openapi.yaml", op.Method, op.Path)
		}
	}
	if len(registered) < 20 {
		t.Errorf("only %d routes registered: is the app wired?", len(registered))
	}
}

// webhook posts a signed sample event, checks the answer against the document and returns the
// event's id and the answer's body.
func (d *devService) webhook(typ string, o stripeevents.SampleOptions) (string, string) {
	d.t.Helper()
	if o.EventID == "" {
		o.EventID = "evt_oa_" + strings.ReplaceAll(typ, ".", "_") + "_" + o.Status + o.APIVersion
	}
	payload, err := stripeevents.SampleWith(typ, o)
	if err != nil {
		d.t.Fatal(err)
	}
	return o.EventID, d.deliver(typ, payload)
}

// deliver posts a built event, signed, checks the answer against the document and returns its body.
func (d *devService) deliver(typ string, payload []byte) string {
	d.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, d.server.URL+"/webhooks/stripe", bytes.NewReader(payload))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Stripe-Signature", stripeevents.SignatureHeader(payload, devSecret, time.Now()))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		d.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if err := openapi.CheckResponse(http.MethodPost, "/webhooks/stripe", resp.StatusCode, resp.Header.Get("Content-Type"), b); err != nil {
		d.t.Errorf("webhook answer outside the document: %v", err)
	}
	if resp.StatusCode != http.StatusOK {
		d.t.Fatalf("webhook %s: %d %s", typ, resp.StatusCode, b)
	}
	return string(b)
}

// The answers of every JSON endpoint, in success and in error, fit the document's schemas (each
// call goes through devService.do, which checks it).
func TestOpenAPIAnswersFitTheDocument(t *testing.T) {
	t.Parallel()
	d := newDevService(t)
	app, admin := apitest.AppToken, apitest.AdminToken
	expect := func(want int) func(int, map[string]any) {
		return func(got int, body map[string]any) {
			t.Helper()
			if got != want {
				t.Errorf("status %d, want %d: %v", got, want, body)
			}
		}
	}

	expect(200)(d.do("", http.MethodGet, "/healthz", nil))
	expect(200)(d.do("", http.MethodGet, "/readyz", nil))
	expect(200)(d.do("", http.MethodGet, "/openapi.json", nil))
	expect(401)(d.do("", http.MethodGet, "/v1/customers/u_oa", nil))
	expect(404)(d.do(app, http.MethodGet, "/v1/customers/u_nobody", nil))
	expect(400)(d.do(app, http.MethodPut, "/v1/customers/u_oa", map[string]any{"email": 5}))

	_, link := d.do(app, http.MethodPut, "/v1/customers/u_oa", map[string]any{"email": "oa@example.com", "name": "OA"})
	cus, _ := link["stripe_customer_id"].(string)
	expect(200)(d.do(app, http.MethodPut, "/v1/customers/u_oa", map[string]any{"email": "oa@example.com", "name": "OA"}))

	// A subscription with a hold, so that lists have items to check.
	d.start(t)
	wait := eventWaiter{db: d.app.DB}
	o := stripeevents.SampleOptions{Suffix: "oa", Customer: cus, Subscription: "sub_oa", Invoice: "in_oa"}
	created, _ := d.webhook("customer.subscription.created", o)
	wait.processed(t, created)
	failed, _ := d.webhook("invoice.payment_failed", o)
	wait.processed(t, failed)
	if _, answer := d.webhook("customer.subscription.created", o); !strings.Contains(answer, `"duplicate"`) {
		t.Errorf("redelivery answered %s", answer)
	}
	old := o
	old.APIVersion = "2020-08-27"
	dead, _ := d.webhook("customer.subscription.updated", old)

	_, cust := d.do(app, http.MethodGet, "/v1/customers/u_oa", nil)
	if subs, _ := cust["subscriptions"].([]any); len(subs) != 1 {
		t.Errorf("customer view has %d subscriptions, want 1: %v", len(subs), cust)
	}
	expect(200)(d.do(app, http.MethodGet, "/v1/customers/u_oa/entitlement", nil))
	features, _ := d.webhook("entitlements.active_entitlement_summary.updated", stripeevents.SampleOptions{Suffix: "oa_f", Customer: cus, Features: []string{"premium"}})
	wait.processed(t, features)
	expect(200)(d.do(app, http.MethodGet, "/v1/customers/u_oa/features/premium", nil))
	expect(404)(d.do(app, http.MethodGet, "/v1/customers/u_nobody/features/premium", nil))
	expect(400)(d.do(app, http.MethodGet, "/v1/customers/u_oa/features/"+strings.Repeat("k", 201), nil))
	expect(200)(d.do(app, http.MethodGet, "/v1/customers/u_oa/invoices?limit=10", nil))
	_, holds := d.do(admin, http.MethodGet, "/admin/holds", nil)
	if h, _ := holds["holds"].([]any); len(h) != 1 {
		t.Errorf("holds %v, want one", holds)
	}
	_, evs := d.do(admin, http.MethodGet, "/admin/events?limit=10", nil)
	if e, _ := evs["events"].([]any); len(e) < 3 {
		t.Errorf("events %v, want three or more", evs)
	}
	expect(200)(d.do(admin, http.MethodGet, "/admin/events/"+created, nil))
	expect(409)(d.do(admin, http.MethodPost, "/admin/events/"+created+"/replay", nil))
	expect(202)(d.do(admin, http.MethodPost, "/admin/events/"+dead+"/replay", nil))
	expect(404)(d.do(admin, http.MethodGet, "/admin/events/evt_none", nil))
	expect(403)(d.do(app, http.MethodGet, "/admin/holds", nil))
	expect(200)(d.do(admin, http.MethodGet, "/admin/reconcile/runs", nil))
	expect(200)(d.do(admin, http.MethodGet, "/admin", nil))

	// Money.
	charge := map[string]any{"order_id": "o_oa", "user_id": "u_oa", "amount": 1250, "currency": "eur", "description": "Pro plan"}
	expect(201)(d.do(app, http.MethodPost, "/v1/charges", charge))
	expect(200)(d.do(app, http.MethodPost, "/v1/charges", charge))
	charge["amount"] = 1300
	expect(409)(d.do(app, http.MethodPost, "/v1/charges", charge))
	d.do(app, http.MethodGet, "/v1/charges/o_oa", nil)
	expect(201)(d.do(app, http.MethodPost, "/v1/charges/o_oa/refunds", map[string]any{"refund_id": "r1", "amount": 250}))
	expect(200)(d.do(app, http.MethodPost, "/v1/charges/o_oa/refunds", map[string]any{"refund_id": "r1", "amount": 250}))
	expect(422)(d.do(app, http.MethodPost, "/v1/charges/o_oa/refunds", map[string]any{"refund_id": "r2", "amount": 5000}))
	expect(404)(d.do(app, http.MethodPost, "/v1/charges/o_none/refunds", map[string]any{"refund_id": "r1"}))
	d.setCard(cus, "pm_card_chargeDeclinedInsufficientFunds")
	expect(402)(d.do(app, http.MethodPost, "/v1/charges", map[string]any{"order_id": "o_oa2", "user_id": "u_oa", "amount": 500, "currency": "eur"}))

	// Usage.
	use := map[string]any{"usage_id": "use_oa", "meter": "api_calls", "value": 3}
	expect(202)(d.do(app, http.MethodPost, "/v1/customers/u_oa/usage", use))
	expect(200)(d.do(app, http.MethodPost, "/v1/customers/u_oa/usage", use))
	use["value"] = 4
	expect(409)(d.do(app, http.MethodPost, "/v1/customers/u_oa/usage", use))
	expect(422)(d.do(app, http.MethodPost, "/v1/customers/u_oa/usage", map[string]any{"usage_id": "use_old", "meter": "api_calls", "value": 1, "timestamp": 1000}))
	expect(200)(d.do(app, http.MethodGet, "/v1/customers/u_oa/usage?meter=api_calls", nil))
	expect(200)(d.do(admin, http.MethodGet, "/admin/usage/review", nil))
	expect(409)(d.do(admin, http.MethodPost, "/admin/usage/review/u_oa/use_oa", map[string]any{"decision": "resend"}))

	// The portal.
	expect(201)(d.do(app, http.MethodPost, "/v1/customers/u_oa/portal-sessions", map[string]any{"return_url": "https://app.example.com/account"}))
	expect(303)(d.do(app, http.MethodPost, "/v1/customers/u_oa/subscriptions/sub_oa/cancel", nil))
	expect(404)(d.do(app, http.MethodPost, "/v1/customers/u_oa/subscriptions/sub_other/cancel", nil))
	// Checkout: whatever it answers must be described.
	d.do(app, http.MethodPost, "/v1/customers/u_oa/checkout-sessions", map[string]any{"request_id": "r1", "price_id": "price_monthly"})

	// The catalog, a preview, and the refusals of lookup keys and codes.
	now := time.Now()
	d.deliver("product.created", stripeevents.ProductEvent("evt_oa_prod", "product.created", now, false,
		stripeevents.Product{ID: "prod_oa", Name: "OA", Description: "described"}))
	for _, p := range []stripeevents.Price{
		{ID: "price_oa_m", Product: "prod_oa", LookupKey: "oa_monthly", UnitAmount: 900, Interval: "month"},
		{ID: "price_oa_t", Product: "prod_oa", Interval: "month", UsageType: "metered", Meter: "mtr_oa",
			Tiers: []stripeevents.Tier{{UpTo: 10, UnitAmount: 0}, {UnitAmount: 5}}},
		{ID: "price_oa_once", Product: "prod_oa", UnitAmount: 100},
	} {
		d.deliver("price.created", stripeevents.PriceEvent("evt_oa_"+p.ID, "price.created", now, false, p))
		wait.processed(t, "evt_oa_"+p.ID)
	}
	_, prices := d.do(app, http.MethodGet, "/v1/prices?active=true", nil)
	if ps, _ := prices["prices"].([]any); len(ps) < 3 {
		t.Errorf("prices %v, want the three of prod_oa", prices)
	}
	expect(400)(d.do(app, http.MethodGet, "/v1/prices?active=maybe", nil))
	expect(200)(d.do(app, http.MethodPost, "/v1/customers/u_oa/subscriptions/sub_oa/change/preview", map[string]any{}))
	expect(422)(d.do(app, http.MethodPost, "/v1/customers/u_oa/subscriptions/sub_oa/change/preview", map[string]any{"price_lookup_key": "nobody_sells"}))
	expect(422)(d.do(app, http.MethodPost, "/v1/customers/u_oa_new/checkout-sessions", map[string]any{"request_id": "r2", "price_lookup_key": "oa_monthly", "promotion_code": "NOSUCHCODE",
		"success_url": "https://app.example.com/ok", "cancel_url": "https://app.example.com/no"}))
	expect(422)(d.do(app, http.MethodPost, "/v1/customers/u_oa_new/checkout-sessions", map[string]any{"request_id": "r3", "price_lookup_key": "nobody_sells",
		"success_url": "https://app.example.com/ok", "cancel_url": "https://app.example.com/no"}))
	d.do(app, http.MethodGet, "/v1/checkout-sessions/cs_test_unknown", nil)
}
