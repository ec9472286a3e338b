package checkout

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"billing/internal/apitest"
	"billing/internal/stripeemu"
)

func body(requestID string) map[string]any {
	return map[string]any{"request_id": requestID, "price_id": "price_pro"}
}

// stripe-mock checks the parameters against Stripe's schema: the session the service asks for is
// one Stripe accepts, with everything the contract names.
func TestCheckoutSessionAgainstStripeMock(t *testing.T) {
	t.Parallel()
	v := newEnv(t, envOpts{successURL: successURL, cancelURL: cancelURL, stripeMock: true})
	v.link("u1", "cus_u1", false)
	got := v.open("u1", map[string]any{"request_id": "r1", "price_id": "price_pro", "quantity": 3, "trial_period_days": 14})
	if got["id"] == "" || got["url"] == "" || got["expires_at"] == "" || got["idempotency_key"] != "checkout-u1-r1" {
		t.Fatalf("answer %v", got)
	}
	reqs := v.proxy.Filter(http.MethodPost, sessionsPath)
	if len(reqs) != 1 || !reqs[0].Executed || reqs[0].Status != http.StatusOK {
		t.Fatalf("session requests %+v", reqs)
	}
	r := reqs[0]
	if r.IdempotencyKey != "checkout-u1-r1" || r.StripeVersion != "2024-06-20" {
		t.Errorf("key %q, version %q", r.IdempotencyKey, r.StripeVersion)
	}
	expectForm(t, r, map[string]string{
		"mode": "subscription", "customer": "cus_u1", "client_reference_id": "u1",
		"line_items[0][price]": "price_pro", "line_items[0][quantity]": "3",
		"subscription_data[trial_period_days]": "14", "subscription_data[metadata][user_id]": "u1",
		"success_url": successURL, "cancel_url": cancelURL,
		"metadata[user_id]": "u1", "metadata[request_id]": "r1",
	})
}

// The row with its key is committed before the call; a repeat after a lost answer sends the same
// key and parameters, and Stripe's first session is the answer: one session in all.
func TestCheckoutKeyIsRecordedBeforeTheCallAndReused(t *testing.T) {
	t.Parallel()
	v := defaultEnv(t)
	v.link("u1", "cus_u1", false)

	arrived, release := v.proxy.Gate(http.MethodPost, sessionsPath)
	v.proxy.InjectFault(http.MethodPost, sessionsPath, stripeemu.FaultDropAfter, 3) // stripe-go retries twice
	done := make(chan int)
	go func() { done <- v.post(checkoutPath("u1"), body("r1")).Code }()
	<-arrived
	row := v.row("u1", "r1")
	if row.State != statePending || deref(row.IdempotencyKey) != "checkout-u1-r1" || deref(row.StripeCustomerID) != "cus_u1" {
		t.Errorf("row while Stripe is called: %+v", row)
	}
	release()
	if code := <-done; code != http.StatusServiceUnavailable {
		t.Fatalf("lost answer: status %d, want 503", code)
	}
	if row := v.row("u1", "r1"); row.State != statePending || row.Attempts != 1 {
		t.Fatalf("row after the lost answer: %+v", row)
	}

	got := v.open("u1", body("r1"))
	reqs := v.proxy.Filter(http.MethodPost, sessionsPath)
	for _, r := range reqs {
		if r.IdempotencyKey != "checkout-u1-r1" {
			t.Errorf("request with key %q", r.IdempotencyKey)
		}
	}
	if n := v.proxy.Executed(http.MethodPost, sessionsPath); n != 1 || v.sessions.Len() != 1 {
		t.Fatalf("%d executed creates, %d sessions; want 1", n, v.sessions.Len())
	}
	if last := reqs[len(reqs)-1]; !last.Replayed {
		t.Errorf("retry not answered with the first session: %+v, answer %v", last, got)
	}
	if row := v.row("u1", "r1"); row.State != stateCompleted || deref(row.SessionID) != got["id"] {
		t.Errorf("row after the retry: %+v", row)
	}
}

