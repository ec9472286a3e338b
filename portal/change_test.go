package portal

import (
	"net/http"
	"strings"
	"sync"
	"testing"

	"billing/internal/stripeemu"
)

func changePath(user, sub string) string {
	return "/v1/customers/" + user + "/subscriptions/" + sub + "/change"
}

// subscriptionsAt makes Stripe hold subscriptions with the given items (price ids) for
// cus_u1 and cus_u2, and counts the reads.
type stripeSubs struct {
	mu    sync.Mutex
	items map[string][]string
	owner map[string]string
	// seats are the items' quantity (1 when not set).
	seats map[string]int64
}

func (v *env) stripeSubscriptions() *stripeSubs {
	ss := &stripeSubs{items: map[string][]string{}, owner: map[string]string{}, seats: map[string]int64{}}
	v.proxy.Handle("/v1/subscriptions", func(r stripeemu.Request) stripeemu.Answer {
		id := strings.TrimPrefix(r.Path, "/v1/subscriptions/")
		ss.mu.Lock()
		defer ss.mu.Unlock()
		prices, ok := ss.items[id]
		if !ok || r.Method != http.MethodGet {
			return stripeemu.Answer{Status: http.StatusNotFound, Body: map[string]any{"error": map[string]any{
				"type": "invalid_request_error", "code": "resource_missing", "message": "No such subscription: '" + id + "'"}}}
		}
		data := []any{}
		seats := max(ss.seats[id], 1)
		for i, p := range prices {
			data = append(data, map[string]any{"id": "si_" + id + "_" + string(rune('a'+i)), "object": "subscription_item",
				"price": map[string]any{"id": p, "object": "price"}, "quantity": seats})
		}
		return stripeemu.Answer{Status: http.StatusOK, Body: map[string]any{"id": id, "object": "subscription",
			"customer": ss.owner[id], "status": "active", "items": map[string]any{"object": "list", "data": data}}}
	})
	return ss
}

func (ss *stripeSubs) put(id, customer string, prices ...string) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.items[id], ss.owner[id] = prices, customer
}

func TestChangeWithAPriceOpensTheConfirmationFlow(t *testing.T) {
	t.Parallel()
	v := newEnv(t, defaultURL, nil)
	ss := v.stripeSubscriptions()
	ss.put("sub_active", "cus_u1", "price_basic")
	ss.put("sub_trialing", "cus_u1", "price_basic")
	ss.put("sub_past_due", "cus_u1", "price_basic")
	ss.seats["sub_past_due"] = 4

	for _, tc := range []struct {
		name, sub string
		body      string
		price     string
		quantity  string
	}{
		{"price and quantity", "sub_active", `{"price_id":"price_pro","quantity":3}`, "price_pro", "3"},
		{"price, one seat stays one", "sub_trialing", `{"price_id":"price_pro"}`, "price_pro", "1"},
		{"quantity of the current price", "sub_active", `{"quantity":5}`, "price_basic", "5"},
		{"price keeps the seats bought", "sub_past_due", `{"price_id":"price_pro"}`, "price_pro", "4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := v.post(appToken, changePath("u1", tc.sub), tc.body)
			expectStatus(t, rec, http.StatusSeeOther)
			reqs := v.proxy.Filter(http.MethodPost, sessionsPath)
			r := reqs[len(reqs)-1]
			expectForm(t, r, map[string]string{
				"customer":        "cus_u1",
				"return_url":      defaultURL,
				"flow_data[type]": "subscription_update_confirm",
				"flow_data[subscription_update_confirm][subscription]":       tc.sub,
				"flow_data[subscription_update_confirm][items][0][id]":       "si_" + tc.sub + "_a",
				"flow_data[subscription_update_confirm][items][0][price]":    tc.price,
				"flow_data[subscription_update_confirm][items][0][quantity]": tc.quantity,
				"flow_data[after_completion][type]":                          "redirect",
				"flow_data[after_completion][redirect][return_url]":          defaultURL,
			})
			if r.Status != http.StatusOK {
				t.Errorf("stripe-mock refused the session: %d", r.Status)
			}
			made := v.proxy.Objects(sessionsPath)
			if url, _ := made[len(made)-1]["url"].(string); rec.Header().Get("Location") != url || url == "" {
				t.Errorf("Location %q, want %q", rec.Header().Get("Location"), url)
			}
		})
	}
	// Only reads and portal sessions: the subscription is never changed by the service.
	for _, r := range v.proxy.Requests() {
		if !(r.Method == http.MethodGet && strings.HasPrefix(r.Path, "/v1/subscriptions/")) && r.Path != sessionsPath {
			t.Errorf("unexpected Stripe call %s %s", r.Method, r.Path)
		}
	}
}

