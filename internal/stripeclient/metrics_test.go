package stripeclient

import "testing"

func TestEndpointHidesIDs(t *testing.T) {
	for in, want := range map[string]string{
		"/v1/customers/cus_Q1w2E3":                      "/v1/customers/{id}",
		"/v1/payment_intents":                           "/v1/payment_intents",
		"/v1/payment_intents/pi_3Abc/confirm":           "/v1/payment_intents/{id}/confirm",
		"/v1/checkout/sessions/cs_test_a1B2":            "/v1/checkout/sessions/{id}",
		"/v1/billing_portal/sessions":                   "/v1/billing_portal/sessions",
		"/v1/webhook_endpoints/we_123":                  "/v1/webhook_endpoints/{id}",
		"/v1/subscriptions/sub_9/items":                 "/v1/subscriptions/{id}/items",
		"/v1/customers/search":                          "/v1/customers/search",
		"/v1/billing_portal/configurations/bpc_1Nx2yZ3": "/v1/billing_portal/configurations/{id}",
	} {
		if got := Endpoint(in); got != want {
			t.Errorf("Endpoint(%q) = %q, want %q", in, got, want)
		}
	}
}
