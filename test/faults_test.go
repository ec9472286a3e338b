package test

// Stripe's own failures on every outbound path, at a small scale that make test keeps: each
// path takes a few dozen operations, and each operation meets one class of fault — 429 with
// Retry-After, 500, the answer lost after Stripe applied the request (what a timeout is to the
// caller), a connection reset before it — once (absorbed inside the call where stripe-go
// retries) or three times in a row (the app, or the job, tries again). The outcomes must be
// exactly once: one Stripe customer per user, one PaymentIntent per order, one refund per refund
// id, one Checkout session per request, every subscription read applied, every reconcile repair
// made. The soak (soak_test.go) runs the same faults at random, at scale.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"billing/internal/stripeemu"
	"billing/internal/stripeevents"
	"billing/internal/testenv"
)

var faultClasses = []stripeemu.Fault{stripeemu.Fault429, stripeemu.Fault500, stripeemu.FaultDropAfter, stripeemu.FaultDrop}

// faultOps is the number of operations per path: each class of fault on a quarter of them.
const faultOps = 24

// faultOf is the fault of operation i of a path, and how many requests in a row meet it: each
// class on every fourth operation, half of them once, half three times in a row.
func faultOf(i int) (stripeemu.Fault, int) {
	times := 1
	if (i/len(faultClasses))%2 == 1 {
		times = 3
	}
	return faultClasses[i%len(faultClasses)], times
}

// faultPlan injects, before operation i of a path, its fault on the next requests to method and
// path.
func faultPlan(p *stripeemu.Proxy, method, path string, i int) {
	f, times := faultOf(i)
	p.InjectFault(method, path, f, times)
}

type faultApp struct {
	t      *testing.T
	svc    *service
	client *http.Client
}

// final calls the API as an app backend does: again, with the same body, after a 5xx or a lost
// connection, until the answer is final.
func (a *faultApp) final(method, path string, body any) (int, []byte) {
	a.t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		a.t.Fatal(err)
	}
	var last string
	for range 10 {
		req, err := http.NewRequest(method, a.svc.url(path), bytes.NewReader(b))
		if err != nil {
			a.t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+relAPIToken)
		req.Header.Set("Content-Type", "application/json")
		resp, err := a.client.Do(req)
		if err != nil {
			last = err.Error()
			continue
		}
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode < 500 {
			return resp.StatusCode, out
		}
		last = fmt.Sprintf("%d %s", resp.StatusCode, out)
	}
	a.t.Fatalf("%s %s: no final answer after 10 tries (last: %s)", method, path, last)
	return 0, nil
}

// executedPerKey counts, per idempotency key, the requests to method and path that Stripe
// executed (not replays, not faulted before it).
func executedPerKey(p *stripeemu.Proxy, method, path string) map[string]int {
	n := map[string]int{}
	for _, r := range p.Filter(method, path) {
		if r.Executed {
			n[r.IdempotencyKey]++
		}
	}
	return n
}

