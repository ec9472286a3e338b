package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"billing/config"
	"billing/internal/apitest"
	"billing/internal/devstripe"
	"billing/internal/stripeemu"
	"billing/internal/testenv"
	"billing/openapi"
	"billing/webhooks"
)

const devSecret = "whsec_devloop_test_secret_0123456789abcdef0123456789"

// devService is the service as `make run` assembles it: newApp on a test database, calling the
// dev Stripe (the proxy with devstripe's hooks in front of stripe-mock), served over HTTP.
type devService struct {
	t      *testing.T
	dbURL  string
	app    *App
	proxy  *stripeemu.Proxy
	stripe *devstripe.DevStripe
	server *httptest.Server
}

func newDevService(t *testing.T) *devService {
	t.Helper()
	proxy := stripeemu.New(t, testenv.StripeMockURL(t))
	dev := devstripe.NewDevStripe(proxy)
	cfg, err := config.Load("")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Stripe.Mode = "test"
	cfg.Stripe.SecretKey = "sk_test_123"
	cfg.Stripe.APIURL = proxy.URL
	cfg.Stripe.WebhookSecrets.Test = []string{devSecret}
	cfg.Auth.APITokens = []string{apitest.AppToken}
	cfg.Auth.AdminTokens = []string{apitest.AdminToken}
	cfg.Portal.ReturnURL = "http://localhost:8080/"
	dbURL := testenv.DatabaseURL(t)
	db, err := gorm.Open(postgres.Open(dbURL), &gorm.Config{Logger: logger.Default.LogMode(logger.Silent)})
	if err != nil {
		t.Fatal(err)
	}
	if sqlDB, err := db.DB(); err == nil {
		// Registered after DatabaseURL's cleanup, so it runs before the DROP.
		t.Cleanup(func() { sqlDB.Close() })
	}
	a, err := newApp(appOptions{Config: cfg, DB: db, Logger: apitest.Logger(t, slog.LevelWarn)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a.Echo)
	t.Cleanup(srv.Close)
	return &devService{t: t, dbURL: dbURL, app: a, proxy: proxy, stripe: dev, server: srv}
}

// start starts the app's workers (River, the periodic jobs) and stops them when the test ends.
func (d *devService) start(t *testing.T) {
	t.Helper()
	if err := d.app.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, c := context.WithTimeout(context.Background(), 30*time.Second)
		defer c()
		_ = d.app.Stop(ctx)
	})
}

// do sends a JSON request with token and decodes the JSON answer (nil for an empty body).
func (d *devService) do(token, method, path string, body any) (int, map[string]any) {
	d.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, d.server.URL+path, rd)
	if err != nil {
		d.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		d.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if _, documented := openapi.Match(method, req.URL.Path); documented {
		// Every answer the tests see must be one the API's document describes.
		if err := openapi.CheckResponse(method, req.URL.Path, resp.StatusCode, resp.Header.Get("Content-Type"), b); err != nil {
			d.t.Errorf("answer outside the OpenAPI document: %v\n%s", err, b)
		}
	}
	var out map[string]any
	if len(b) > 0 && strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		if err := json.Unmarshal(b, &out); err != nil {
			d.t.Fatalf("%s %s: %v: %s", method, path, err, b)
		}
	}
	return resp.StatusCode, out
}

// setCard sets a customer's default payment method at the dev Stripe, as the README shows.
func (d *devService) setCard(customerID, pm string) {
	d.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, d.proxy.URL+"/v1/customers/"+customerID,
		strings.NewReader(url.Values{"invoice_settings[default_payment_method]": {pm}}.Encode()))
	req.SetBasicAuth("sk_test_123", "")
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		d.t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		d.t.Fatalf("set card %s: %d", pm, resp.StatusCode)
	}
}

