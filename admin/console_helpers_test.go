package admin

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverdatabasesql"
	"gorm.io/gorm"

	"billing/billing"
	"billing/customers"
	"billing/entitlements"
	"billing/internal/apitest"
	"billing/internal/audit"
	"billing/internal/auth"
	"billing/internal/httpserver"
	"billing/internal/stripeclient"
	"billing/internal/stripeemu"
	"billing/internal/stripeevents"
	"billing/internal/testenv"
	"billing/ledger"
	"billing/reconcile"
	"billing/usage"
	"billing/webhooks"
)

const (
	// The console's admin token is named (name:TOKEN in auth.admin_tokens); the other is not, so
	// its actor is its fingerprint.
	consoleAdminName  = "alice"
	consoleAdminToken = "admin-console-0123456789abcdef0123456789"
	consoleOtherToken = "admin-other-0123456789abcdef0123456789ab"
	consoleAppToken   = "app-console-0123456789abcdef0123456789ab"
	consoleTestSecret = "whsec_console_test"
	consoleLiveSecret = "whsec_console_live"
)

// console is the whole console as the service mounts it: the real inbox (events arrive through
// its signed webhook endpoint), billing's handlers, the ledger, the reconcile reader, and admin
// authentication with its CSRF check, on an HTTP server of its own.
type console struct {
	db     *gorm.DB
	svc    *billing.Service
	ents   *entitlements.Service
	reg    *webhooks.Registry
	inbox  *webhooks.Inbox
	rec    *reconcile.Service
	acct   *stripeemu.Account
	echo   *echo.Echo
	server *httptest.Server
}

func newConsole(t *testing.T) *console {
	t.Helper()
	db := testenv.DB(t)
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.DiscardHandler)
	// Insert-only: no worker runs; the test processes events itself, one at a time.
	rc, err := river.NewClient(riverdatabasesql.New(sqlDB), &river.Config{Logger: logger})
	if err != nil {
		t.Fatalf("river client: %v", err)
	}
	c := &console{db: db, reg: webhooks.NewRegistry()}
	clock := func() time.Time { return at(10 * 86400) }
	c.svc = billing.New(billing.Deps{DB: db, Jobs: rc, Now: clock})
	c.ents = entitlements.New(entitlements.Deps{DB: db, Billing: c.svc, Jobs: rc, Now: clock,
		Policy: entitlements.Policy{PastDueEntitled: true}})
	c.svc.SetTeller(c.ents)
	c.svc.Register(c.reg)
	c.ents.Register(c.reg)
	c.inbox = webhooks.New(webhooks.Config{
		DB: db, Logger: logger, Registry: c.reg,
		TestSecrets: []string{consoleTestSecret}, LiveSecrets: []string{consoleLiveSecret},
		Tolerance: 5 * time.Minute, MaxAttempts: 3, RetryDelay: time.Second,
		Metrics: webhooks.NewMetrics(prometheus.NewRegistry()),
	})
	c.inbox.SetJobs(rc)

	c.echo = httpserver.New(httpserver.Options{Logger: logger, Registry: prometheus.NewRegistry(), Ready: func(context.Context) error { return nil }})
	c.inbox.MountWebhook(c.echo)
	// A reconciler of test mode against an account of the Stripe double (empty unless a test
	// fills it).
	proxy := stripeemu.New(t, testenv.StripeMockURL(t))
	c.acct = stripeemu.NewAccount(proxy, false)
	c.rec = reconcile.New(reconcile.Deps{DB: db, Stripe: stripeclient.New(proxy.URL, "sk_test_console", logger),
		Billing: c.svc, Entitlements: c.ents, Logger: logger})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = c.rec.Stop(ctx)
	})
	tokens := auth.New([]string{consoleAppToken}, []string{consoleAdminName + ":" + consoleAdminToken, consoleOtherToken})
	group := c.echo.Group("/admin", tokens.Require(auth.RoleAdmin, true))
	New(Deps{
		Holds: c.svc, DeadLetters: c.inbox, Events: c.inbox, Subscriptions: c.svc, Policy: c.ents,
		Charges: ledger.New(ledger.Deps{DB: db}), Reconcile: c.rec,
		People: customers.NewDirectory(db), Accounts: c.svc, Runs: c.rec, Audit: audit.NewLog(db), Logger: logger,
		Usage: usage.New(usage.Deps{DB: db, Periods: c.ents, Logger: logger}),
	}).Mount(group)
	c.inbox.MountAdmin(group)
	c.rec.MountAdmin(group)
	c.server = httptest.NewServer(c.echo)
	t.Cleanup(c.server.Close)
	return c
}