func TestStripeFaultsOnEveryOutboundPath(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	db := openDB(t, url)
	proxy := stripeemu.New(t, testenv.StripeMockURL(t))
	acct := stripeemu.NewAccount(proxy, false)
	sessions := stripeemu.NewCheckoutSessions(proxy, false)
	env := relEnv(t, url)
	env["BILLING_STRIPE_API_URL"] = proxy.URL
	app := &faultApp{t: t, svc: newService(t, "faults", env), client: &http.Client{Timeout: 2 * time.Minute}}
	faulted := func(step string, before map[stripeemu.Fault]int) {
		t.Helper()
		after := proxy.Faulted()
		for _, f := range faultClasses {
			if after[f] == before[f] {
				t.Errorf("%s: no %s fault was injected", step, f)
			}
		}
		t.Logf("%s: faults injected %v", step, map[string]int{"429": after[stripeemu.Fault429] - before[stripeemu.Fault429],
			"500": after[stripeemu.Fault500] - before[stripeemu.Fault500], "lost_after_applied": after[stripeemu.FaultDropAfter] - before[stripeemu.FaultDropAfter],
			"reset": after[stripeemu.FaultDrop] - before[stripeemu.FaultDrop]})
	}

	// Customers: PUT /v1/customers/{user_id} → POST /v1/customers.
	users := make([]string, faultOps)
	customers := map[string]string{}
	before := proxy.Faulted()
	for i := range users {
		users[i] = fmt.Sprintf("fault_user_%02d", i)
		faultPlan(proxy, http.MethodPost, "/v1/customers", i)
		code, body := app.final(http.MethodPut, "/v1/customers/"+users[i], map[string]any{"email": users[i] + "@example.com"})
		var link struct {
			StripeCustomerID string `json:"stripe_customer_id"`
		}
		if err := json.Unmarshal(body, &link); err != nil || (code != 200 && code != 201) || link.StripeCustomerID == "" {
			t.Fatalf("PUT customer %s: %d %s", users[i], code, body)
		}
		customers[users[i]] = link.StripeCustomerID
	}
	faulted("customers", before)
	for _, u := range users {
		if n := executedPerKey(proxy, http.MethodPost, "/v1/customers")["customer-"+u]; n != 1 {
			t.Errorf("user %s: %d customers created at Stripe, want 1", u, n)
		}
	}

	// Charges: POST /v1/charges → POST /v1/payment_intents.
	before = proxy.Faulted()
	for i, u := range users {
		faultPlan(proxy, http.MethodPost, "/v1/payment_intents", i)
		order := "fault_order_" + u
		code, body := app.final(http.MethodPost, "/v1/charges", map[string]any{"order_id": order, "user_id": u, "amount": 1500, "currency": "usd"})
		if (code != 200 && code != 201) || !strings.Contains(string(body), `"status":"succeeded"`) {
			t.Fatalf("charge %s: %d %s", order, code, body)
		}
	}
	faulted("charges", before)
	pis := map[string]int{}
	for _, pi := range proxy.Objects("/v1/payment_intents") {
		md, _ := pi["metadata"].(map[string]any)
		if o, _ := md["order_id"].(string); o != "" {
			pis[o]++
		}
	}
	for _, u := range users {
		order := "fault_order_" + u
		if n := executedPerKey(proxy, http.MethodPost, "/v1/payment_intents")["charge-"+order]; n != 1 || pis[order] != 1 {
			t.Errorf("order %s: %d PaymentIntent creates executed, %d PaymentIntents at Stripe; want 1 and 1", order, n, pis[order])
		}
	}

	// Refunds: POST /v1/charges/{order_id}/refunds → POST /v1/refunds.
	before = proxy.Faulted()
	for i, u := range users {
		faultPlan(proxy, http.MethodPost, "/v1/refunds", i)
		order := "fault_order_" + u
		code, body := app.final(http.MethodPost, "/v1/charges/"+order+"/refunds", map[string]any{"refund_id": "r1", "amount": 500})
		if code != 200 && code != 201 {
			t.Fatalf("refund of %s: %d %s", order, code, body)
		}
	}
	faulted("refunds", before)
	for _, u := range users {
		key := "refund-fault_order_" + u + "-r1"
		if n := executedPerKey(proxy, http.MethodPost, "/v1/refunds")[key]; n != 1 {
			t.Errorf("%s: %d refunds created at Stripe, want 1", key, n)
		}
	}

	// Checkout: POST /v1/customers/{user_id}/checkout-sessions → POST /v1/checkout/sessions.
	before = proxy.Faulted()
	sessionOf := map[string]string{}
	for i, u := range users {
		faultPlan(proxy, http.MethodPost, "/v1/checkout/sessions", i)
		code, body := app.final(http.MethodPost, "/v1/customers/"+u+"/checkout-sessions", map[string]any{
			"request_id": "rq1", "price_id": "price_basic",
			"success_url": "https://app.example.com/ok", "cancel_url": "https://app.example.com/no"})
		var cs struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(body, &cs); err != nil || (code != 200 && code != 201) || cs.ID == "" {
			t.Fatalf("checkout session of %s: %d %s", u, code, body)
		}
		sessionOf[u] = cs.ID
	}
	faulted("checkout", before)
	for _, u := range users {
		if n := executedPerKey(proxy, http.MethodPost, "/v1/checkout/sessions")["checkout-"+u+"-rq1"]; n != 1 {
			t.Errorf("user %s: %d Checkout sessions created, want 1", u, n)
		}
	}
	if sessions.Len() != len(users) {
		t.Errorf("%d Checkout sessions at Stripe, want %d", sessions.Len(), len(users))
	}

	// Subscription reads: each session completes; checkout.session.completed makes the service
	// read the subscription from Stripe (GET /v1/subscriptions/{id}), which meets the fault.
	before = proxy.Faulted()
	now := time.Now().UTC().Truncate(time.Second)
	subOf := map[string]string{}
	for i, u := range users {
		sub := "sub_fault_" + u
		subOf[u] = acct.PutSubscription(stripeemu.SubscriptionSpec{ID: sub, Customer: customers[u], Status: "active", PriceID: "price_basic",
			CurrentPeriodStart: now.Add(-time.Hour), CurrentPeriodEnd: now.AddDate(0, 1, 0)})
		f, times := faultOf(i)
		if f == stripeemu.Fault429 {
			// stripe-go leaves a rate limit to the caller: the read's job tries again on River's
			// backoff (1 s, then 16 s), so one 429 per read keeps the test short.
			times = 1
		}
		proxy.InjectFault(http.MethodGet, "/v1/subscriptions/"+sub, f, times)
		obj := sessions.Complete(sessionOf[u], sub)
		ev := stripeevents.Event(fmt.Sprintf("evt_fault_cs_%02d", i), "checkout.session.completed", now, false, obj, nil)
		if code, _, err := postEvent(context.Background(), app.client, app.svc.url(""), ev); err != nil || code != 200 {
			t.Fatalf("deliver checkout.session.completed of %s: %d %v", u, code, err)
		}
	}
	readAll := waitUntil(2*time.Minute, func() bool {
		var n int
		err := db.QueryRow(`SELECT count(*) FROM subscriptions WHERE subscription_id LIKE 'sub_fault_%' AND status = 'active' AND livemode = false`).Scan(&n)
		return err == nil && n == len(users)
	})
	if !readAll {
		t.Fatalf("not every subscription read from Stripe was applied within 2 minutes")
	}
	faulted("subscription reads", before)

	// Reconcile pages: a third of the subscriptions changed at Stripe without an event; the run
	// lists them page by page (GET /v1/subscriptions), each page meeting a fault.
	for i, u := range users {
		if i%3 == 0 {
			acct.PutSubscription(stripeemu.SubscriptionSpec{ID: subOf[u], Customer: customers[u], Status: "past_due", PriceID: "price_basic",
				CurrentPeriodStart: now.Add(-time.Hour), CurrentPeriodEnd: now.AddDate(0, 1, 0)})
		}
	}
	before = proxy.Faulted()
	for _, f := range faultClasses {
		proxy.InjectFault(http.MethodGet, "/v1/subscriptions", f, 1)
	}
	cmd := exec.Command(binary(t), "reconcile")
	cmd.Env = baseEnv(map[string]string{"BILLING_DATABASE_URL": url, "BILLING_STRIPE_API_URL": proxy.URL,
		"BILLING_STRIPE_SECRET_KEY": "sk_test_reliability", "BILLING_LOG_LEVEL": "warn"})
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	// The catalog is stripe-mock's: one product and one price, backfilled (two more drifted).
	if want := fmt.Sprintf("reconcile: objects=%d drifted=%d repaired=%d missing_at_stripe=0 errors=0 catalog_objects=2 catalog_drifted=2 catalog_repaired=2\n",
		len(users), len(users)/3+2, len(users)/3+2); err != nil || out.String() != want {
		t.Errorf("billing reconcile through faults: %v, stdout %q, want %q\nstderr: %s", err, out.String(), want, tail(errOut.String(), 3000))
	}
	faulted("reconcile pages", before)
	var pastDue int
	if err := db.QueryRow(`SELECT count(*) FROM subscriptions WHERE subscription_id LIKE 'sub_fault_%' AND status = 'past_due' AND livemode = false`).Scan(&pastDue); err != nil || pastDue != len(users)/3 {
		t.Errorf("%d subscriptions past_due after the repair, want %d (%v)", pastDue, len(users)/3, err)
	}

	// And what was applied is what the log (with the kept reads) says.
	t.Logf("faults: %s", runVerifyCommand(t, env))
}