// In the dev loop a charge succeeds on the default card, and the test cards set as the
// customer's default payment method reach the API as Stripe's test mode answers them.
func TestDevLoopChargesFollowTheCustomersTestCard(t *testing.T) {
	t.Parallel()
	d := newDevService(t)
	status, cust := d.do(apitest.AppToken, http.MethodPut, "/v1/customers/u_dev", map[string]any{"email": "dev@example.com", "name": "Dev"})
	if status != http.StatusCreated {
		t.Fatalf("PUT customer: %d %v", status, cust)
	}
	cus, _ := cust["stripe_customer_id"].(string)
	charge := func(order string) (int, map[string]any) {
		return d.do(apitest.AppToken, http.MethodPost, "/v1/charges", map[string]any{"order_id": order, "user_id": "u_dev", "amount": 1250, "currency": "eur"})
	}
	if status, body := charge("o_visa"); status != http.StatusCreated || body["status"] != "succeeded" {
		t.Errorf("charge on the default card: %d %v", status, body)
	}
	for _, tc := range []struct{ card, code, decline string }{
		{"pm_card_chargeDeclined", "card_declined", "generic_decline"},
		{"pm_card_chargeDeclinedInsufficientFunds", "card_declined", "insufficient_funds"},
		{"pm_card_threeDSecure2Required", "authentication_required", ""},
		{"pm_card_authenticationRequired", "authentication_required", ""},
		{"pm_card_visa", "", ""},
	} {
		d.setCard(cus, tc.card)
		status, body := charge("o_" + tc.card)
		if tc.code == "" {
			if status != http.StatusCreated || body["status"] != "succeeded" {
				t.Errorf("%s: %d %v, want 201 succeeded", tc.card, status, body)
			}
			continue
		}
		e, _ := body["error"].(map[string]any)
		if status != http.StatusPaymentRequired || e["code"] != tc.code || (tc.decline != "" && e["decline_code"] != tc.decline) {
			t.Errorf("%s: %d %v, want 402 %s %s", tc.card, status, body, tc.code, tc.decline)
		}
	}

	// The dev Stripe keeps what the service created: the customer reads back as linked, and a
	// Checkout session as opened (not stripe-mock's fixture of another customer).
	if c := d.stripe.Account.DefaultPaymentMethod(cus); c != devstripe.DefaultCard {
		t.Errorf("customer %s at the dev Stripe: default payment method %q", cus, c)
	}
	status, cs := d.do(apitest.AppToken, http.MethodPost, "/v1/customers/u_dev/checkout-sessions", map[string]any{
		"request_id": "dev-1", "price_id": "price_dev", "quantity": 2,
		"success_url": "http://localhost:8080/ok", "cancel_url": "http://localhost:8080/no"})
	csID, _ := cs["id"].(string)
	if got := d.stripe.Sessions.Get(csID); status != http.StatusCreated || got == nil || got["customer"] != cus {
		t.Fatalf("checkout session: %d %v, kept %v", status, cs, got)
	}
	if f := d.stripe.Sessions.Request(csID); f.Get("line_items[0][price]") != "price_dev" || f.Get("line_items[0][quantity]") != "2" {
		t.Errorf("the session's create is not kept: %v", f)
	}
	if status, read := d.do(apitest.AppToken, http.MethodGet, "/v1/checkout-sessions/"+csID, nil); status != http.StatusOK || read["status"] != "open" {
		t.Errorf("GET checkout session: %d %v", status, read)
	}

	// Portal sessions open a local page, never stripe-mock's placeholder.
	status, sess := d.do(apitest.AppToken, http.MethodPost, "/v1/customers/u_dev/portal-sessions", map[string]any{})
	u, _ := sess["url"].(string)
	if status != http.StatusCreated || !strings.HasPrefix(u, devstripe.PortalBase(d.proxy)+"/dev-portal/bps_") || strings.Contains(u, "{") {
		t.Errorf("portal session: %d %v", status, sess)
	}
}

// eventWaiter waits until named events are processed, whichever path applied them (inline in
// their request, or a worker).
type eventWaiter struct {
	db *gorm.DB
}