func TestChangeWithoutAPriceOpensThePlanChoice(t *testing.T) {
	t.Parallel()
	v := newEnv(t, "", nil)
	v.stripeSubscriptions()
	for _, body := range []string{"", "{}"} {
		expectStatus(t, v.post(appToken, changePath("u1", "sub_past_due"), body), http.StatusSeeOther)
	}
	reqs := v.proxy.Filter(http.MethodPost, sessionsPath)
	if len(reqs) != 2 {
		t.Fatalf("%d session requests", len(reqs))
	}
	for _, r := range reqs {
		expectForm(t, r, map[string]string{"flow_data[type]": "subscription_update", "flow_data[subscription_update][subscription]": "sub_past_due"})
		for _, k := range []string{"return_url", "flow_data[after_completion][type]"} {
			if r.Form.Has(k) {
				t.Errorf("%s sent without a configured return URL", k)
			}
		}
	}
	if n := len(v.proxy.Filter(http.MethodGet, "/v1/subscriptions/sub_past_due")); n != 0 {
		t.Errorf("%d subscription reads for the plan choice", n)
	}
}

func TestChangeRefusals(t *testing.T) {
	t.Parallel()
	v := newEnv(t, defaultURL, nil)
	ss := v.stripeSubscriptions()
	ss.put("sub_active", "cus_u1", "price_a", "price_b")
	ss.put("sub_trialing", "cus_u2", "price_a") // Stripe says another customer's
	for _, tc := range []struct {
		name, user, sub, body string
		status                int
		code                  string
	}{
		{"another user's subscription", "u1", "sub_of_u2", `{"price_id":"p"}`, http.StatusNotFound, "not_found"},
		{"unknown subscription", "u1", "sub_nope", "", http.StatusNotFound, "not_found"},
		{"canceled", "u1", "sub_canceled", `{"price_id":"p"}`, http.StatusConflict, "subscription_already_canceled"},
		{"incomplete_expired", "u1", "sub_expired", "", http.StatusConflict, "subscription_already_canceled"},
		{"several items", "u1", "sub_active", `{"price_id":"p"}`, http.StatusConflict, "conflict"},
		{"Stripe names another customer", "u1", "sub_trialing", `{"price_id":"p"}`, http.StatusNotFound, "not_found"},
		{"Stripe does not know it", "u1", "sub_paused", `{"price_id":"p"}`, http.StatusNotFound, "not_found"},
		{"bad price", "u1", "sub_paused", `{"price_id":"price/1"}`, http.StatusBadRequest, "invalid_price_id"},
		{"zero quantity", "u1", "sub_paused", `{"quantity":0}`, http.StatusBadRequest, "invalid_quantity"},
		{"unknown field", "u1", "sub_paused", `{"plan":"x"}`, http.StatusBadRequest, "invalid_json"},
		{"unknown user", "nobody", "sub_active", "", http.StatusNotFound, "customer_not_found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			expectError(t, v.post(appToken, changePath(tc.user, tc.sub), tc.body), tc.status, tc.code)
		})
	}
	if n := len(v.proxy.Filter(http.MethodPost, sessionsPath)); n != 0 {
		t.Errorf("%d portal sessions opened by refused changes", n)
	}
}