// A repeat answers 200 with the same body from the row; Stripe is not called again.
func TestCheckoutRepeatAnswersTheSameBody(t *testing.T) {
	t.Parallel()
	v := defaultEnv(t)
	v.link("u1", "cus_u1", false)
	first := v.post(checkoutPath("u1"), body("r1"))
	expectStatus(t, first, http.StatusCreated)
	for range 2 {
		again := v.post(checkoutPath("u1"), body("r1"))
		expectStatus(t, again, http.StatusOK)
		if again.Body.String() != first.Body.String() {
			t.Errorf("repeat %s, first %s", again.Body, first.Body)
		}
	}
	if n := len(v.proxy.Filter(http.MethodPost, sessionsPath)); n != 1 {
		t.Errorf("%d session requests, want 1", n)
	}
	b := decode(t, first)
	exp, err := time.Parse(time.RFC3339, b["expires_at"].(string))
	if err != nil || exp.Before(time.Now()) {
		t.Errorf("expires_at %v (%v)", b["expires_at"], err)
	}
}

// The same request_id with other values is refused without a call; identical concurrent
// requests make one session.
func TestCheckoutConflictsAndConcurrency(t *testing.T) {
	t.Parallel()
	v := defaultEnv(t)
	v.link("u1", "cus_u1", false)
	v.open("u1", map[string]any{"request_id": "r1", "price_id": "price_pro", "quantity": 2})
	for name, b := range map[string]map[string]any{
		"other price":    {"request_id": "r1", "price_id": "price_team", "quantity": 2},
		"other quantity": {"request_id": "r1", "price_id": "price_pro", "quantity": 3},
		"a trial":        {"request_id": "r1", "price_id": "price_pro", "quantity": 2, "trial_period_days": 7},
		"another URL":    {"request_id": "r1", "price_id": "price_pro", "quantity": 2, "cancel_url": "https://app.example.com/x"},
	} {
		t.Run(name, func(t *testing.T) {
			expectError(t, v.post(checkoutPath("u1"), b), http.StatusConflict, "idempotency_conflict")
		})
	}
	if n := len(v.proxy.Filter(http.MethodPost, sessionsPath)); n != 1 {
		t.Errorf("%d session requests, want 1", n)
	}

	recs := apitest.Concurrently(8, func(int) *httptest.ResponseRecorder { return v.post(checkoutPath("u1"), body("r2")) })
	created := 0
	for _, r := range recs {
		switch r.Code {
		case http.StatusCreated:
			created++
		case http.StatusOK:
		default:
			t.Errorf("concurrent request: %d %s", r.Code, r.Body)
		}
		if r.Body.String() != recs[0].Body.String() {
			t.Errorf("answers differ: %s vs %s", r.Body, recs[0].Body)
		}
	}
	if created != 1 || v.proxy.Executed(http.MethodPost, sessionsPath) != 2 {
		t.Errorf("%d created answers, %d executed creates; want 1 and 2 in all", created, v.proxy.Executed(http.MethodPost, sessionsPath))
	}
}

// A user with an entitled subscription gets 409 already_subscribed, before anything is recorded
// or called; once the subscription is over, the same request_id opens a session.
func TestCheckoutRefusedWhileEntitled(t *testing.T) {
	t.Parallel()
	v := defaultEnv(t)
	v.link("u1", "cus_u1", false)
	end := time.Now().AddDate(0, 1, 0)
	v.exec(`INSERT INTO subscriptions (subscription_id, stripe_customer_id, status, current_period_start, current_period_end, sub_event_created)
		VALUES ('sub_1', 'cus_u1', 'active', now(), $1, now())`, end)
	e := expectError(t, v.post(checkoutPath("u1"), body("r1")), http.StatusConflict, "already_subscribed")
	if e["subscription_id"] != "sub_1" {
		t.Errorf("error %v", e)
	}
	if len(v.proxy.Requests()) != 0 {
		t.Errorf("Stripe called: %+v", v.proxy.Requests())
	}
	var rows int
	v.db.Raw(`SELECT count(*) FROM checkout_sessions`).Scan(&rows)
	if rows != 0 {
		t.Errorf("%d rows recorded", rows)
	}
	v.exec(`UPDATE subscriptions SET status = 'canceled'`)
	v.open("u1", body("r1"))
}

// A user without a customer gets one first, through the customer-{user_id} path, and the session
// is for it.
func TestCheckoutCreatesTheCustomerFirst(t *testing.T) {
	t.Parallel()
	v := defaultEnv(t)
	v.open("u9", body("r1"))
	custs := v.proxy.Filter(http.MethodPost, "/v1/customers")
	if len(custs) != 1 || custs[0].IdempotencyKey != "customer-u9" || custs[0].Form.Get("metadata[user_id]") != "u9" {
		t.Fatalf("customer requests %+v", custs)
	}
	var linked string
	v.db.Raw(`SELECT stripe_customer_id FROM customers WHERE user_id = 'u9'`).Scan(&linked)
	s := v.proxy.Filter(http.MethodPost, sessionsPath)
	if linked == "" || len(s) != 1 || s[0].Form.Get("customer") != linked {
		t.Fatalf("customer %q, sessions %+v", linked, s)
	}
	// The second session of the user reuses the link.
	v.open("u9", body("r2"))
	if n := len(v.proxy.Filter(http.MethodPost, "/v1/customers")); n != 1 {
		t.Errorf("%d customer creates, want 1", n)
	}
}

