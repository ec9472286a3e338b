package stripeemu

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"billing/internal/stripetest"
	"billing/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// call is Call, for this file's tests.
func call(t *testing.T, p *Proxy, method, path string, form url.Values) (int, map[string]any) {
	t.Helper()
	return stripetest.Call(t, p.URL, method, path, form)
}

// str is the string at path in a decoded object ("" when absent or not a string).
func str(m map[string]any, path ...string) string {
	var v any = m
	for _, k := range path {
		o, _ := v.(map[string]any)
		v = o[k]
	}
	s, _ := v.(string)
	return s
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

// Without the dev Stripe's hooks (internal/devstripe), customers are stripe-mock's (no default
// payment method) and portal URLs are stripe-mock's: the tests that rely on that keep their
// answers.
func TestDevIsOffForTests(t *testing.T) {
	p := New(t, testenv.StripeMockURL(t))
	_, c := call(t, p, http.MethodPost, "/v1/customers", url.Values{"email": {"a@example.com"}})
	if pm := str(c, "invoice_settings", "default_payment_method"); pm != "" {
		t.Errorf("default payment method %q without the dev hooks", pm)
	}
	_, s := call(t, p, http.MethodPost, "/v1/billing_portal/sessions", url.Values{"customer": {str(c, "id")}})
	if strings.Contains(str(s, "url"), "/dev-portal/") {
		t.Errorf("portal URL %q rewritten without the dev hooks", str(s, "url"))
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
