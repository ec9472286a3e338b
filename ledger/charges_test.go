package ledger

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"billing/internal/stripeemu"
)

const piPath = "/v1/payment_intents"

func TestChargeIsMadeOnceAndRepeatsAnswerFromTheLedger(t *testing.T) {
	t.Parallel()
	v := newEnv(t)
	cus := v.addCustomer("u1")

	first := v.do(http.MethodPost, "/v1/charges", chargeJSON{
		"order_id": "o1", "user_id": "u1", "amount": 1250, "currency": "EUR", "description": "Pro plan",
	})
	expectStatus(t, first, http.StatusCreated)
	body := decode(t, first)
	want := map[string]any{
		"order_id": "o1", "status": "succeeded", "amount": float64(1250), "currency": "eur",
		"idempotency_key": "charge-o1",
	}
	for k, w := range want {
		if body[k] != w {
			t.Errorf("%s = %v, want %v", k, body[k], w)
		}
	}
	piID, _ := body["payment_intent_id"].(string)
	if !strings.HasPrefix(piID, "pi_") {
		t.Fatalf("payment_intent_id %q", piID)
	}

	// What Stripe was asked.
	create := v.expectKeys(http.MethodPost, piPath, "charge-o1", 1)[0]
	form := map[string]string{
		"amount": "1250", "currency": "eur", "customer": cus, "confirm": "true", "off_session": "true",
		"description": "Pro plan", "metadata[order_id]": "o1", "metadata[user_id]": "u1",
		"automatic_payment_methods[allow_redirects]": "never",
	}
	for k, w := range form {
		if got := create.Form.Get(k); got != w {
			t.Errorf("form %s = %q, want %q", k, got, w)
		}
	}
	if create.Form.Has("payment_method") {
		t.Errorf("payment_method sent for a customer without a default one: %q", create.Form.Get("payment_method"))
	}

	row := v.chargeRow("o1")
	if row.State != stateCompleted || row.Status == nil || *row.Status != "succeeded" ||
		row.PaymentIntentID == nil || *row.PaymentIntentID != piID || row.IdempotencyKey != "charge-o1" {
		t.Errorf("ledger row %+v", row)
	}

	// A repeat, also after Stripe has forgotten the key, is answered from the ledger.
	v.proxy.ForgetKeys()
	v.exec(`UPDATE charges SET created_at = now() - interval '3 days'`)
	callsBefore := len(v.proxy.Requests())
	for range 2 {
		again := v.do(http.MethodPost, "/v1/charges", chargeJSON{
			"order_id": "o1", "user_id": "u1", "amount": 1250, "currency": "eur", "description": "Pro plan",
		})
		expectStatus(t, again, http.StatusOK)
		if again.Body.String() != first.Body.String() {
			t.Errorf("repeat answered %s, first %s", again.Body, first.Body)
		}
	}
	if n := len(v.proxy.Requests()); n != callsBefore {
		t.Errorf("repeats called Stripe %d times", n-callsBefore)
	}
	v.expectStripeHeaders()
}

func TestChargeConflictIsRefusedBeforeStripe(t *testing.T) {
	t.Parallel()
	v := newEnv(t)
	v.addCustomer("u1")
	v.addCustomer("u2")
	v.mustCharge("o1", "u1", 100)
	// A pending order conflicts the same way.
	v.exec(`INSERT INTO charges (order_id, user_id, stripe_customer_id, amount, currency, request_hash, idempotency_key, livemode, state)
		VALUES ('o2', 'u1', 'cus_u1', 100, 'usd', $1, 'charge-o2', false, 'pending')`,
		requestHash(chargeRequest{OrderID: "o2", UserID: "u1", Amount: 100, Currency: "usd"}))
	calls := len(v.proxy.Requests())

	for _, tc := range []struct {
		name string
		body chargeJSON
	}{
		{"other amount", chargeJSON{"order_id": "o1", "user_id": "u1", "amount": 101, "currency": "usd"}},
		{"other currency", chargeJSON{"order_id": "o1", "user_id": "u1", "amount": 100, "currency": "eur"}},
		{"other user", chargeJSON{"order_id": "o1", "user_id": "u2", "amount": 100, "currency": "usd"}},
		{"unknown user", chargeJSON{"order_id": "o1", "user_id": "nobody", "amount": 100, "currency": "usd"}},
		{"added description", chargeJSON{"order_id": "o1", "user_id": "u1", "amount": 100, "currency": "usd", "description": "x"}},
		{"pending order, other amount", chargeJSON{"order_id": "o2", "user_id": "u1", "amount": 5, "currency": "usd"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := expectError(t, v.do(http.MethodPost, "/v1/charges", tc.body), http.StatusConflict, "idempotency_conflict")
			if e["order_id"] != tc.body["order_id"] {
				t.Errorf("error names order %v", e["order_id"])
			}
		})
	}
	if n := len(v.proxy.Requests()); n != calls {
		t.Errorf("conflicting requests called Stripe %d times", n-calls)
	}
	if row := v.chargeRow("o2"); row.State != statePending {
		t.Errorf("conflict touched the pending row: %+v", row)
	}
}

