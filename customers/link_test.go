package customers

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"billing/internal/apitest"
	"billing/internal/stripeemu"
)

// stripeCustomer makes Stripe's answer to reads of a customer carry the given metadata and mode.
func (v *env) stripeCustomer(id string, metadata map[string]any, livemode bool) {
	v.proxy.Mutate(http.MethodGet, customersPath+"/"+id, -1, func(_ stripeemu.Request, obj map[string]any) {
		obj["id"], obj["metadata"], obj["livemode"] = id, metadata, livemode
		obj["email"], obj["name"] = "owner@example.com", "Owner"
	})
}

func (v *env) updates(id string) []stripeemu.Request {
	return v.proxy.Filter(http.MethodPost, customersPath+"/"+id)
}

// A customer whose metadata names the user is linked as it is; a repeat answers from the link.
func TestLinkExistingCustomerOfTheUser(t *testing.T) {
	t.Parallel()
	v := newEnv(t, false)
	v.stripeCustomer("cus_own", map[string]any{"user_id": "u1"}, false)
	rec := v.put("u1", body{"stripe_customer_id": "cus_own"})
	expectStatus(t, rec, http.StatusCreated)
	if got := decode(t, rec); got["user_id"] != "u1" || got["stripe_customer_id"] != "cus_own" || got["livemode"] != false {
		t.Fatalf("answer %v", got)
	}
	if row := v.row("u1"); row.StripeID() != "cus_own" || row.Email != "owner@example.com" || row.Name != "Owner" {
		t.Errorf("row %+v", row)
	}
	if n := len(v.updates("cus_own")); n != 0 {
		t.Errorf("%d updates of a customer whose metadata names the user", n)
	}
	if n := len(v.proxy.Filter(http.MethodPost, customersPath)); n != 0 {
		t.Errorf("%d customers created", n)
	}
	calls := len(v.proxy.Requests())
	expectStatus(t, v.put("u1", body{"stripe_customer_id": "cus_own"}), http.StatusOK)
	if n := len(v.proxy.Requests()); n != calls {
		t.Errorf("the repeat called Stripe %d times", n-calls)
	}

	// The ordinary PUT keeps working on the linked customer: it updates it, never makes one.
	expectStatus(t, v.put("u1", body{"email": "ada@example.com", "name": "Ada"}), http.StatusOK)
	ups := v.updates("cus_own")
	if len(ups) != 1 || ups[0].Form.Get("email") != "ada@example.com" || len(v.proxy.Filter(http.MethodPost, customersPath)) != 0 {
		t.Errorf("updates %+v", ups)
	}
}

// A customer without metadata.user_id gets it.
func TestLinkExistingCustomerSetsTheMetadata(t *testing.T) {
	t.Parallel()
	v := newEnv(t, false)
	v.stripeCustomer("cus_bare", map[string]any{}, false)
	expectStatus(t, v.put("u1", body{"stripe_customer_id": "cus_bare"}), http.StatusCreated)
	ups := v.updates("cus_bare")
	if len(ups) != 1 || ups[0].Form.Get("metadata[user_id]") != "u1" || len(ups[0].Form) != 1 {
		t.Fatalf("updates %+v", ups)
	}
	if row := v.row("u1"); row.StripeID() != "cus_bare" {
		t.Errorf("row %+v", row)
	}
}

// When Stripe refuses the metadata, nothing is linked, and the same PUT can be repeated.
func TestLinkExistingCustomerIsUndoneWhenTheMetadataFails(t *testing.T) {
	t.Parallel()
	v := newEnv(t, false)
	v.stripeCustomer("cus_bare", map[string]any{}, false)
	v.proxy.InjectFault(http.MethodPost, customersPath+"/cus_bare", stripeemu.Fault500, 3)
	expectError(t, v.put("u1", body{"stripe_customer_id": "cus_bare"}), http.StatusServiceUnavailable, "stripe_unavailable")
	if row := v.row("u1"); row.UserID != "" {
		t.Fatalf("link kept: %+v", row)
	}
	expectStatus(t, v.put("u1", body{"stripe_customer_id": "cus_bare"}), http.StatusCreated)
}