// deliver posts events, signed, to the webhook endpoint: each is stored as received with its job.
func (c *console) deliver(t *testing.T, payloads ...[]byte) {
	t.Helper()
	for _, p := range payloads {
		var env struct {
			Livemode bool `json:"livemode"`
		}
		if err := json.Unmarshal(p, &env); err != nil {
			t.Fatal(err)
		}
		secret := consoleTestSecret
		if env.Livemode {
			secret = consoleLiveSecret
		}
		// To the handler the server serves: the same endpoint, without the network in between.
		if rec := apitest.DeliverWebhook(t, c.echo, secret, p); rec.Code != http.StatusOK {
			t.Fatalf("deliver: %d %s", rec.Code, rec.Body)
		}
	}
}

// process does what the inbox's worker does with stored events: applies each with its handler
// and marks it processed, in one transaction, in the order given.
func (c *console) process(t *testing.T, ids ...string) {
	t.Helper()
	for _, id := range ids {
		var rows []struct {
			Type     string
			Livemode bool
			Payload  string
		}
		if err := c.db.Raw(`SELECT type, livemode, payload::text AS payload FROM webhook_events WHERE event_id = $1`, id).Scan(&rows).Error; err != nil || len(rows) != 1 {
			t.Fatalf("load %s: %v %v", id, rows, err)
		}
		var p struct {
			Created    int64  `json:"created"`
			APIVersion string `json:"api_version"`
			Data       struct {
				Object json.RawMessage `json:"object"`
			} `json:"data"`
		}
		if err := json.Unmarshal([]byte(rows[0].Payload), &p); err != nil {
			t.Fatal(err)
		}
		h, ok := c.reg.Lookup(rows[0].Type)
		if !ok {
			t.Fatalf("no handler for %s", rows[0].Type)
		}
		ev := webhooks.Event{ID: id, Type: rows[0].Type, Livemode: rows[0].Livemode, APIVersion: p.APIVersion,
			Created: time.Unix(p.Created, 0).UTC(), Payload: []byte(rows[0].Payload), Object: p.Data.Object}
		err := c.db.Transaction(func(tx *gorm.DB) error {
			if err := h.HandleEvent(context.Background(), tx, ev); err != nil {
				return err
			}
			return tx.Exec(`UPDATE webhook_events SET status = 'processed', attempts = attempts + 1, processed_at = clock_timestamp() WHERE event_id = $1`, id).Error
		})
		if err != nil {
			t.Fatalf("process %s: %v", id, err)
		}
	}
}

// deadLetter fails a stored event for good, as the worker does after its last attempt.
func (c *console) deadLetter(t *testing.T, id, lastError string) {
	t.Helper()
	c.exec(t, `UPDATE webhook_events SET status = 'failed', attempts = 3, failure_reason = 'handler_error' WHERE event_id = $1`, id)
	c.exec(t, `INSERT INTO webhook_dead_letters (event_id, livemode, attempts, last_error) SELECT event_id, livemode, 3, $2 FROM webhook_events WHERE event_id = $1`, id, lastError)
}

func (c *console) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	testenv.Exec(t, c.db, sql, args...)
}

func (c *console) status(t *testing.T, id string) string {
	t.Helper()
	var s []string
	if err := c.db.Raw(`SELECT status FROM webhook_events WHERE event_id = $1`, id).Scan(&s).Error; err != nil || len(s) != 1 {
		t.Fatalf("status of %s: %v %v", id, s, err)
	}
	return s[0]
}

// do requests path with the admin token as the Basic password, as a browser does, following no
// redirect.
func (c *console) do(t *testing.T, method, path string, form url.Values, header map[string]string) *http.Response {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, c.server.URL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	req.SetBasicAuth("admin", consoleAdminToken)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", c.server.URL)
		req.Header.Set("Sec-Fetch-Site", "same-origin")
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// html GETs a page and returns its body; the status must be want.
func (c *console) html(t *testing.T, path string, want int) string {
	t.Helper()
	resp := c.do(t, http.MethodGet, path, nil, nil)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("GET %s: %d %s, want %d:\n%s", path, resp.StatusCode, resp.Header.Get("Content-Type"), want, b)
	}
	return string(b)
}

var csrfField = regexp.MustCompile(`name="csrf_token" value="([^"]+)"`)

// csrf is the token of a page's forms.
func csrf(t *testing.T, page string) string {
	t.Helper()
	m := csrfField.FindStringSubmatch(page)
	if m == nil {
		t.Fatal("no CSRF token on the page")
	}
	return m[1]
}