func TestConcurrentIdenticalChargesMakeOnePaymentIntent(t *testing.T) {
	t.Parallel()
	v := newEnv(t)
	v.addCustomer("u1")
	const n = 10
	// Hold the first create at "Stripe" until the other nine queue on the row lock.
	arrived, release := v.proxy.Gate(http.MethodPost, piPath)
	go func() {
		<-arrived
		v.waitForLockWaiters(n - 1)
		release()
	}()
	t.Cleanup(release)

	recs := concurrently(n, func(int) *httptest.ResponseRecorder { return v.charge("o1", "u1", 500, "usd") })

	created := 0
	for _, rec := range recs {
		switch rec.Code {
		case http.StatusCreated:
			created++
		case http.StatusOK:
		default:
			t.Fatalf("status %d: %s", rec.Code, rec.Body)
		}
		if rec.Body.String() != recs[0].Body.String() {
			t.Errorf("answers differ: %s vs %s", rec.Body, recs[0].Body)
		}
	}
	if created != 1 {
		t.Errorf("%d answers 201, want 1", created)
	}
	if got := v.proxy.Executed(http.MethodPost, piPath); got != 1 {
		t.Errorf("%d PaymentIntents created on Stripe, want 1", got)
	}
	v.expectKeys(http.MethodPost, piPath, "charge-o1", 1)
}

func TestChargeSurvivesStripeFailures(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		faults []stripeemu.Fault
		// wantFirst is the first request's status; 503 leaves the row pending for the second.
		wantFirst      int
		wantRequests   int // PaymentIntent creates received in all
		wantSameAsLost bool
	}{
		{name: "500 then success", faults: []stripeemu.Fault{stripeemu.Fault500}, wantFirst: 201, wantRequests: 2},
		{name: "dropped connection then success", faults: []stripeemu.Fault{stripeemu.FaultDrop}, wantFirst: 201, wantRequests: 2},
		{name: "answer lost after Stripe charged", faults: []stripeemu.Fault{stripeemu.FaultDropAfter}, wantFirst: 201, wantRequests: 2, wantSameAsLost: true},
		{
			name:      "outage outlasting stripe-go's retries",
			faults:    []stripeemu.Fault{stripeemu.Fault500, stripeemu.FaultDrop, stripeemu.Fault500},
			wantFirst: 503, wantRequests: 4,
		},
		{
			name:      "answer lost on every retry",
			faults:    []stripeemu.Fault{stripeemu.FaultDropAfter, stripeemu.FaultDropAfter, stripeemu.FaultDropAfter},
			wantFirst: 503, wantRequests: 4, wantSameAsLost: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			v := newEnv(t)
			v.addCustomer("u1")
			for _, f := range tc.faults {
				v.proxy.InjectFault(http.MethodPost, piPath, f, 1)
			}
			first := v.charge("o1", "u1", 700, "usd")
			final := first
			if tc.wantFirst == http.StatusServiceUnavailable {
				expectError(t, first, http.StatusServiceUnavailable, "stripe_unavailable")
				row := v.chargeRow("o1")
				if row.State != statePending || row.Attempts != 1 {
					t.Fatalf("after the outage the row is %+v, want pending after 1 attempt", row)
				}
				final = v.charge("o1", "u1", 700, "usd")
			}
			expectStatus(t, final, http.StatusCreated)
			if got := v.proxy.Executed(http.MethodPost, piPath); got != 1 {
				t.Errorf("%d PaymentIntents created, want 1", got)
			}
			v.expectKeys(http.MethodPost, piPath, "charge-o1", tc.wantRequests)
			if tc.wantSameAsLost {
				made := v.proxy.Objects(piPath)
				if len(made) != 1 || decode(t, final)["payment_intent_id"] != made[0]["id"] {
					t.Errorf("answered %s, Stripe made %v", final.Body, made)
				}
			}
			if row := v.chargeRow("o1"); row.State != stateCompleted {
				t.Errorf("row %+v not completed", row)
			}
			v.expectStripeHeaders()
		})
	}
}

