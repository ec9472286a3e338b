package devstripe

import (
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"billing/internal/stripeemu"
	"billing/internal/stripetest"
	"billing/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// call is stripetest.Call, for this file's tests.
func call(t *testing.T, p *stripeemu.Proxy, method, path string, form url.Values) (int, map[string]any) {
	t.Helper()
	return stripetest.Call(t, p.URL, method, path, form)
}

// itemID is the id of a subscription's (only) item, as the account names it.
func itemID(subscriptionID string) string {
	return "si_" + strings.TrimPrefix(subscriptionID, "sub_")
}

// In Dev mode a customer's default payment method, set at create or by an update, is what its
// charges use; without one a new customer charges the default test card. The same holds whether
// the proxy keeps the customers itself or the dev loop's account does (DevStripe).
func TestDevCustomersChooseTheirTestCard(t *testing.T) {
	for name, setup := range map[string]func(*stripeemu.Proxy){"proxy": Dev, "account": func(p *stripeemu.Proxy) { NewDevStripe(p) }} {
		t.Run(name, func(t *testing.T) { testDevCustomersChooseTheirTestCard(t, setup) })
	}
}

func testDevCustomersChooseTheirTestCard(t *testing.T, setup func(*stripeemu.Proxy)) {
	p := stripeemu.New(t, testenv.StripeMockURL(t))
	setup(p)

	_, c := call(t, p, http.MethodPost, "/v1/customers", url.Values{"email": {"a@example.com"}, "metadata[user_id]": {"u1"}})
	id := str(c, "id")
	if pm := str(c, "invoice_settings", "default_payment_method"); pm != DefaultCard {
		t.Fatalf("new customer's default payment method %q, want %s", pm, DefaultCard)
	}
	if _, got := call(t, p, http.MethodGet, "/v1/customers/"+id, nil); str(got, "invoice_settings", "default_payment_method") != DefaultCard || str(got, "email") != "a@example.com" {
		t.Errorf("retrieve answers %v, not the kept customer", got)
	}
	_, upd := call(t, p, http.MethodPost, "/v1/customers/"+id, url.Values{"invoice_settings[default_payment_method]": {"pm_card_chargeDeclined"}})
	if str(upd, "invoice_settings", "default_payment_method") != "pm_card_chargeDeclined" {
		t.Errorf("update answers %v", upd)
	}
	if _, got := call(t, p, http.MethodGet, "/v1/customers/"+id, nil); str(got, "invoice_settings", "default_payment_method") != "pm_card_chargeDeclined" || str(got, "metadata", "user_id") != "u1" {
		t.Errorf("retrieve after update answers %v", got)
	}

	// Another dev Stripe (a restart of make run) never hands out the same ids.
	again := stripeemu.New(t, testenv.StripeMockURL(t))
	setup(again)
	if _, c := call(t, again, http.MethodPost, "/v1/customers", url.Values{"email": {"a@example.com"}}); str(c, "id") == id {
		t.Errorf("a second dev proxy reused customer id %s", id)
	}

	// A default source is charged when the payment names no method, as Stripe does.
	_, c2 := call(t, p, http.MethodPost, "/v1/customers", url.Values{"source": {"tok_chargeDeclinedInsufficientFunds"}})
	if pm := str(c2, "invoice_settings", "default_payment_method"); pm != "" {
		t.Errorf("customer with a source got default payment method %q", pm)
	}
	status, body := call(t, p, http.MethodPost, "/v1/payment_intents", url.Values{
		"amount": {"500"}, "currency": {"usd"}, "confirm": {"true"}, "off_session": {"true"}, "customer": {str(c2, "id")}})
	if status != http.StatusPaymentRequired || str(body, "error", "decline_code") != "insufficient_funds" {
		t.Errorf("charge of the default source: %d %v", status, body)
	}
}

// In Dev mode a portal session's URL is a local page that exists, never stripe-mock's
// placeholder.
func TestDevPortalSessionsAreLocalPages(t *testing.T) {
	p := stripeemu.New(t, testenv.StripeMockURL(t))
	Dev(p)
	_, s := call(t, p, http.MethodPost, "/v1/billing_portal/sessions", url.Values{
		"customer": {"cus_1"}, "return_url": {"http://localhost:8080/account"},
		"flow_data[type]": {"subscription_cancel"}, "flow_data[subscription_cancel][subscription]": {"sub_1"},
	})
	u := str(s, "url")
	want := PortalBase(p) + devPortalPath + str(s, "id")
	if u != want || strings.Contains(u, "{") || !strings.HasPrefix(u, "http://localhost:") {
		t.Fatalf("portal URL %q, want %q", u, want)
	}
	resp, err := http.Get(strings.Replace(u, "localhost", "127.0.0.1", 1))
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, w := range []string{str(s, "id"), "cus_1", "sub_1", "subscription_cancel", `href="http://localhost:8080/account"`} {
		if !strings.Contains(string(page), w) {
			t.Errorf("portal page lacks %q:\n%s", w, page)
		}
	}
	resp, err = http.Get(p.URL + devPortalPath + "bps_unknown")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("unknown session: %d, want 404", resp.StatusCode)
	}
}
