package customers

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"billing/internal/apitest"
	"billing/internal/stripeemu"
)

const customersPath = "/v1/customers"

type body map[string]any

func TestPutCreatesTheStripeCustomerOnceThenUpdates(t *testing.T) {
	t.Parallel()
	v := newEnv(t, false)

	first := v.put("u1", body{"email": "ada@example.com", "name": "Ada Lovelace"})
	expectStatus(t, first, http.StatusCreated)
	got := decode(t, first)
	stripeID, _ := got["stripe_customer_id"].(string)
	if got["user_id"] != "u1" || !strings.HasPrefix(stripeID, "cus_") || got["livemode"] != false {
		t.Fatalf("answer %s", first.Body)
	}
	creates := v.proxy.Filter(http.MethodPost, customersPath)
	if len(creates) != 1 {
		t.Fatalf("%d customer creates, want 1", len(creates))
	}
	c := creates[0]
	if c.IdempotencyKey != "customer-u1" || c.StripeVersion != "2024-06-20" ||
		c.Form.Get("email") != "ada@example.com" || c.Form.Get("name") != "Ada Lovelace" || c.Form.Get("metadata[user_id]") != "u1" {
		t.Errorf("create request %+v", c)
	}

	// The same PUT again: 200, same answer, no call.
	calls := len(v.proxy.Requests())
	again := v.put("u1", body{"email": "ada@example.com", "name": "Ada Lovelace"})
	expectStatus(t, again, http.StatusOK)
	if again.Body.String() != first.Body.String() {
		t.Errorf("repeat answered %s, first %s", again.Body, first.Body)
	}
	if n := len(v.proxy.Requests()); n != calls {
		t.Errorf("unchanged PUT called Stripe %d times", n-calls)
	}

	// A new email: updated on Stripe and locally, never a second customer.
	changed := v.put("u1", body{"email": "ada@analytical.example", "name": "Ada Lovelace"})
	expectStatus(t, changed, http.StatusOK)
	if decode(t, changed)["stripe_customer_id"] != stripeID {
		t.Errorf("customer changed: %s", changed.Body)
	}
	updates := v.proxy.Filter(http.MethodPost, customersPath+"/"+stripeID)
	if len(updates) != 1 || updates[0].Form.Get("email") != "ada@analytical.example" || updates[0].StripeVersion != "2024-06-20" {
		t.Errorf("update requests %+v", updates)
	}
	if row := v.row("u1"); row.Email != "ada@analytical.example" || row.Name != "Ada Lovelace" {
		t.Errorf("row %+v", row)
	}
	if n := v.proxy.Executed(http.MethodPost, customersPath); n != 1 {
		t.Errorf("%d customers created on Stripe, want 1", n)
	}
	for _, r := range v.proxy.Requests() {
		if r.StripeVersion != "2024-06-20" || r.IdempotencyKey == "" {
			t.Errorf("%s %s: Stripe-Version %q, Idempotency-Key %q", r.Method, r.Path, r.StripeVersion, r.IdempotencyKey)
		}
	}
}

func TestPutReportsLivemode(t *testing.T) {
	t.Parallel()
	v := newEnv(t, true)
	rec := v.put("u1", body{"email": "a@example.com"})
	expectStatus(t, rec, http.StatusCreated)
	if decode(t, rec)["livemode"] != true || !v.row("u1").Livemode {
		t.Errorf("livemode not kept: %s", rec.Body)
	}
}

func TestConcurrentFirstPutsMakeOneCustomer(t *testing.T) {
	t.Parallel()
	v := newEnv(t, false)
	const n = 8
	arrived, release := v.proxy.Gate(http.MethodPost, customersPath)
	go func() {
		<-arrived
		v.waitForLockWaiters(n - 1)
		release()
	}()
	t.Cleanup(release)

	recs := concurrently(n, func(int) *httptest.ResponseRecorder {
		return v.put("u1", body{"email": "a@example.com", "name": "A"})
	})
	created := 0
	for _, rec := range recs {
		if rec.Code == http.StatusCreated {
			created++
		} else {
			expectStatus(t, rec, http.StatusOK)
		}
		if rec.Body.String() != recs[0].Body.String() {
			t.Errorf("answers differ: %s vs %s", rec.Body, recs[0].Body)
		}
	}
	if created != 1 || v.proxy.Executed(http.MethodPost, customersPath) != 1 {
		t.Errorf("%d answers 201 and %d Stripe customers; want 1 and 1", created, v.proxy.Executed(http.MethodPost, customersPath))
	}
}

