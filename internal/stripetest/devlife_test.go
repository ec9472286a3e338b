package stripetest

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"billing/internal/stripeevents"
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
	d := NewDevStripe(New(t, newTestServer(t, http.NotFoundHandler())))
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
	if _, res := devPost(t, d, "/dev/advance", url.Values{"days": {"21"}}); len(res.Changes) != 1 || res.Changes[0].What != "renewed" {
		t.Errorf("31 days on: %+v", res)
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

	// Set to cancel at the period's end, it ends there.
	call(t, d.Proxy, http.MethodPost, "/v1/subscriptions/"+sub, url.Values{"cancel_at_period_end": {"true"}})
	if _, res := devPost(t, d, "/dev/advance", url.Values{"days": {"31"}}); len(res.Changes) != 1 || res.Changes[0].Status != "canceled" {
		t.Errorf("cancel at period end: %+v", res)
	}
	if got := rec.types(); got != "customer.subscription.deleted" {
		t.Errorf("events of the end: %s", got)
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
