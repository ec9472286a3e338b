package stripetest

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"billing/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// call sends a form-encoded request to the proxy as stripe-go would and decodes the JSON answer.
func call(t *testing.T, p *Proxy, method, path string, form url.Values) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, p.URL+path, strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.SetBasicAuth("sk_test_123", "")
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("%s %s: answer is not JSON: %s", method, path, b)
	}
	return resp.StatusCode, out
}

// A confirmed PaymentIntent ends as test mode ends it for its card, through stripe-mock (which
// validates the parameters) and the proxy.
func TestTestCardsSettleConfirmedPaymentIntents(t *testing.T) {
	p := New(t, testenv.StripeMockURL(t))
	for _, tc := range []struct {
		pm         string
		offSession bool
		status     int
		piStatus   string
		code       string
		decline    string
	}{
		{pm: "pm_card_visa", offSession: true, status: 200, piStatus: "succeeded"},
		{pm: "tok_visa", offSession: true, status: 200, piStatus: "succeeded"},
		{pm: "", offSession: true, status: 200, piStatus: "succeeded"},
		{pm: "pm_card_chargeDeclined", offSession: true, status: 402, piStatus: "requires_payment_method", code: "card_declined", decline: "generic_decline"},
		{pm: "tok_chargeDeclinedInsufficientFunds", offSession: true, status: 402, piStatus: "requires_payment_method", code: "card_declined", decline: "insufficient_funds"},
		{pm: "pm_card_chargeDeclinedInsufficientFunds", offSession: true, status: 402, piStatus: "requires_payment_method", code: "card_declined", decline: "insufficient_funds"},
		{pm: "pm_card_chargeDeclinedExpiredCard", offSession: true, status: 402, piStatus: "requires_payment_method", code: "expired_card"},
		{pm: "pm_card_threeDSecure2Required", offSession: true, status: 402, piStatus: "requires_action", code: "authentication_required", decline: "authentication_required"},
		{pm: "pm_card_authenticationRequired", offSession: true, status: 402, piStatus: "requires_action", code: "authentication_required", decline: "authentication_required"},
		{pm: "pm_card_threeDSecure2Required", offSession: false, status: 200, piStatus: "requires_action"},
	} {
		t.Run(tc.pm, func(t *testing.T) {
			form := url.Values{"amount": {"1000"}, "currency": {"usd"}, "confirm": {"true"}, "metadata[order_id]": {"o_" + tc.pm}}
			if tc.pm != "" {
				form.Set("payment_method", tc.pm)
			}
			if tc.offSession {
				form.Set("off_session", "true")
			}
			status, body := call(t, p, http.MethodPost, "/v1/payment_intents", form)
			if status != tc.status {
				t.Fatalf("status %d, want %d: %v", status, tc.status, body)
			}
			pi := body
			if status != 200 {
				e, _ := body["error"].(map[string]any)
				if str(e, "type") != "card_error" || str(e, "code") != tc.code || str(e, "decline_code") != tc.decline {
					t.Errorf("error %v, want card_error %s/%s", e, tc.code, tc.decline)
				}
				pi, _ = e["payment_intent"].(map[string]any)
				if str(pi, "last_payment_error", "code") != tc.code {
					t.Errorf("last_payment_error %v, want code %s", pi["last_payment_error"], tc.code)
				}
			}
			if str(pi, "status") != tc.piStatus {
				t.Errorf("PaymentIntent status %q, want %q", str(pi, "status"), tc.piStatus)
			}
			// The PaymentIntent exists at "Stripe" whatever its outcome, as at Stripe.
			found := false
			for _, o := range p.Objects("/v1/payment_intents") {
				if o["id"] == pi["id"] {
					found = true
				}
			}
			if !found {
				t.Errorf("PaymentIntent %v not kept", pi["id"])
			}
		})
	}
}

// Without Dev, customers are stripe-mock's (no default payment method) and portal URLs are
// stripe-mock's: the tests that rely on that keep their answers.
func TestDevIsOffForTests(t *testing.T) {
	p := New(t, testenv.StripeMockURL(t))
	_, c := call(t, p, http.MethodPost, "/v1/customers", url.Values{"email": {"a@example.com"}})
	if pm := str(c, "invoice_settings", "default_payment_method"); pm != "" {
		t.Errorf("default payment method %q without Dev", pm)
	}
	_, s := call(t, p, http.MethodPost, "/v1/billing_portal/sessions", url.Values{"customer": {str(c, "id")}})
	if strings.Contains(str(s, "url"), devPortalPath) {
		t.Errorf("portal URL %q rewritten without Dev", str(s, "url"))
	}
}

// In Dev mode a customer's default payment method, set at create or by an update, is what its
// charges use; without one a new customer charges the default test card. The same holds whether
// the proxy keeps the customers itself or the dev loop's account does (DevStripe).
func TestDevCustomersChooseTheirTestCard(t *testing.T) {
	for name, setup := range map[string]func(*Proxy){"proxy": (*Proxy).Dev, "account": func(p *Proxy) { NewDevStripe(p) }} {
		t.Run(name, func(t *testing.T) { testDevCustomersChooseTheirTestCard(t, setup) })
	}
}

func testDevCustomersChooseTheirTestCard(t *testing.T, setup func(*Proxy)) {
	p := New(t, testenv.StripeMockURL(t))
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
	again := New(t, testenv.StripeMockURL(t))
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
	p := New(t, testenv.StripeMockURL(t))
	p.Dev()
	_, s := call(t, p, http.MethodPost, "/v1/billing_portal/sessions", url.Values{
		"customer": {"cus_1"}, "return_url": {"http://localhost:8080/account"},
		"flow_data[type]": {"subscription_cancel"}, "flow_data[subscription_cancel][subscription]": {"sub_1"},
	})
	u := str(s, "url")
	want := p.PortalBase() + devPortalPath + str(s, "id")
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

// Start needs no test, and stop closes the listener.
func TestStartAndStop(t *testing.T) {
	p, stop, err := Start(testenv.StripeMockURL(t))
	if err != nil {
		t.Fatal(err)
	}
	status, _ := call(t, p, http.MethodGet, "/v1/customers/cus_1", nil)
	if status != http.StatusOK {
		t.Fatalf("through a started proxy: %d", status)
	}
	stop()
	if _, err := http.Get(p.URL + "/v1/customers/cus_1"); err == nil {
		t.Error("proxy still answers after stop")
	}
	if _, _, err := Start(""); err == nil {
		t.Error("Start without an upstream succeeded")
	}
}