func TestUnfinishedLinkIsFinished(t *testing.T) {
	t.Parallel()

	t.Run("inside the key window: same key, first request's parameters", func(t *testing.T) {
		t.Parallel()
		v := newEnv(t, false)
		// A crash after the row, before (or during) the Stripe call.
		v.exec(`INSERT INTO customers (user_id, email, name) VALUES ('u1', $1, 'Old')`, "old@example.com")
		if _, err := Get(context.Background(), v.db, "u1", false); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Get of an unfinished link: %v, want ErrNotFound", err)
		}
		rec := v.put("u1", body{"email": "new@example.com", "name": "New"})
		expectStatus(t, rec, http.StatusCreated)
		creates := v.proxy.Filter(http.MethodPost, customersPath)
		// The create repeats the crashed attempt exactly (Stripe would refuse the key with
		// other parameters); the new values follow as an update.
		if len(creates) != 1 || creates[0].IdempotencyKey != "customer-u1" || creates[0].Form.Get("email") != "old@example.com" {
			t.Fatalf("creates %+v", creates)
		}
		id := decode(t, rec)["stripe_customer_id"].(string)
		if ups := v.proxy.Filter(http.MethodPost, customersPath+"/"+id); len(ups) != 1 || ups[0].Form.Get("email") != "new@example.com" {
			t.Errorf("updates %+v", ups)
		}
		cust, err := Get(context.Background(), v.db, "u1", false)
		if err != nil || cust.StripeID() != id || cust.Email != "new@example.com" {
			t.Errorf("Get = %+v, %v", cust, err)
		}
		if byID, err := ByStripeID(context.Background(), v.db, id, false); err != nil || byID.UserID != "u1" {
			t.Errorf("ByStripeID = %+v, %v", byID, err)
		}
	})

	t.Run("beyond the key window: found by search", func(t *testing.T) {
		t.Parallel()
		v := newEnv(t, false)
		for range 3 {
			v.proxy.InjectFault(http.MethodPost, customersPath, stripeemu.FaultDropAfter, 1)
		}
		expectError(t, v.put("u1", body{"email": "a@example.com"}), http.StatusServiceUnavailable, "stripe_unavailable")
		v.exec(`UPDATE customers SET created_at = now() - interval '2 days'`)
		v.proxy.ForgetKeys()

		rec := v.put("u1", body{"email": "a@example.com"})
		expectStatus(t, rec, http.StatusCreated)
		made := v.proxy.Objects(customersPath)
		if v.proxy.Executed(http.MethodPost, customersPath) != 1 || len(made) != 1 || decode(t, rec)["stripe_customer_id"] != made[0]["id"] {
			t.Fatalf("answered %s; Stripe made %v", rec.Body, made)
		}
		search := v.proxy.Filter(http.MethodGet, customersPath+"/search")
		if len(search) != 1 || search[0].Query.Get("query") != "metadata['user_id']:'u1'" {
			t.Errorf("searches %+v", search)
		}
	})

	t.Run("outage: 503, then the next PUT links", func(t *testing.T) {
		t.Parallel()
		v := newEnv(t, false)
		for _, f := range []stripeemu.Fault{stripeemu.Fault500, stripeemu.FaultDrop, stripeemu.Fault500} {
			v.proxy.InjectFault(http.MethodPost, customersPath, f, 1)
		}
		expectError(t, v.put("u1", body{"email": "a@example.com"}), http.StatusServiceUnavailable, "stripe_unavailable")
		if row := v.row("u1"); row.StripeCustomerID != nil {
			t.Fatalf("linked without Stripe: %+v", row)
		}
		expectStatus(t, v.put("u1", body{"email": "a@example.com"}), http.StatusCreated)
		if n := v.proxy.Executed(http.MethodPost, customersPath); n != 1 {
			t.Errorf("%d customers created, want 1", n)
		}
		for _, r := range v.proxy.Filter(http.MethodPost, customersPath) {
			if r.IdempotencyKey != "customer-u1" {
				t.Errorf("key %q", r.IdempotencyKey)
			}
		}
	})
}