func TestCheckoutURLs(t *testing.T) {
	t.Parallel()
	t.Run("defaults from the configuration", func(t *testing.T) {
		v := defaultEnv(t)
		v.link("u1", "cus_u1", false)
		v.open("u1", body("r1"))
		expectForm(t, v.proxy.Filter(http.MethodPost, sessionsPath)[0], map[string]string{"success_url": successURL, "cancel_url": cancelURL})
	})
	t.Run("the request's win", func(t *testing.T) {
		v := defaultEnv(t)
		v.link("u1", "cus_u1", false)
		v.open("u1", map[string]any{"request_id": "r1", "price_id": "price_pro",
			"success_url": "https://shop.example.com/ok", "cancel_url": "https://shop.example.com/no"})
		expectForm(t, v.proxy.Filter(http.MethodPost, sessionsPath)[0],
			map[string]string{"success_url": "https://shop.example.com/ok", "cancel_url": "https://shop.example.com/no"})
	})
	t.Run("neither", func(t *testing.T) {
		v := newEnv(t, envOpts{successURL: successURL})
		v.link("u1", "cus_u1", false)
		expectError(t, v.post(checkoutPath("u1"), body("r1")), http.StatusBadRequest, "invalid_url")
		v2 := newEnv(t, envOpts{cancelURL: cancelURL})
		v2.link("u1", "cus_u1", false)
		expectError(t, v2.post(checkoutPath("u1"), body("r1")), http.StatusBadRequest, "invalid_url")
		if len(v.proxy.Filter(http.MethodPost, sessionsPath))+len(v2.proxy.Filter(http.MethodPost, sessionsPath)) != 0 {
			t.Error("Stripe called without URLs")
		}
		// With the missing one in the request, it goes through.
		v.open("u1", map[string]any{"request_id": "r1", "price_id": "price_pro", "cancel_url": cancelURL})
	})
}

func TestCheckoutValidation(t *testing.T) {
	t.Parallel()
	v := defaultEnv(t)
	v.link("u1", "cus_u1", false)
	for _, tc := range []struct {
		name string
		user string
		body any
		code string
	}{
		{"no request_id", "u1", map[string]any{"price_id": "p"}, "invalid_request_id"},
		{"bad request_id", "u1", map[string]any{"request_id": "r 1", "price_id": "p"}, "invalid_request_id"},
		{"no price", "u1", map[string]any{"request_id": "r1"}, "invalid_price_id"},
		{"bad price", "u1", map[string]any{"request_id": "r1", "price_id": "price/1"}, "invalid_price_id"},
		{"zero quantity", "u1", map[string]any{"request_id": "r1", "price_id": "p", "quantity": 0}, "invalid_quantity"},
		{"huge quantity", "u1", map[string]any{"request_id": "r1", "price_id": "p", "quantity": 1000000}, "invalid_quantity"},
		{"fractional quantity", "u1", `{"request_id":"r1","price_id":"p","quantity":1.5}`, "invalid_json"},
		{"zero trial", "u1", map[string]any{"request_id": "r1", "price_id": "p", "trial_period_days": 0}, "invalid_trial_period_days"},
		{"long trial", "u1", map[string]any{"request_id": "r1", "price_id": "p", "trial_period_days": 731}, "invalid_trial_period_days"},
		{"relative success url", "u1", map[string]any{"request_id": "r1", "price_id": "p", "success_url": "/ok"}, "invalid_url"},
		{"javascript cancel url", "u1", map[string]any{"request_id": "r1", "price_id": "p", "cancel_url": "javascript:alert(1)"}, "invalid_url"},
		{"unknown field", "u1", map[string]any{"request_id": "r1", "price_id": "p", "coupon": "x"}, "invalid_json"},
		{"bad user", "u%201", body("r1"), "invalid_user_id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			expectError(t, v.post(checkoutPath(tc.user), tc.body), http.StatusBadRequest, tc.code)
		})
	}
	if n := len(v.proxy.Requests()); n != 0 {
		t.Errorf("%d Stripe calls for invalid requests", n)
	}
}