// story delivers a small history: u1's subscription sub_1 whose payment failed (on hold), one
// event delivered late (skipped by the ordering guard), a dead-lettered event whose error has
// markup in it, sub_2 of an unlinked customer, unpaid, and a live-mode subscription.
func (c *console) story(t *testing.T) {
	t.Helper()
	c.exec(t, `INSERT INTO customers (user_id, stripe_customer_id, email, name) VALUES ('user-1', 'cus_1', 'u1@example.com', 'Ursula One')`)
	sub := stripeevents.Subscription{ID: "sub_1", Customer: "cus_1", Status: billing.StatusActive, PriceID: "price_pro",
		CurrentPeriodStart: at(0), CurrentPeriodEnd: at(30 * 86400)}
	inv := stripeevents.Invoice{ID: "in_1", Customer: "cus_1", CustomerEmail: "u1@example.com", Subscription: "sub_1", Status: "open",
		Currency: "usd", AmountDue: 2500, AttemptCount: 2, NextPaymentAttempt: at(86400 * 12), HostedInvoiceURL: "https://invoice.stripe.com/i/in_1"}
	late := sub
	late.Status = billing.StatusTrialing
	c.deliver(t,
		stripeevents.SubscriptionEvent("evt_created", billing.EventSubscriptionCreated, at(1), false, sub),
		stripeevents.InvoiceEvent("evt_failed", billing.EventInvoicePaymentFailed, at(86400), false, inv),
		stripeevents.SubscriptionEvent("evt_late", billing.EventSubscriptionUpdated, at(0), false, late),
		stripeevents.SubscriptionEvent("evt_unpaid", billing.EventSubscriptionUpdated, at(5), false,
			stripeevents.Subscription{ID: "sub_2", Customer: "cus_2", Status: billing.StatusUnpaid}),
		stripeevents.SubscriptionEvent("evt_live", billing.EventSubscriptionCreated, at(6), true,
			stripeevents.Subscription{ID: "sub_live", Customer: "cus_live", Status: billing.StatusActive}),
		stripeevents.SubscriptionEvent("evt_dead", billing.EventSubscriptionUpdated, at(7), false,
			stripeevents.Subscription{ID: "sub_<b>3</b>", Customer: "cus_3", Status: billing.StatusActive}),
		stripeevents.SubscriptionEvent("evt_waiting", billing.EventSubscriptionUpdated, at(8), false,
			stripeevents.Subscription{ID: "sub_4", Customer: "cus_4", Status: billing.StatusActive}),
	)
	c.process(t, "evt_created", "evt_failed", "evt_late", "evt_unpaid", "evt_live")
	c.deadLetter(t, "evt_dead", `boom <script>alert("x")</script>`)
	// An earlier invoice, paid, as the invoice events store it.
	c.exec(t, `INSERT INTO invoices (invoice_id, livemode, stripe_customer_id, subscription_id, number, status, amount_due, amount_paid, currency, created)
		VALUES ('in_0', false, 'cus_1', 'sub_1', 'INV-0001', 'paid', 2500, 2500, 'usd', $1) ON CONFLICT (invoice_id, livemode) DO NOTHING`, at(-86400*30))
}

// money adds to the story: people found by email and name (Carol and Caroline share a prefix),
// a linked user without any subscription, a user linked in live mode, user-1 linked in live mode
// too (with nothing there), and ledger rows of user-1 with a refund, plus a live-mode charge.
func (c *console) money(t *testing.T) {
	t.Helper()
	c.exec(t, `INSERT INTO customers (user_id, stripe_customer_id, email, name) VALUES
		('user-carol', 'cus_carol', 'Carol@Example.com', 'Carol Danvers'),
		('user-caroline', 'cus_caroline', 'caroline@example.com', 'Caroline Forbes'),
		('user-nosub', 'cus_nosub', 'nosub@example.com', 'Nobody Subscribed')`)
	c.exec(t, `INSERT INTO customers (user_id, stripe_customer_id, email, name, livemode) VALUES
		('user-live', 'cus_live', 'live@example.com', 'Liv Live', true),
		('user-1', 'cus_1live', 'u1@example.com', 'Ursula One', true)`)
	charge := func(order, user, cus string, live bool, amount int64, state, status, pi string, created time.Time) {
		t.Helper()
		var st, p, answer any
		if status != "" {
			st, answer = status, `{"body": {}}`
		}
		if pi != "" {
			p = pi
		}
		c.exec(t, `INSERT INTO charges (order_id, user_id, stripe_customer_id, amount, currency, request_hash, idempotency_key,
			livemode, state, status, payment_intent_id, answer, attempts, created_at)
			VALUES ($1, $2, $3, $4, 'usd', 'h', 'charge-' || $1, $5, $6, $7, $8, $9, 1, $10)`,
			order, user, cus, amount, live, state, st, p, answer, created)
	}
	charge("order-1", "user-1", "cus_1", false, 4200, "completed", "succeeded", "pi_1", at(100))
	charge("order-2", "user-1", "cus_1", false, 1000, "completed", "declined", "pi_2", at(200))
	charge("order-3", "user-1", "cus_1", false, 1500, "pending", "", "", at(300))
	charge("order-live", "user-live", "cus_live", true, 9900, "completed", "succeeded", "pi_live", at(400))
	c.exec(t, `INSERT INTO refunds (order_id, refund_id, livemode, amount, request_hash, idempotency_key, state, status, stripe_refund_id, answer, created_at)
		VALUES ('order-1', 'refund-a', false, 1200, 'h', 'refund-order-1-refund-a', 'completed', 'succeeded', 're_1', '{"body": {}}', $1)`, at(150))
}