func TestPendingChargeLeftByCrashIsFinished(t *testing.T) {
	t.Parallel()
	insertPending := func(v *env, age string) {
		v.t.Helper()
		v.exec(`INSERT INTO charges (order_id, user_id, stripe_customer_id, amount, currency, request_hash,
				idempotency_key, livemode, state, created_at)
			VALUES ('o1', 'u1', 'cus_u1', 300, 'usd', $1, 'charge-o1', false, 'pending', now() - CAST($2 AS interval))`,
			requestHash(chargeRequest{OrderID: "o1", UserID: "u1", Amount: 300, Currency: "usd"}), age)
	}

	t.Run("inside the key window: same key again", func(t *testing.T) {
		t.Parallel()
		v := newEnv(t)
		v.addCustomer("u1")
		insertPending(v, "1 minute")
		expectStatus(t, v.charge("o1", "u1", 300, "usd"), http.StatusCreated)
		v.expectKeys(http.MethodPost, piPath, "charge-o1", 1)
		if n := len(v.proxy.Filter(http.MethodGet, piPath+"/search")); n != 0 {
			t.Errorf("searched %d times inside the key window", n)
		}
	})

	t.Run("beyond the key window, charged before the crash: found by search", func(t *testing.T) {
		t.Parallel()
		v := newEnv(t)
		v.addCustomer("u1")
		// The crashed attempt: Stripe charged, we never learnt it.
		for range 3 {
			v.proxy.InjectFault(http.MethodPost, piPath, stripeemu.FaultDropAfter, 1)
		}
		expectError(t, v.charge("o1", "u1", 300, "usd"), http.StatusServiceUnavailable, "stripe_unavailable")
		// A day later Stripe has forgotten the key.
		v.exec(`UPDATE charges SET created_at = now() - interval '25 hours'`)
		v.proxy.ForgetKeys()

		rec := v.charge("o1", "u1", 300, "usd")
		expectStatus(t, rec, http.StatusCreated)
		made := v.proxy.Objects(piPath)
		if v.proxy.Executed(http.MethodPost, piPath) != 1 || len(made) != 1 || decode(t, rec)["payment_intent_id"] != made[0]["id"] {
			t.Fatalf("answered %s; Stripe made %v", rec.Body, made)
		}
		search := v.proxy.Filter(http.MethodGet, piPath+"/search")
		if len(search) != 1 || search[0].Query.Get("query") != "metadata['order_id']:'o1'" {
			t.Errorf("search requests %+v", search)
		}
	})

	t.Run("beyond the key window, never charged: search then create", func(t *testing.T) {
		t.Parallel()
		v := newEnv(t)
		v.addCustomer("u1")
		insertPending(v, "2 days")
		expectStatus(t, v.charge("o1", "u1", 300, "usd"), http.StatusCreated)
		if n := len(v.proxy.Filter(http.MethodGet, piPath+"/search")); n != 1 {
			t.Errorf("%d searches, want 1", n)
		}
		v.expectKeys(http.MethodPost, piPath, "charge-o1", 1)
	})
}