func TestLinkExistingCustomerRefusals(t *testing.T) {
	t.Parallel()
	v := newEnv(t, false)
	v.stripeCustomer("cus_foreign", map[string]any{"user_id": "u2"}, false)
	v.stripeCustomer("cus_live", map[string]any{}, true)
	v.proxy.Respond(http.MethodGet, customersPath+"/cus_gone", -1, func(stripeemu.Request) stripeemu.Answer {
		return stripeemu.Answer{Status: http.StatusNotFound, Body: map[string]any{"error": map[string]any{
			"type": "invalid_request_error", "code": "resource_missing", "message": "No such customer: 'cus_gone'"}}}
	})
	v.proxy.Respond(http.MethodGet, customersPath+"/cus_deleted", -1, func(stripeemu.Request) stripeemu.Answer {
		return stripeemu.Answer{Status: http.StatusOK, Body: map[string]any{"id": "cus_deleted", "object": "customer", "deleted": true}}
	})
	v.exec(`INSERT INTO customers (user_id, stripe_customer_id, email) VALUES ('u3', 'cus_taken', 'u3@example.com')`)
	v.exec(`INSERT INTO customers (user_id, stripe_customer_id, email) VALUES ('u4', 'cus_u4', 'u4@example.com')`)
	v.exec(`INSERT INTO customers (user_id, stripe_customer_id, email, livemode) VALUES ('u5', 'cus_u5live', 'u5@example.com', true)`)

	for _, tc := range []struct {
		name, user string
		body       body
		status     int
		code       string
	}{
		{"metadata names another user", "u1", body{"stripe_customer_id": "cus_foreign"}, http.StatusConflict, "customer_belongs_to_other_user"},
		{"linked locally to another user", "u1", body{"stripe_customer_id": "cus_taken"}, http.StatusConflict, "customer_belongs_to_other_user"},
		{"unknown to Stripe", "u1", body{"stripe_customer_id": "cus_gone"}, http.StatusNotFound, "not_found"},
		{"deleted at Stripe", "u1", body{"stripe_customer_id": "cus_deleted"}, http.StatusNotFound, "not_found"},
		{"a customer of the other mode", "u1", body{"stripe_customer_id": "cus_live"}, http.StatusConflict, "livemode_conflict"},
		{"user linked to another customer", "u4", body{"stripe_customer_id": "cus_foreign"}, http.StatusConflict, "conflict"},
		// A link of the other world does not count: the customer's own owner decides.
		{"user linked in the other mode", "u5", body{"stripe_customer_id": "cus_foreign"}, http.StatusConflict, "customer_belongs_to_other_user"},
		{"not a customer id", "u1", body{"stripe_customer_id": "sub_1"}, http.StatusBadRequest, "invalid_customer_id"},
		{"with an email", "u1", body{"stripe_customer_id": "cus_foreign", "email": "a@example.com"}, http.StatusBadRequest, "invalid_request"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			expectError(t, v.put(tc.user, tc.body), tc.status, tc.code)
		})
	}
	if row := v.row("u1"); row.UserID != "" {
		t.Errorf("u1 linked: %+v", row)
	}
	for _, r := range v.proxy.Requests() {
		if r.Method != http.MethodGet {
			t.Errorf("refused links wrote to Stripe: %s %s", r.Method, r.Path)
		}
	}
}

// Two users racing for one customer: one link, and Stripe's metadata names its user.
func TestConcurrentLinksOfOneCustomer(t *testing.T) {
	t.Parallel()
	v := newEnv(t, false)
	v.stripeCustomer("cus_shared", map[string]any{}, false)
	users := []string{"u1", "u2", "u3", "u4"}
	recs := concurrently(len(users), func(i int) *httptest.ResponseRecorder {
		return v.put(users[i], body{"stripe_customer_id": "cus_shared"})
	})
	winner := ""
	for i, r := range recs {
		switch r.Code {
		case http.StatusCreated:
			if winner != "" {
				t.Errorf("%s and %s both linked", winner, users[i])
			}
			winner = users[i]
		case http.StatusConflict:
			apitest.ExpectError(t, r, http.StatusConflict, "customer_belongs_to_other_user")
		default:
			t.Errorf("%s: %d %s", users[i], r.Code, r.Body)
		}
	}
	ups := v.updates("cus_shared")
	if winner == "" || len(ups) != 1 || ups[0].Form.Get("metadata[user_id]") != winner {
		t.Errorf("winner %q, metadata updates %+v", winner, ups)
	}
}
