package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"billing/internal/apitest"
	"billing/internal/devstripe"
	"billing/internal/runenv"
)

// The whole life offline, as `make run` plays it: the dev Stripe keeps what the service creates,
// `billing dev` completes Checkout and moves the clock on, and the events the dev Stripe sends
// are what makes the user entitled, billed again, held when the card declines and released when a
// Smart Retry pays; the portal the service redirects to changes the seats and cancels; the console
// tells that life; in the end the service agrees with the dev Stripe (reconcile finds no drift).
func TestDevLoopPlaysTheWholeLifeOffline(t *testing.T) {
	// Not parallel: reconcile reads its configuration from the environment (t.Setenv).
	d := newDevService(t)
	d.stripe.Webhooks = &devstripe.WebhookSender{URL: d.server.URL + "/webhooks/stripe", Secret: devSecret}
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

	// The pricing page: the dev Stripe's plans, told by its product and price events, with the
	// features each product grants (read from Stripe after the product's event).
	if _, err := d.stripe.SendCatalog(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	catalog := poll("the dev catalog", "/v1/prices?active=true", func(p map[string]any) bool {
		l, _ := p["prices"].([]any)
		if len(l) != 4 {
			return false
		}
		for _, x := range l {
			if f, _ := x.(map[string]any)["features"].([]any); len(f) == 0 {
				return false
			}
		}
		return true
	})
	byKey := map[string]map[string]any{}
	for _, x := range catalog["prices"].([]any) {
		p := x.(map[string]any)
		byKey[p["lookup_key"].(string)] = p
	}
	if p := byKey["pro_monthly"]; p == nil || p["unit_amount"] != float64(2000) || p["product_name"] != "Pro" || fmt.Sprint(p["features"]) != "[api]" {
		t.Fatalf("pro_monthly on the pricing page: %v", p)
	}
	if p := byKey["team_monthly"]; p == nil || fmt.Sprint(p["features"]) != "[api sso]" {
		t.Fatalf("team_monthly on the pricing page: %v", p)
	}

	const user = "u_whole_life"
	status, cust := d.do(apitest.AppToken, http.MethodPut, "/v1/customers/"+user, map[string]any{"email": "life@example.com", "name": "Life"})
	if status != http.StatusCreated {
		t.Fatalf("PUT customer: %d %v", status, cust)
	}
	cus, _ := cust["stripe_customer_id"].(string)
	status, cs := d.do(apitest.AppToken, http.MethodPost, "/v1/customers/"+user+"/checkout-sessions", map[string]any{
		"request_id": "life-1", "price_lookup_key": "pro_monthly", "quantity": 3, "promotion_code": "welcome20",
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
	firstInvoice := poll("the first invoice", "/v1/customers/"+user+"/invoices", invoices(1))
	// Three seats of pro_monthly, 20 % off with WELCOME20.
	if inv := firstInvoice["invoices"].([]any)[0].(map[string]any); inv["amount_due"] != float64(3*2000*80/100) {
		t.Errorf("the first invoice: %v, want 3 × 2000 less 20 %%", inv)
	}

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
	// Five seats of Team: first what it would cost, prorated; then the change, in the portal.
	change := map[string]any{"price_lookup_key": "team_monthly", "quantity": 5}
	status, preview := d.do(apitest.AppToken, http.MethodPost, "/v1/customers/"+user+"/subscriptions/"+sub+"/change/preview", change)
	lines, _ := preview["lines"].([]any)
	prorations := 0
	for _, l := range lines {
		if l.(map[string]any)["proration"] == true {
			prorations++
		}
	}
	if status != http.StatusOK || prorations < 2 || preview["tax"] != float64(0) {
		t.Fatalf("preview: %d %v, want a credit and a charge prorated, tax 0", status, preview)
	}
	if out := dev("portal", "apply", portal("change", change)); !strings.Contains(out, "changed: active") {
		t.Errorf("dev portal apply (plan and seats) printed:\n%s", out)
	}
	poll("five seats of Team, with its features", "/v1/customers/"+user+"/entitlement", func(e map[string]any) bool {
		return e["entitled"] == true && e["quantity"] == float64(5) && e["price_id"] == "price_team" && fmt.Sprint(e["features"]) == "[api sso]"
	})
	// The renewal bills what the preview said: the prorations and Team's next month, 20 % off.
	if out := dev("advance", "--days", "31"); !strings.Contains(out, "renewed: active") {
		t.Errorf("dev advance to the renewal after the change printed:\n%s", out)
	}
	renewed := poll("the renewal with the prorations", "/v1/customers/"+user+"/invoices", invoices(4))
	if inv := renewed["invoices"].([]any)[0].(map[string]any); inv["amount_due"] != preview["amount_due"] {
		t.Errorf("the renewal after the change: %v, want the preview's amount_due %v", inv, preview["amount_due"])
	}

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