func TestChargeRefusals(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		setup       func(p *stripeemu.Proxy)
		status      int
		code        string
		declineCode string
		rowStatus   string
	}{
		{
			name:   "card declined",
			setup:  func(p *stripeemu.Proxy) { p.CardError(piPath, "card_declined", "insufficient_funds", 1) },
			status: http.StatusPaymentRequired, code: "card_declined", declineCode: "insufficient_funds", rowStatus: "declined",
		},
		{
			name:   "expired card without decline code",
			setup:  func(p *stripeemu.Proxy) { p.CardError(piPath, "expired_card", "", 1) },
			status: http.StatusPaymentRequired, code: "card_declined", declineCode: "expired_card", rowStatus: "declined",
		},
		{
			name: "authentication required (card error)",
			setup: func(p *stripeemu.Proxy) {
				p.CardError(piPath, "authentication_required", "authentication_required", 1)
			},
			status: http.StatusPaymentRequired, code: "authentication_required", rowStatus: "requires_action",
		},
		{
			name: "requires_action",
			setup: func(p *stripeemu.Proxy) {
				p.Mutate(http.MethodPost, piPath, 1, func(_ stripeemu.Request, pi map[string]any) {
					pi["status"] = "requires_action"
					pi["next_action"] = map[string]any{"type": "use_stripe_sdk"}
				})
			},
			status: http.StatusPaymentRequired, code: "authentication_required", rowStatus: "requires_action",
		},
		{
			name: "other refusal",
			setup: func(p *stripeemu.Proxy) {
				p.Respond(http.MethodPost, piPath, 1, func(stripeemu.Request) stripeemu.Answer {
					return stripeemu.Answer{Status: 400, Body: map[string]any{"error": map[string]any{
						"type": "invalid_request_error", "code": "amount_too_small", "message": "Amount must be at least $0.50 usd",
					}}}
				})
			},
			status: http.StatusUnprocessableEntity, code: "charge_failed", rowStatus: "failed",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			v := newEnv(t)
			v.addCustomer("u1")
			tc.setup(v.proxy)
			first := v.charge("o1", "u1", 900, "usd")
			e := expectError(t, first, tc.status, tc.code)
			if tc.declineCode != "" && e["decline_code"] != tc.declineCode {
				t.Errorf("decline_code %v, want %s", e["decline_code"], tc.declineCode)
			}
			if tc.status == http.StatusPaymentRequired {
				if id, _ := e["payment_intent_id"].(string); !strings.HasPrefix(id, "pi_") {
					t.Errorf("payment_intent_id %v", e["payment_intent_id"])
				}
			}
			row := v.chargeRow("o1")
			if row.State != stateCompleted || row.Status == nil || *row.Status != tc.rowStatus {
				t.Errorf("row %+v, want completed %s", row, tc.rowStatus)
			}
			// A refusal is a finished answer: the repeat gets it again without calling Stripe.
			calls := len(v.proxy.Requests())
			again := v.charge("o1", "u1", 900, "usd")
			if again.Code != first.Code || again.Body.String() != first.Body.String() {
				t.Errorf("repeat answered %d %s, first %d %s", again.Code, again.Body, first.Code, first.Body)
			}
			if n := len(v.proxy.Requests()); n != calls {
				t.Errorf("repeat called Stripe")
			}
			// Nothing to refund.
			expectError(t, v.refund("o1", map[string]any{"refund_id": "r1"}), http.StatusConflict, "charge_not_refundable")
		})
	}
}

func TestChargeSendsTheCustomersDefaultPaymentMethod(t *testing.T) {
	t.Parallel()
	v := newEnv(t)
	cus := v.addCustomer("u1")
	v.proxy.Mutate(http.MethodGet, "/v1/customers/"+cus, -1, func(_ stripeemu.Request, c map[string]any) {
		c["invoice_settings"] = map[string]any{"default_payment_method": "pm_card_visa"}
	})
	expectStatus(t, v.charge("o1", "u1", 100, "usd"), http.StatusCreated)
	create := v.expectKeys(http.MethodPost, piPath, "charge-o1", 1)[0]
	if pm := create.Form.Get("payment_method"); pm != "pm_card_visa" {
		t.Errorf("payment_method %q, want pm_card_visa", pm)
	}
	if row := v.chargeRow("o1"); row.PaymentMethodID == nil || *row.PaymentMethodID != "pm_card_visa" {
		t.Errorf("payment method not kept in the ledger: %+v", row.PaymentMethodID)
	}
}

