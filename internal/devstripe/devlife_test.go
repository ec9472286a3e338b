package devstripe

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"

	"billing/internal/stripeemu"
	"billing/internal/stripeevents"
	"billing/internal/testenv"
)

// devReceiver is a webhook endpoint that keeps the events it is sent.
type devReceiver struct {
	mu     sync.Mutex
	events []map[string]any
}

func (r *devReceiver) types() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, ev := range r.events {
		out = append(out, ev["type"].(string))
	}
	r.events = nil
	return strings.Join(out, " ")
}

func newDevLife(t *testing.T) (*DevStripe, *devReceiver) {
	t.Helper()
	rec := &devReceiver{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, hr *http.Request) {
		b, _ := io.ReadAll(hr.Body)
		var ev map[string]any
		if err := json.Unmarshal(b, &ev); err != nil || hr.Header.Get("Stripe-Signature") == "" {
			http.Error(w, "bad event", http.StatusBadRequest)
			return
		}
		if ev["api_version"] != stripeevents.APIVersion || ev["livemode"] != false {
			t.Errorf("event %v: api_version %v, livemode %v", ev["id"], ev["api_version"], ev["livemode"])
		}
		rec.mu.Lock()
		rec.events = append(rec.events, ev)
		rec.mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	// stripe-mock behind: portal sessions are its (the dev Stripe keeps no state of its own for them).
	d := NewDevStripe(stripeemu.New(t, testenv.StripeMockURL(t)))
	d.Webhooks = &WebhookSender{URL: srv.URL, Secret: "whsec_x"}
	return d, rec
}

func (d *DevStripe) testSession(t *testing.T, customer string, extra url.Values) string {
	t.Helper()
	f := url.Values{"mode": {"subscription"}, "customer": {customer}, "line_items[0][price]": {"price_a"},
		"line_items[0][quantity]": {"3"}, "subscription_data[metadata][user_id]": {"u1"}}
	for k, v := range extra {
		f[k] = v
	}
	status, s := call(t, d.Proxy, http.MethodPost, "/v1/checkout/sessions", f)
	if status != http.StatusOK {
		t.Fatalf("create session: %d %v", status, s)
	}
	return str(s, "id")
}

func devPost(t *testing.T, d *DevStripe, path string, form url.Values) (int, DevResult) {
	t.Helper()
	resp, err := http.PostForm(d.Proxy.URL+path, form)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var res DevResult
	if err := json.NewDecoder(resp.Body).Decode(&res); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, res
}

// Completing Checkout creates the subscription the session asked for, paid, and sends Stripe's
// events in order; time then renews it, fails its renewal on a declining card, and cancels it at
// its period's end.
func TestDevCheckoutAndClockPlayASubscriptionsLife(t *testing.T) {
	d, rec := newDevLife(t)
	_, c := call(t, d.Proxy, http.MethodPost, "/v1/customers", url.Values{"email": {"a@example.com"}})
	cus := str(c, "id")
	cs := d.testSession(t, cus, nil)

	status, res := devPost(t, d, "/dev/checkout/sessions/"+cs+"/complete", nil)
	if status != http.StatusOK || len(res.Changes) != 1 || res.Changes[0].Status != "active" {
		t.Fatalf("complete: %d %+v", status, res)
	}
	if got := rec.types(); got != "customer.subscription.created invoice.paid invoice.payment_succeeded checkout.session.completed" {
		t.Errorf("events of a completed Checkout: %s", got)
	}
	sub := res.Changes[0].Subscription
	_, s := call(t, d.Proxy, http.MethodGet, "/v1/subscriptions/"+sub+"?expand[]=latest_invoice", nil)
	items, _ := s["items"].(map[string]any)["data"].([]any)
	if str(s, "customer") != cus || str(s, "metadata", "user_id") != "u1" || len(items) != 1 ||
		items[0].(map[string]any)["quantity"] != float64(3) || str(s, "latest_invoice", "status") != "paid" {
		t.Errorf("subscription as read: %v", s)
	}
	if got := d.Sessions.Get(cs); got["status"] != "complete" || got["subscription"] != sub {
		t.Errorf("session after: %v", got)
	}
	if status, _ := devPost(t, d, "/dev/checkout/sessions/"+cs+"/complete", nil); status != http.StatusConflict {
		t.Errorf("completing a complete session: %d, want 409", status)
	}

	// Within the period nothing is due; past its end it renews, paid.
	if _, res := devPost(t, d, "/dev/advance", url.Values{"days": {"10"}}); len(res.Changes) != 0 || rec.types() != "" {
		t.Errorf("10 days on: %+v", res)
	}
	// Usage of the period is billed in arrears on the renewal's invoice; another customer's is not.
	for i, cu := range []string{cus, cus, "cus_other"} {
		if status, ev := call(t, d.Proxy, http.MethodPost, "/v1/billing/meter_events", url.Values{"event_name": {"api_calls"},
			"identifier": {"u-" + strconv.Itoa(i)}, "payload[stripe_customer_id]": {cu}, "payload[value]": {"70"}}); status != http.StatusOK {
			t.Fatalf("meter event: %d %v", status, ev)
		}
	}
	_, res = devPost(t, d, "/dev/advance", url.Values{"days": {"21"}})
	if len(res.Changes) != 1 || res.Changes[0].What != "renewed" || res.Changes[0].Usage != 140 {
		t.Errorf("31 days on: %+v", res)
	} else if inv := decode(d.Account.Invoice(res.Changes[0].Invoice)); inv["amount_due"] != float64(3*DevUnitAmount+140*DevUsageUnitAmount) {
		t.Errorf("the renewal's invoice: %v", inv)
	}
	if got := rec.types(); got != "customer.subscription.updated invoice.paid invoice.payment_succeeded" {
		t.Errorf("events of a renewal: %s", got)
	}

	// A declining default card fails the next renewal: past_due.
	call(t, d.Proxy, http.MethodPost, "/v1/customers/"+cus, url.Values{"invoice_settings[default_payment_method]": {"pm_card_chargeDeclined"}})
	if _, res := devPost(t, d, "/dev/advance", url.Values{"days": {"31"}}); len(res.Changes) != 1 || res.Changes[0].Status != "past_due" {
		t.Errorf("renewal on a declining card: %+v", res)
	}
	if got := rec.types(); got != "invoice.payment_failed customer.subscription.updated" {
		t.Errorf("events of a failed renewal: %s", got)
	}

	// Smart Retries: 3 days on the card still declines; 5 days later a working card pays.
	if _, res := devPost(t, d, "/dev/advance", url.Values{"days": {"3"}}); len(res.Changes) != 1 || res.Changes[0].What != "retry_failed" {
		t.Errorf("first retry on a declining card: %+v", res)
	}
	if got := rec.types(); got != "invoice.payment_failed" {
		t.Errorf("events of a failed retry: %s", got)
	}
	call(t, d.Proxy, http.MethodPost, "/v1/customers/"+cus, url.Values{"invoice_settings[default_payment_method]": {"pm_card_visa"}})
	if _, res := devPost(t, d, "/dev/advance", url.Values{"days": {"4"}}); len(res.Changes) != 0 {
		t.Errorf("before the second retry: %+v", res)
	}
	if _, res := devPost(t, d, "/dev/advance", url.Values{"days": {"1"}}); len(res.Changes) != 1 || res.Changes[0].What != "retry_paid" || res.Changes[0].Status != "active" {
		t.Errorf("second retry on a working card: %+v", res)
	}
	if got := rec.types(); got != "invoice.paid invoice.payment_succeeded customer.subscription.updated" {
		t.Errorf("events of a paid retry: %s", got)
	}

	// Canceled in the portal, it ends at its period's end.
	status, ps := call(t, d.Proxy, http.MethodPost, "/v1/billing_portal/sessions", url.Values{"customer": {cus},
		"flow_data[type]": {"subscription_cancel"}, "flow_data[subscription_cancel][subscription]": {sub}})
	if status != http.StatusOK {
		t.Fatalf("portal session: %d %v", status, ps)
	}
	if status, res := devPost(t, d, "/dev/portal/sessions/"+str(ps, "id")+"/apply", url.Values{"quantity": {"2"}}); status != http.StatusBadRequest {
		t.Errorf("a seat change in a cancellation flow: %d %+v", status, res)
	}
	if _, res := devPost(t, d, "/dev/portal/sessions/"+str(ps, "id")+"/apply", nil); len(res.Changes) != 1 || res.Changes[0].What != "cancel_at_period_end" {
		t.Errorf("portal cancel: %+v", res)
	}
	if got := rec.types(); got != "customer.subscription.updated" {
		t.Errorf("events of a portal cancel: %s", got)
	}
	if _, s := call(t, d.Proxy, http.MethodGet, "/v1/subscriptions/"+sub, nil); s["cancel_at_period_end"] != true || s["status"] != "active" {
		t.Errorf("after the portal cancel: %v", s)
	}
	if status, _ := devPost(t, d, "/dev/portal/sessions/"+str(ps, "id")+"/apply", nil); status != http.StatusConflict {
		t.Errorf("cancelling twice: %d, want 409", status)
	}
	if _, res := devPost(t, d, "/dev/advance", url.Values{"days": {"31"}}); len(res.Changes) != 1 || res.Changes[0].Status != "canceled" {
		t.Errorf("cancel at period end: %+v", res)
	}
	if got := rec.types(); got != "customer.subscription.deleted" {
		t.Errorf("events of the end: %s", got)
	}
}

// A seat change confirmed in the portal takes the flow's item; retries that all decline end the
// subscription.
func TestDevPortalChangeAndExhaustedRetries(t *testing.T) {
	d, rec := newDevLife(t)
	_, c := call(t, d.Proxy, http.MethodPost, "/v1/customers", url.Values{"email": {"a@example.com"}})
	cus := str(c, "id")
	_, res := devPost(t, d, "/dev/checkout/sessions/"+d.testSession(t, cus, nil)+"/complete", nil)
	sub := res.Changes[0].Subscription
	rec.types()

	_, other := call(t, d.Proxy, http.MethodPost, "/v1/customers", url.Values{"email": {"b@example.com"}})
	_, foreign := call(t, d.Proxy, http.MethodPost, "/v1/billing_portal/sessions", url.Values{"customer": {str(other, "id")},
		"flow_data[type]": {"subscription_cancel"}, "flow_data[subscription_cancel][subscription]": {sub}})
	if status, _ := devPost(t, d, "/dev/portal/sessions/"+str(foreign, "id")+"/apply", nil); status != http.StatusForbidden {
		t.Errorf("another customer's subscription: %d, want 403", status)
	}
	status, ps := call(t, d.Proxy, http.MethodPost, "/v1/billing_portal/sessions", url.Values{"customer": {cus},
		"flow_data[type]": {"subscription_update_confirm"},
		"flow_data[subscription_update_confirm][subscription]":       {sub},
		"flow_data[subscription_update_confirm][items][0][id]":       {"si_x"},
		"flow_data[subscription_update_confirm][items][0][price]":    {"price_team"},
		"flow_data[subscription_update_confirm][items][0][quantity]": {"5"}})
	if status != http.StatusOK {
		t.Fatalf("portal session: %d %v", status, ps)
	}
	if _, res := devPost(t, d, "/dev/portal/sessions/"+strings.TrimPrefix(str(ps, "url"), PortalBase(d.Proxy)+devPortalPath)+"/apply", nil); len(res.Changes) != 1 || res.Changes[0].What != "changed" {
		t.Errorf("portal change: %+v", res)
	}
	// price_team is the catalog's Team: its features become the customer's.
	if got := rec.types(); got != "customer.subscription.updated entitlements.active_entitlement_summary.updated" {
		t.Errorf("events of a portal change: %s", got)
	}
	_, s := call(t, d.Proxy, http.MethodGet, "/v1/subscriptions/"+sub, nil)
	items, _ := s["items"].(map[string]any)["data"].([]any)
	if len(items) != 1 || items[0].(map[string]any)["quantity"] != float64(5) || str(items[0].(map[string]any), "price", "id") != "price_team" {
		t.Errorf("after the portal change: %v", s)
	}

	// Every attempt declines: three retries (3, 5 and 7 days apart), then the subscription ends.
	call(t, d.Proxy, http.MethodPost, "/v1/customers/"+cus, url.Values{"invoice_settings[default_payment_method]": {"pm_card_chargeDeclined"}})
	_, res = devPost(t, d, "/dev/advance", url.Values{"days": {"47"}})
	var what []string
	for _, ch := range res.Changes {
		what = append(what, ch.What)
	}
	if got := strings.Join(what, " "); got != "renewal_failed retry_failed retry_failed retries_exhausted" {
		t.Errorf("a month and 16 days on a declining card: %s", got)
	}
	if got := rec.types(); got != "invoice.payment_failed customer.subscription.updated invoice.payment_failed invoice.payment_failed invoice.payment_failed customer.subscription.deleted entitlements.active_entitlement_summary.updated" {
		t.Errorf("events of exhausted retries: %s", got)
	}
	if _, s := call(t, d.Proxy, http.MethodGet, "/v1/subscriptions/"+sub, nil); s["status"] != "canceled" {
		t.Errorf("after the retries: %v", s["status"])
	}
}

// A declining card at Checkout leaves the session open and the subscription incomplete; paying
// again with a working card completes both. A trial's first invoice is of nothing.
func TestDevCheckoutDeclinedThenPaidAndTrials(t *testing.T) {
	d, rec := newDevLife(t)
	_, c := call(t, d.Proxy, http.MethodPost, "/v1/customers", url.Values{"email": {"a@example.com"}})
	cus := str(c, "id")
	cs := d.testSession(t, cus, nil)
	status, res := devPost(t, d, "/dev/checkout/sessions/"+cs+"/complete", url.Values{"card": {"pm_card_chargeDeclined"}})
	if status != http.StatusOK || res.Changes[0].Status != "incomplete" || d.Sessions.Get(cs)["status"] != "open" {
		t.Fatalf("declined: %d %+v", status, res)
	}
	if got := rec.types(); got != "customer.subscription.created invoice.payment_failed" {
		t.Errorf("events of a declined Checkout: %s", got)
	}
	_, res = devPost(t, d, "/dev/checkout/sessions/"+cs+"/complete", url.Values{"card": {"pm_card_visa"}})
	if res.Changes[0].Status != "active" || d.Sessions.Get(cs)["status"] != "complete" || len(d.Account.SubscriptionIDs()) != 1 {
		t.Errorf("paid again: %+v", res)
	}
	if got := rec.types(); got != "invoice.paid invoice.payment_succeeded customer.subscription.updated checkout.session.completed" {
		t.Errorf("events of the second try: %s", got)
	}

	trial := d.testSession(t, cus, url.Values{"subscription_data[trial_period_days]": {"14"}})
	_, res = devPost(t, d, "/dev/checkout/sessions/"+trial+"/complete", nil)
	if res.Changes[0].Status != "trialing" || res.Changes[0].InvoiceStatus != "paid" {
		t.Errorf("trial: %+v", res)
	}
	rec.types()
	_, res = devPost(t, d, "/dev/advance", url.Values{"days": {"15"}})
	if len(res.Changes) != 1 || res.Changes[0].What != "renewed" || res.Changes[0].Status != "active" {
		t.Errorf("trial's end: %+v", res)
	}
	if status, _ := devPost(t, d, "/dev/checkout/sessions/cs_unknown/complete", nil); status != http.StatusNotFound {
		t.Errorf("unknown session: %d", status)
	}
	if status, _ := devPost(t, d, "/dev/advance", url.Values{"days": {"-1"}}); status != http.StatusBadRequest {
		t.Errorf("negative days: %d", status)
	}
}

// The session's url is the dev Stripe's page of it, whose form pays the session and sends the
// customer to the success URL; a portal session's page offers what its flow allows, and its form
// sends the customer back to the app.
func TestDevPagesPlayTheCustomer(t *testing.T) {
	d, rec := newDevLife(t)
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	_, c := call(t, d.Proxy, http.MethodPost, "/v1/customers", url.Values{"email": {"a@example.com"}})
	cus := str(c, "id")
	cs := d.testSession(t, cus, url.Values{"success_url": {"http://localhost:8080/welcome?s={CHECKOUT_SESSION_ID}"}})
	page := str(d.Sessions.Get(cs), "url")
	if !strings.HasPrefix(page, PortalBase(d.Proxy)+"/dev/checkout/sessions/") {
		t.Fatalf("session url %q is not the dev Stripe's page", page)
	}
	resp, err := http.Get(page)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `action="/dev/checkout/sessions/`+cs+`/complete"`) ||
		!strings.Contains(string(body), "pm_card_chargeDeclined") {
		t.Fatalf("checkout page: %d\n%s", resp.StatusCode, body)
	}
	resp, err = noFollow.PostForm(d.Proxy.URL+"/dev/checkout/sessions/"+cs+"/complete", url.Values{"page": {"1"}, "card": {"pm_card_visa"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "http://localhost:8080/welcome?s="+cs {
		t.Errorf("paying on the page: %d to %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	if got := rec.types(); !strings.HasSuffix(got, "checkout.session.completed") {
		t.Errorf("events of the page's payment: %s", got)
	}
	sub := d.Sessions.Get(cs)["subscription"].(string)

	_, ps := call(t, d.Proxy, http.MethodPost, "/v1/billing_portal/sessions", url.Values{"customer": {cus},
		"flow_data[type]": {"subscription_cancel"}, "flow_data[subscription_cancel][subscription]": {sub},
		"flow_data[after_completion][type]":                 {"redirect"},
		"flow_data[after_completion][redirect][return_url]": {"http://localhost:8080/account"}})
	resp, err = http.Get(str(ps, "url"))
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `name="action" value="cancel"`) || strings.Contains(string(body), `value="update"`) {
		t.Errorf("a cancellation's portal page offers:\n%s", body)
	}
	resp, err = noFollow.PostForm(d.Proxy.URL+"/dev/portal/sessions/"+str(ps, "id")+"/apply", url.Values{"page": {"1"}, "action": {"cancel"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "http://localhost:8080/account" {
		t.Errorf("cancelling on the page: %d to %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	if got := rec.types(); got != "customer.subscription.updated" {
		t.Errorf("events of the page's cancel: %s", got)
	}
}