func TestPutValidation(t *testing.T) {
	t.Parallel()
	v := newEnv(t, false)
	for _, tc := range []struct {
		name, user, body, code string
	}{
		{"user id with a dot", "u.1", `{"email":"a@example.com"}`, "invalid_user_id"},
		{"user id too long", strings.Repeat("u", 101), `{"email":"a@example.com"}`, "invalid_user_id"},
		{"empty body", "u1", ``, "invalid_json"},
		{"unknown field", "u1", `{"email":"a@example.com","mail":"x"}`, "invalid_json"},
		{"email a number", "u1", `{"email":1}`, "invalid_json"},
		{"missing email", "u1", `{"name":"A"}`, "invalid_email"},
		{"email without @", "u1", `{"email":"example.com"}`, "invalid_email"},
		{"email without domain dot", "u1", `{"email":"a@localhost"}`, "invalid_email"},
		{"email with display name", "u1", `{"email":"Ada <a@example.com>"}`, "invalid_email"},
		{"email with spaces", "u1", `{"email":" a@example.com"}`, "invalid_email"},
		{"email too long", "u1", `{"email":"` + strings.Repeat("a", 510) + `@example.com"}`, "invalid_email"},
		{"name too long", "u1", `{"email":"a@example.com","name":"` + strings.Repeat("n", 257) + `"}`, "invalid_name"},
		{"name with a control character", "u1", `{"email":"a@example.com","name":"A\u0007"}`, "invalid_name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			expectError(t, v.put(tc.user, tc.body), http.StatusBadRequest, tc.code)
		})
	}
	for _, tc := range []struct {
		name, token string
		status      int
		code        string
	}{
		{"no token", "", http.StatusUnauthorized, "unauthorized"},
		{"wrong token", "nope", http.StatusUnauthorized, "unauthorized"},
		{"admin token", adminToken, http.StatusForbidden, "forbidden"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			expectError(t, v.doAs(tc.token, http.MethodPut, "/v1/customers/u1", body{"email": "a@example.com"}), tc.status, tc.code)
		})
	}
	if n := len(v.proxy.Requests()); n != 0 {
		t.Errorf("refused requests called Stripe %d times", n)
	}
	var rows int64
	v.db.Raw(`SELECT count(*) FROM customers`).Scan(&rows)
	if rows != 0 {
		t.Errorf("%d rows written by refused requests", rows)
	}
}

func TestLookupsSeeOnlyLinkedCustomers(t *testing.T) {
	t.Parallel()
	v := newEnv(t, false)
	v.exec(`INSERT INTO customers (user_id, stripe_customer_id, email) VALUES ('linked', 'cus_1', $1)`, "l@example.com")
	v.exec(`INSERT INTO customers (user_id, email) VALUES ('halfway', $1)`, "h@example.com")
	ctx := context.Background()
	for _, tc := range []struct {
		user    string
		wantErr error
	}{
		{"linked", nil},
		{"halfway", ErrNotFound},
		{"nobody", ErrNotFound},
	} {
		c, err := Get(ctx, v.db, tc.user, false)
		if !errors.Is(err, tc.wantErr) {
			t.Errorf("Get(%s) error %v, want %v", tc.user, err, tc.wantErr)
		}
		if err == nil && (c.StripeCustomerID == nil || c.StripeID() != "cus_1") {
			t.Errorf("Get(%s) = %+v", tc.user, c)
		}
	}
	if c, err := ByStripeID(ctx, v.db, "cus_1", false); err != nil || c.UserID != "linked" {
		t.Errorf("ByStripeID = %+v, %v", c, err)
	}
	if _, err := ByStripeID(ctx, v.db, "cus_nope", false); !errors.Is(err, ErrNotFound) {
		t.Errorf("ByStripeID of unknown: %v", err)
	}
}