func TestChargeValidation(t *testing.T) {
	t.Parallel()
	v := newEnv(t)
	v.addCustomer("u1")
	long := strings.Repeat("a", 101)
	for _, tc := range []struct {
		name string
		body string
		code string
	}{
		{"empty body", ``, "invalid_json"},
		{"not JSON", `{"order_id":`, "invalid_json"},
		{"unknown field", `{"order_id":"o1","user_id":"u1","amount":100,"currency":"usd","amout":1}`, "invalid_json"},
		{"missing order_id", `{"user_id":"u1","amount":100,"currency":"usd"}`, "invalid_order_id"},
		{"order_id with a slash", `{"order_id":"o/1","user_id":"u1","amount":100,"currency":"usd"}`, "invalid_order_id"},
		{"order_id too long", `{"order_id":"` + long + `","user_id":"u1","amount":100,"currency":"usd"}`, "invalid_order_id"},
		{"order_id a number", `{"order_id":1,"user_id":"u1","amount":100,"currency":"usd"}`, "invalid_order_id"},
		{"missing user_id", `{"order_id":"o1","amount":100,"currency":"usd"}`, "invalid_user_id"},
		{"user_id with space", `{"order_id":"o1","user_id":"u 1","amount":100,"currency":"usd"}`, "invalid_user_id"},
		{"missing amount", `{"order_id":"o1","user_id":"u1","currency":"usd"}`, "invalid_amount"},
		{"null amount", `{"order_id":"o1","user_id":"u1","amount":null,"currency":"usd"}`, "invalid_amount"},
		{"float amount", `{"order_id":"o1","user_id":"u1","amount":10.5,"currency":"usd"}`, "invalid_amount"},
		{"integral float amount", `{"order_id":"o1","user_id":"u1","amount":100.0,"currency":"usd"}`, "invalid_amount"},
		{"exponent amount", `{"order_id":"o1","user_id":"u1","amount":1e2,"currency":"usd"}`, "invalid_amount"},
		{"string amount", `{"order_id":"o1","user_id":"u1","amount":"100","currency":"usd"}`, "invalid_amount"},
		{"boolean amount", `{"order_id":"o1","user_id":"u1","amount":true,"currency":"usd"}`, "invalid_amount"},
		{"zero amount", `{"order_id":"o1","user_id":"u1","amount":0,"currency":"usd"}`, "invalid_amount"},
		{"negative amount", `{"order_id":"o1","user_id":"u1","amount":-5,"currency":"usd"}`, "invalid_amount"},
		{"amount over Stripe's max", `{"order_id":"o1","user_id":"u1","amount":100000000,"currency":"usd"}`, "invalid_amount"},
		{"amount overflowing int64", `{"order_id":"o1","user_id":"u1","amount":99999999999999999999,"currency":"usd"}`, "invalid_amount"},
		{"missing currency", `{"order_id":"o1","user_id":"u1","amount":100}`, "invalid_currency"},
		{"two-letter currency", `{"order_id":"o1","user_id":"u1","amount":100,"currency":"us"}`, "invalid_currency"},
		{"unsupported currency", `{"order_id":"o1","user_id":"u1","amount":100,"currency":"xyz"}`, "invalid_currency"},
		{"numeric currency", `{"order_id":"o1","user_id":"u1","amount":100,"currency":840}`, "invalid_currency"},
		{"description too long", `{"order_id":"o1","user_id":"u1","amount":100,"currency":"usd","description":"` + strings.Repeat("d", 1001) + `"}`, "invalid_description"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			expectError(t, v.do(http.MethodPost, "/v1/charges", tc.body), http.StatusBadRequest, tc.code)
		})
	}
	t.Run("unknown user", func(t *testing.T) {
		expectError(t, v.charge("o1", "nobody", 100, "usd"), http.StatusNotFound, "customer_not_found")
	})
	t.Run("user whose link is still being made", func(t *testing.T) {
		v.exec(`INSERT INTO customers (user_id, email) VALUES ('halfway', $1)`, "h@example.com")
		expectError(t, v.charge("o1", "halfway", 100, "usd"), http.StatusNotFound, "customer_not_found")
	})
	if n := len(v.proxy.Requests()); n != 0 {
		t.Errorf("invalid requests called Stripe %d times", n)
	}
	var rows int64
	v.db.Raw(`SELECT count(*) FROM charges`).Scan(&rows)
	if rows != 0 {
		t.Errorf("%d ledger rows written for invalid requests", rows)
	}
}