// A user linked in the other mode is a new user to this mode: Checkout links the user in this
// world (a customer of its own) and opens the session, and the other world's link is untouched.
func TestCheckoutOfAUserLinkedInTheOtherMode(t *testing.T) {
	t.Parallel()
	v := defaultEnv(t)
	v.link("u1", "cus_live", true)
	if rec := v.post(checkoutPath("u1"), body("r1")); rec.Code != http.StatusCreated {
		t.Fatalf("checkout: %d %s, want 201", rec.Code, rec.Body)
	}
	var links []struct {
		StripeCustomerID string
		Livemode         bool
	}
	if err := v.db.Raw(`SELECT stripe_customer_id, livemode FROM customers WHERE user_id = 'u1' ORDER BY livemode`).Scan(&links).Error; err != nil {
		t.Fatal(err)
	}
	if len(links) != 2 || links[0].Livemode || links[0].StripeCustomerID == "cus_live" || links[1].StripeCustomerID != "cus_live" {
		t.Errorf("links: %+v, want a test one of its own beside the live one", links)
	}
}

// Past the key window, the customer's sessions are listed and the earlier attempt's session is
// the answer: no second session.
func TestCheckoutPastTheKeyWindowFindsTheEarlierSession(t *testing.T) {
	t.Parallel()
	v := defaultEnv(t)
	v.link("u1", "cus_u1", false)
	v.link("u2", "cus_u2", false)
	v.proxy.InjectFault(http.MethodPost, sessionsPath, stripeemu.FaultDropAfter, 3)
	expectStatus(t, v.post(checkoutPath("u1"), body("r1")), http.StatusServiceUnavailable)
	made := v.sessions.Len()
	// Another user's session with the same request_id must not be taken for it.
	v.open("u2", body("r1"))

	v.clock.Add(24 * time.Hour)
	v.proxy.ForgetKeys()
	got := v.open("u1", body("r1"))
	if made != 1 || v.sessions.Len() != 2 {
		t.Fatalf("%d sessions after the lost answer, %d in all; want 1 and 2", made, v.sessions.Len())
	}
	s := v.sessions.Get(got["id"].(string))
	if s["client_reference_id"] != "u1" {
		t.Errorf("found %v", s)
	}
	lists := v.proxy.Filter(http.MethodGet, sessionsPath)
	if len(lists) != 1 || lists[0].Query.Get("customer") != "cus_u1" || lists[0].Query.Get("created[gte]") == "" {
		t.Errorf("lookups %+v", lists)
	}
	if n := v.proxy.Executed(http.MethodPost, sessionsPath); n != 2 {
		t.Errorf("%d creates, want 2 (u1's first, u2's)", n)
	}

	// Nothing made by the earlier attempt: the lookup finds nothing, and the create follows.
	v.proxy.InjectFault(http.MethodPost, sessionsPath, stripeemu.Fault500, 3)
	expectStatus(t, v.post(checkoutPath("u1"), body("r3")), http.StatusServiceUnavailable)
	v.clock.Add(24 * time.Hour)
	v.open("u1", body("r3"))
	if v.sessions.Len() != 3 {
		t.Errorf("%d sessions, want 3", v.sessions.Len())
	}
}

// Stripe's final refusal is the request's answer: repeated without a call.
func TestCheckoutRefusalIsRecorded(t *testing.T) {
	t.Parallel()
	v := defaultEnv(t)
	v.link("u1", "cus_u1", false)
	v.proxy.Respond(http.MethodPost, sessionsPath, 1, func(stripeemu.Request) stripeemu.Answer {
		return stripeemu.Answer{Status: http.StatusBadRequest, Body: map[string]any{"error": map[string]any{
			"type": "invalid_request_error", "code": "resource_missing", "param": "line_items[0][price]",
			"message": "No such price: 'price_pro'"}}}
	})
	first := expectError(t, v.post(checkoutPath("u1"), body("r1")), http.StatusUnprocessableEntity, "checkout_failed")
	again := expectError(t, v.post(checkoutPath("u1"), body("r1")), http.StatusUnprocessableEntity, "checkout_failed")
	if first["message"] != again["message"] {
		t.Errorf("answers differ: %v vs %v", first, again)
	}
	if n := len(v.proxy.Filter(http.MethodPost, sessionsPath)); n != 1 {
		t.Errorf("%d creates, want 1", n)
	}
	v.open("u1", body("r2"))
}