// Stripe refusing the create outright (an address it does not take) must not pin the link to
// the refused values: nothing exists under the key, so a corrected PUT creates the customer.
func TestRefusedCreateCanBeCorrected(t *testing.T) {
	t.Parallel()
	v := newEnv(t, false)
	v.proxy.Respond(http.MethodPost, customersPath, 1, func(stripeemu.Request) stripeemu.Answer {
		return stripeemu.Answer{Status: http.StatusBadRequest, Body: map[string]any{"error": map[string]any{
			"type": "invalid_request_error", "code": "email_invalid", "param": "email", "message": "Invalid email address: a@bad.example",
		}}}
	})
	expectError(t, v.put("u1", body{"email": "a@bad.example", "name": "A"}), http.StatusBadGateway, "stripe_error")
	var rows int64
	v.db.Raw(`SELECT count(*) FROM customers`).Scan(&rows)
	if rows != 0 {
		t.Fatalf("the refused link was kept (%d rows)", rows)
	}
	v.proxy.ForgetKeys() // Stripe keeps no answer for a request it refused before acting

	rec := v.put("u1", body{"email": "a@good.example", "name": "A"})
	expectStatus(t, rec, http.StatusCreated)
	creates := v.proxy.Filter(http.MethodPost, customersPath)
	if len(creates) != 2 || creates[1].Form.Get("email") != "a@good.example" || creates[1].IdempotencyKey != "customer-u1" {
		t.Fatalf("creates %+v", creates)
	}
	if n := v.proxy.Executed(http.MethodPost, customersPath); n != 2 || len(v.proxy.Objects(customersPath)) != 1 {
		t.Errorf("%d creates executed, %d customers made; want 2 and 1", n, len(v.proxy.Objects(customersPath)))
	}
	if row := v.row("u1"); row.Email != "a@good.example" || row.StripeCustomerID == nil {
		t.Errorf("row %+v", row)
	}
}

func TestPutAnswers503WhenTheDatabaseIsDown(t *testing.T) {
	t.Parallel()
	v := newEnv(t, false)
	v.mount(apitest.UnreachableDB(t))
	expectError(t, v.put("u1", body{"email": "a@example.com"}), http.StatusServiceUnavailable, "database_unavailable")
	if n := len(v.proxy.Requests()); n != 0 {
		t.Errorf("called Stripe %d times without a ledger of it", n)
	}
}

// A refusal of the call rather than of the customer (a bad or restricted API key) says nothing
// about what exists under the key: the link stays pending with its first values, and the next
// PUT, once the key is fixed, finishes it under the same key instead of starting over.
func TestRefusedCallKeepsTheLinkPending(t *testing.T) {
	t.Parallel()
	v := newEnv(t, false)
	v.proxy.Respond(http.MethodPost, customersPath, 1, func(stripeemu.Request) stripeemu.Answer {
		return stripeemu.Answer{Status: http.StatusUnauthorized, Body: map[string]any{"error": map[string]any{
			"type": "invalid_request_error", "message": "Invalid API Key provided",
		}}}
	})
	expectError(t, v.put("u1", body{"email": "first@example.com"}), http.StatusBadGateway, "stripe_error")
	if row := v.row("u1"); row.UserID != "u1" || row.StripeCustomerID != nil || row.Email != "first@example.com" {
		t.Fatalf("after the refused call the row is %+v, want kept pending", row)
	}
	v.proxy.ForgetKeys() // Stripe keeps no answer for a request it refused before acting

	rec := v.put("u1", body{"email": "second@example.com"})
	expectStatus(t, rec, http.StatusCreated)
	creates := v.proxy.Filter(http.MethodPost, customersPath)
	if len(creates) != 2 || creates[1].IdempotencyKey != "customer-u1" || creates[1].Form.Get("email") != "first@example.com" {
		t.Fatalf("creates %+v", creates)
	}
	if n := len(v.proxy.Objects(customersPath)); n != 1 {
		t.Errorf("%d customers made, want 1", n)
	}
	if row := v.row("u1"); row.Email != "second@example.com" || row.StripeCustomerID == nil {
		t.Errorf("row %+v", row)
	}
}