func TestLedgerEndpointsNeedTheAppToken(t *testing.T) {
	t.Parallel()
	v := newEnv(t)
	v.addCustomer("u1")
	body := chargeJSON{"order_id": "o1", "user_id": "u1", "amount": 100, "currency": "usd"}
	for _, path := range []string{"/v1/charges", "/v1/charges/o1/refunds"} {
		for _, tc := range []struct {
			name, token string
			status      int
			code        string
		}{
			{"no token", "", http.StatusUnauthorized, "unauthorized"},
			{"wrong token", "nope", http.StatusUnauthorized, "unauthorized"},
			{"admin token", adminToken, http.StatusForbidden, "forbidden"},
		} {
			t.Run(path+" "+tc.name, func(t *testing.T) {
				expectError(t, v.doAs(tc.token, http.MethodPost, path, body), tc.status, tc.code)
			})
		}
	}
	if n := len(v.proxy.Requests()); n != 0 {
		t.Errorf("unauthenticated requests called Stripe %d times", n)
	}
}

// A Stripe error embeds objects (a PaymentIntent and its client_secret, the card's payment
// method); logging the error as it is would write them into the log. Nothing of them may appear.
func TestStripeErrorObjectsStayOutOfLogs(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	var mu sync.Mutex
	v := newEnvLogging(t, slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, &slog.HandlerOptions{Level: slog.LevelDebug})))
	v.addCustomer("u1")
	leaky := func(status int, typ string) func(stripeemu.Request) stripeemu.Answer {
		return func(stripeemu.Request) stripeemu.Answer {
			return stripeemu.Answer{Status: status, Body: map[string]any{"error": map[string]any{
				"type": typ, "code": "some_code", "message": "Something went wrong.",
				"payment_intent": map[string]any{"id": "pi_leak", "object": "payment_intent", "client_secret": "pi_leak_secret_XYZ"},
				"payment_method": map[string]any{"id": "pm_leak", "object": "payment_method",
					"card": map[string]any{"last4": "4242", "fingerprint": "fp_SECRET"}},
			}}}
		}
	}
	// An outage (logged as a 5xx), a refusal that leaves the row pending (502) and a final one.
	v.proxy.Respond(http.MethodPost, piPath, 1, leaky(http.StatusInternalServerError, "api_error")) // stripe-go's retries replay it
	expectError(t, v.charge("o1", "u1", 100, "usd"), http.StatusServiceUnavailable, "stripe_unavailable")
	v.proxy.Respond(http.MethodPost, piPath, 1, leaky(http.StatusUnauthorized, "invalid_request_error"))
	v.proxy.Respond(http.MethodPost, piPath, 1, leaky(http.StatusBadRequest, "invalid_request_error"))
	expectError(t, v.charge("o2", "u1", 100, "usd"), http.StatusBadGateway, "stripe_error")
	expectError(t, v.charge("o3", "u1", 100, "usd"), http.StatusUnprocessableEntity, "charge_failed")

	mu.Lock()
	out := logs.String()
	mu.Unlock()
	if !strings.Contains(out, "request failed") {
		t.Fatalf("the 5xx answers were not logged: %s", out)
	}
	// The card is looked for by its key and the payment method's id, not by "4242": four digits
	// also turn up in port numbers and durations, and made this test fail at random.
	for _, secret := range []string{"pi_leak_secret_XYZ", "fp_SECRET", "pm_leak", "last4"} {
		if strings.Contains(out, secret) {
			t.Errorf("log contains %q:\n%s", secret, out)
		}
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// Identical first requests race to insert the order's row. The row has two unique keys
// (order_id, idempotency_key); an insert that loses the race on the second must be a no-op like
// one that loses it on the first, not a 500.
func TestConcurrentInsertsOfOneOrderAreNoOps(t *testing.T) {
	t.Parallel()
	v := newEnv(t)
	svc := New(Deps{DB: v.db})
	for round := range 30 {
		req := chargeRequest{OrderID: fmt.Sprintf("o%d", round), UserID: "u1", Amount: 100, Currency: "usd"}
		errs := make([]error, 10)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range errs {
			wg.Go(func() {
				<-start
				errs[i] = svc.insertCharge(context.Background(), req, requestHash(req), "cus_u1")
			})
		}
		close(start)
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
	}
}