func (w eventWaiter) processed(t *testing.T, eventID string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		var status []string
		if err := w.db.Raw(`SELECT status FROM webhook_events WHERE event_id = $1`, eventID).Scan(&status).Error; err != nil {
			t.Fatalf("read event %s: %v", eventID, err)
		}
		switch {
		case len(status) == 1 && status[0] == "processed":
			return
		case len(status) == 1 && status[0] == "failed":
			t.Fatalf("event %s failed", eventID)
		case time.Now().After(deadline):
			t.Fatalf("event %s not processed within 60s (status %v)", eventID, status)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The README's lifecycle, played with `billing trigger` against the service: one linked user's
// subscription through a trial, a failed payment (a hold), the payment (no hold), the end, and an
// event of another API version (a dead letter).
func TestTriggerPlaysALifecycleOfOneLinkedUser(t *testing.T) {
	t.Parallel()
	d := newDevService(t)
	status, cust := d.do(apitest.AppToken, http.MethodPut, "/v1/customers/u_life", map[string]any{"email": "life@example.com"})
	if status != http.StatusCreated {
		t.Fatalf("PUT customer: %d %v", status, cust)
	}
	cus, _ := cust["stripe_customer_id"].(string)
	d.start(t)
	wait := eventWaiter{db: d.app.DB}

	trigger := func(args ...string) string {
		t.Helper()
		r := runCLI(t, nil, append([]string{"trigger", "--url", d.server.URL + "/webhooks/stripe", "--secret", devSecret,
			"--customer", cus, "--subscription", "sub_life"}, args...)...)
		f := strings.Fields(r.stdout)
		if r.code != 0 || len(f) < 4 || f[2] != "->" || f[3] != "200" {
			t.Fatalf("trigger %v: exit %d, stdout %q, stderr %q", args, r.code, r.stdout, r.stderr)
		}
		return f[1]
	}
	entitlement := func() map[string]any {
		t.Helper()
		_, e := d.do(apitest.AppToken, http.MethodGet, "/v1/customers/u_life/entitlement", nil)
		return e
	}
	holds := func() []any {
		t.Helper()
		_, h := d.do(apitest.AdminToken, http.MethodGet, "/admin/holds", nil)
		l, _ := h["holds"].([]any)
		return l
	}

	wait.processed(t, trigger("customer.subscription.created", "--quantity", "3"))
	if e := entitlement(); e["entitled"] != true || e["status"] != "trialing" || e["subscription_id"] != "sub_life" || e["quantity"] != float64(3) {
		t.Fatalf("after created: %v", e)
	}
	wait.processed(t, trigger("entitlements.active_entitlement_summary.updated", "--features", "sso,api"))
	if e := entitlement(); fmt.Sprint(e["features"]) != "[api sso]" {
		t.Errorf("after the summary: %v", e)
	}
	wait.processed(t, trigger("invoice.payment_failed", "--invoice", "in_life"))
	if e, h := entitlement(), holds(); e["on_hold"] != true || len(h) != 1 || fmt.Sprint(e["features"]) != "[]" {
		t.Errorf("after payment_failed: entitlement %v, holds %v", e, h)
	}
	wait.processed(t, trigger("invoice.payment_succeeded", "--invoice", "in_life"))
	if e, h := entitlement(), holds(); e["on_hold"] != false || len(h) != 0 || fmt.Sprint(e["features"]) != "[api sso]" {
		t.Errorf("after payment_succeeded: entitlement %v, holds %v", e, h)
	}
	wait.processed(t, trigger("customer.subscription.deleted"))
	if e := entitlement(); e["entitled"] != false || e["status"] != "canceled" {
		t.Errorf("after deleted: %v", e)
	}
	old := trigger("customer.subscription.updated", "--status", "active", "--api-version", "2020-08-27")
	_, ev := d.do(apitest.AdminToken, http.MethodGet, "/admin/events/"+old, nil)
	if ev["status"] != "failed" || ev["failure_reason"] != webhooks.FailureAPIVersionMismatch {
		t.Errorf("event of another API version: %v", ev)
	}

	// Event ids are new every time unless given; a given one again is a redelivery.
	if a, b := trigger("customer.subscription.updated", "--status", "canceled"), trigger("customer.subscription.updated", "--status", "canceled"); a == b {
		t.Errorf("two triggers sent the same event id %s", a)
	}
	trigger("customer.subscription.updated", "--status", "canceled", "--event-id", "evt_life_again")
	r := runCLI(t, nil, "trigger", "customer.subscription.updated", "--url", d.server.URL+"/webhooks/stripe", "--secret", devSecret, "--event-id", "evt_life_again")
	if !strings.Contains(r.stdout, `"duplicate"`) {
		t.Errorf("the same --event-id again: %q", r.stdout)
	}
}
