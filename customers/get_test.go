package customers

import (
	"net/http"
	"testing"

	"billing/internal/apitest"
)

// GET /v1/customers/{user_id} is served here, with the subscriptions and entitlement that billing
// reads from local state.
func TestGetCustomer(t *testing.T) {
	t.Parallel()
	v := newEnv(t, false)
	expectError(t, v.doAs(appToken, http.MethodGet, "/v1/customers/nobody", nil), http.StatusNotFound, "not_found")
	expectError(t, v.doAs(appToken, http.MethodGet, "/v1/customers/a%20b", nil), http.StatusBadRequest, "invalid_user_id")
	expectError(t, v.doAs(adminToken, http.MethodGet, "/v1/customers/u1", nil), http.StatusForbidden, "forbidden")

	v.exec(`INSERT INTO customers (user_id, stripe_customer_id, email) VALUES ('u1', 'cus_1', 'u1@example.com')`)
	v.exec(`INSERT INTO subscriptions (subscription_id, stripe_customer_id, livemode, status, price_id, sub_event_created)
		VALUES ('sub_1', 'cus_1', false, 'active', 'price_1', now())`)
	rec := v.doAs(appToken, http.MethodGet, "/v1/customers/u1", nil)
	expectStatus(t, rec, http.StatusOK)
	body := decode(t, rec)
	subs, _ := body["subscriptions"].([]any)
	ent, _ := body["entitlement"].(map[string]any)
	if body["user_id"] != "u1" || body["stripe_customer_id"] != "cus_1" || body["livemode"] != false || len(subs) != 1 ||
		ent["entitled"] != true || ent["subscription_id"] != "sub_1" {
		t.Errorf("customer view: %v", body)
	}

	// The database being down is an outage the caller should retry.
	v.mount(apitest.UnreachableDB(t))
	expectError(t, v.doAs(appToken, http.MethodGet, "/v1/customers/u1", nil), http.StatusServiceUnavailable, "database_unavailable")
}
