package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"billing/internal/apitest"
	"billing/internal/runenv"
	"billing/internal/stripetest"
)

// The whole life offline, as `make run` plays it: the dev Stripe keeps what the service creates,
// `billing dev` completes Checkout and moves the clock on, and the events the dev Stripe sends
// are what makes the user entitled, billed again, held when the card declines and released when a
// Smart Retry pays; the portal the service redirects to changes the seats and cancels; the console
// tells that life; in the end the service agrees with the dev Stripe (reconcile finds no drift).
func TestDevLoopPlaysTheWholeLifeOffline(t *testing.T) {
	// Not parallel: reconcile reads its configuration from the environment (t.Setenv).
	d := newDevService(t)
	d.stripe.Webhooks = &stripetest.WebhookSender{URL: d.server.URL + "/webhooks/stripe", Secret: devSecret}
	ctx := context.Background()
	d.start(t)

	// `billing dev` finds the dev Stripe as under make run: the run file of a live serve (this
	// process stands in for it).
	dir := t.TempDir()
	if err := runenv.Write(filepath.Join(dir, runenv.File), runenv.Env{PID: os.Getpid(), ServiceURL: d.server.URL, StripeURL: d.proxy.URL}); err != nil {
		t.Fatal(err)
	}
	dev := func(args ...string) string {
		t.Helper()
		var out, errOut bytes.Buffer
		if code := devCommandIn(dir, args, &out, &errOut); code != 0 {
			t.Fatalf("billing dev %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out.String(), errOut.String())
		}
		return out.String()
	}
	// poll reads until ok or the deadline; the deadline only ends a failing test.
	poll := func(what, path string, ok func(map[string]any) bool) map[string]any {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for {
			_, got := d.do(apitest.AppToken, http.MethodGet, path, nil)
			if ok(got) {
				return got
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 60s; last %s answered %v", what, path, got)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	const user = "u_whole_life"
	status, cust := d.do(apitest.AppToken, http.MethodPut, "/v1/customers/"+user, map[string]any{"email": "life@example.com", "name": "Life"})
	if status != http.StatusCreated {
		t.Fatalf("PUT customer: %d %v", status, cust)
	}
	cus, _ := cust["stripe_customer_id"].(string)
	status, cs := d.do(apitest.AppToken, http.MethodPost, "/v1/customers/"+user+"/checkout-sessions", map[string]any{
		"request_id": "life-1", "price_id": "price_dev_monthly", "quantity": 3,
		"success_url": "http://localhost:8080/welcome", "cancel_url": "http://localhost:8080/pricing"})
	session, _ := cs["id"].(string)
	if status != http.StatusCreated || session == "" {
		t.Fatalf("checkout session: %d %v", status, cs)
	}

	// The customer pays: the events make the user entitled to the seats bought.
	out := dev("checkout", "complete", session)
	for _, want := range []string{"created: active", "customer.subscription.created", "invoice.paid", "checkout.session.completed"} {
		if !strings.Contains(out, want) {
			t.Errorf("dev checkout complete printed no %q:\n%s", want, out)
		}
	}
	e := poll("entitled after Checkout", "/v1/customers/"+user+"/entitlement", func(e map[string]any) bool {
		return e["entitled"] == true && e["status"] == "active" && e["quantity"] == float64(3)
	})
	if e["on_hold"] != false {
		t.Errorf("entitlement after Checkout: %v", e)
	}
	invoices := func(n int) func(map[string]any) bool {
		return func(p map[string]any) bool { l, _ := p["invoices"].([]any); return len(l) == n }
	}
	poll("the first invoice", "/v1/customers/"+user+"/invoices", invoices(1))

	// A month on: the renewal's invoice, paid; still entitled.
	if out := dev("advance", "--days", "31"); !strings.Contains(out, "renewed: active") || !strings.Contains(out, "invoice.payment_succeeded") {
		t.Errorf("dev advance printed:\n%s", out)
	}
	poll("the renewal's invoice", "/v1/customers/"+user+"/invoices", invoices(2))
	poll("entitled after the renewal", "/v1/customers/"+user+"/entitlement", func(e map[string]any) bool {
		return e["entitled"] == true && e["status"] == "active" && e["on_hold"] == false
	})

	// A declining card fails the next renewal: a payment hold.
	d.setCard(cus, "pm_card_chargeDeclined")
	if out := dev("advance", "--days", "31"); !strings.Contains(out, "renewal_failed: past_due") || !strings.Contains(out, "invoice.payment_failed") {
		t.Errorf("dev advance on a declining card printed:\n%s", out)
	}
	poll("held after the failed renewal", "/v1/customers/"+user+"/entitlement", func(e map[string]any) bool {
		return e["on_hold"] == true && e["status"] == "past_due"
	})
	poll("the failed renewal's invoice", "/v1/customers/"+user+"/invoices", invoices(3))

	// A working card again: the Smart Retry three days later pays the invoice and lifts the hold.
	d.setCard(cus, "pm_card_visa")
	if out := dev("advance", "--days", "3"); !strings.Contains(out, "retry_paid: active") {
		t.Errorf("dev advance to the retry printed:\n%s", out)
	}
	poll("released by the paid retry", "/v1/customers/"+user+"/entitlement", func(e map[string]any) bool {
		return e["entitled"] == true && e["status"] == "active" && e["on_hold"] == false
	})
	sub, _ := e["subscription_id"].(string)

	// Five seats, through the portal the service redirects to.
	portal := func(action string, body any) string {
		t.Helper()
		b, _ := json.Marshal(body)
		req, _ := http.NewRequest(http.MethodPost, d.server.URL+"/v1/customers/"+user+"/subscriptions/"+sub+"/"+action, bytes.NewReader(b))
		req.Header.Set("Authorization", "Bearer "+apitest.AppToken)
		req.Header.Set("Content-Type", "application/json")
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") == "" {
			t.Fatalf("POST %s: %d to %q", action, resp.StatusCode, resp.Header.Get("Location"))
		}
		return resp.Header.Get("Location")
	}
	if out := dev("portal", "apply", portal("change", map[string]any{"quantity": 5})); !strings.Contains(out, "changed: active") {
		t.Errorf("dev portal apply (seats) printed:\n%s", out)
	}
	poll("five seats", "/v1/customers/"+user+"/entitlement", func(e map[string]any) bool {
		return e["entitled"] == true && e["quantity"] == float64(5)
	})

	// Canceled in the portal: entitled to the period's end, then not.
	if out := dev("portal", "apply", portal("cancel", nil)); !strings.Contains(out, "cancel_at_period_end: active") {
		t.Errorf("dev portal apply (cancel) printed:\n%s", out)
	}
	poll("canceling at the period's end", "/v1/customers/"+user+"/entitlement", func(e map[string]any) bool {
		return e["entitled"] == true && e["cancel_at_period_end"] == true
	})
	if out := dev("advance", "--days", "31"); !strings.Contains(out, "canceled: canceled") || !strings.Contains(out, "customer.subscription.deleted") {
		t.Errorf("dev advance past the cancellation printed:\n%s", out)
	}
	poll("not entitled once canceled", "/v1/customers/"+user+"/entitlement", func(e map[string]any) bool {
		return e["entitled"] == false && e["status"] == "canceled"
	})

	// The app was told that life: an entitlement.updated per change, in sequence, the last one
	// the cancellation; and billing events tail prints them.
	_, feed := d.do(apitest.AppToken, http.MethodGet, "/v1/app-events?limit=500", nil)
	evs, _ := feed["events"].([]any)
	var told []map[string]any
	for _, e := range evs {
		if ev := e.(map[string]any); ev["user_id"] == user && ev["type"] == "entitlement.updated" {
			told = append(told, ev)
		}
	}
	if len(told) < 4 {
		t.Fatalf("the app was told %d entitlement changes of the whole life: %v", len(told), feed)
	}
	for k, ev := range told {
		if ev["sequence"] != float64(k+1) {
			t.Errorf("entitlement event %d has sequence %v", k, ev["sequence"])
		}
	}
	last := told[len(told)-1]["data"].(map[string]any)
	if last["entitled"] != false || last["status"] != "canceled" || last["previous"].(map[string]any)["entitled"] != true {
		t.Errorf("the last event told %v, want the cancellation (entitled false, previously true)", last)
	}
	first := told[0]["data"].(map[string]any)
	if first["entitled"] != true || first["quantity"] != float64(3) {
		t.Errorf("the first event told %v, want entitled with 3 seats", first)
	}
	var tailed bytes.Buffer
	if err := tailEvents(ctx, d.app.DB, false, tailOptions{}, &tailed); err != nil || !strings.Contains(tailed.String(), "user="+user+" seq=1 entitled=true status=") {
		t.Errorf("events tail: %v\n%s", err, tailed.String())
	}

	// The console's subscription page tells the same life.
	req, _ := http.NewRequest(http.MethodGet, d.server.URL+"/admin/ui/subscriptions/"+sub, nil)
	req.SetBasicAuth("admin", apitest.AdminToken)
	resp, err := noRedirect.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(page), "canceled") || !strings.Contains(string(page), "customer.subscription.deleted") {
		t.Errorf("console subscription page: %d\n%.2000s", resp.StatusCode, page)
	}

	// The service and the dev Stripe agree.
	for k, v := range map[string]string{
		"BILLING_CONFIG": "", "BILLING_DATABASE_URL": d.dbURL, "BILLING_STRIPE_MODE": "test",
		"BILLING_STRIPE_SECRET_KEY": "sk_test_123", "BILLING_STRIPE_API_URL": d.proxy.URL, "BILLING_LOG_LEVEL": "error",
	} {
		t.Setenv(k, v)
	}
	var rout, rerr bytes.Buffer
	code := runReconcileCommand(ctx, []string{"--dry-run"}, &rout, &rerr)
	t.Logf("reconcile --dry-run: exit %d: %s", code, rout.String())
	if code != 0 || !strings.Contains(rout.String(), " drifted=0 ") {
		t.Errorf("reconcile --dry-run: exit %d\nstdout: %s\nstderr: %s", code, rout.String(), rerr.String())
	}
}
