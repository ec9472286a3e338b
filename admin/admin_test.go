package admin

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"

	"billing/billing"
	"billing/internal/apitest"
	"billing/internal/httpserver"
	"billing/internal/stripeevents"
	"billing/webhooks"
)

var sub1 = stripeevents.Subscription{ID: "sub_1", Customer: "cus_1", Status: billing.StatusActive, PriceID: "price_pro",
	CurrentPeriodStart: at(0), CurrentPeriodEnd: at(30 * 86400)}

func TestAdminPage(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.link(t, "user-<1>", "cus_1", "u1@example.com")
	inv := stripeevents.Invoice{ID: "in_1", Customer: "cus_1", Subscription: "sub_1", Status: "open", Currency: "usd", AmountDue: 2500,
		AttemptCount: 2, NextPaymentAttempt: at(86400), HostedInvoiceURL: "https://invoice.stripe.com/i/in_1"}
	e.handle(t,
		stripeevents.SubscriptionEvent("e1", billing.EventSubscriptionCreated, at(1), false, sub1),
		stripeevents.InvoiceEvent("f1", billing.EventInvoicePaymentFailed, at(100), false, inv),
		stripeevents.SubscriptionEvent("x1", billing.EventSubscriptionUpdated, at(5), false,
			stripeevents.Subscription{ID: "sub_x", Customer: "cus_unlinked", Status: billing.StatusUnpaid}),
		stripeevents.SubscriptionEvent("ok", billing.EventSubscriptionCreated, at(5), false,
			stripeevents.Subscription{ID: "sub_ok", Customer: "cus_ok", Status: billing.StatusActive}))
	e.dead.set([]webhooks.DeadLetter{
		{EventID: "evt_dead1", Type: "customer.subscription.updated", LastError: "boom <script>", Attempts: 3, DeadAt: at(500)},
		{EventID: "evt_dead2", Type: "invoice.payment_failed", LastError: "api_version_mismatch", Attempts: 1, DeadAt: at(600), Livemode: true},
	}, nil)

	for _, path := range []string{"/admin", "/admin/"} {
		doc, header := e.page(t, path)
		// The page runs no script, may only post forms back here, and is never cached or framed.
		if csp := header.Get("Content-Security-Policy"); csp != "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'" ||
			header.Get("Cache-Control") != "no-store" || header.Get("X-Content-Type-Options") != "nosniff" || header.Get("X-Frame-Options") != "DENY" {
			t.Errorf("%s: headers %v", path, header)
		}
		holds := cells(t, doc, "holds", "data-subscription-id")
		if len(holds) != 2 {
			t.Fatalf("%s: %d hold rows, want 2: %v", path, len(holds), holds)
		}
		h := holds["sub_1"]
		want := map[string]string{
			"user": "user-<1>", "customer": "cus_1", "subscription": "sub_1", "status": "active", "reason": "payment_failed",
			"since": "June 1, 2024 00:01 UTC", "attempts": "2", "next-retry": "June 2, 2024 00:00 UTC",
			"amount": "25.00 USD", "invoice": "invoice", "invoice.href": inv.HostedInvoiceURL,
		}
		for k, v := range want {
			if h[k] != v {
				t.Errorf("%s: hold sub_1 %s = %q, want %q", path, k, h[k], v)
			}
		}
		if x := holds["sub_x"]; x["user"] != "not linked" || x["reason"] != "unpaid" || x["invoice.href"] != "" {
			t.Errorf("%s: hold sub_x = %v", path, x)
		}

		dead := cells(t, doc, "dead-letters", "data-event-id")
		if len(dead) != 2 {
			t.Fatalf("%s: %d dead-letter rows: %v", path, len(dead), dead)
		}
		d := dead["evt_dead1"]
		if d["type"] != "customer.subscription.updated" || d["attempts"] != "3" || d["last-error"] != "boom <script>" ||
			d["replay.action"] != "/admin/events/evt_dead1/replay" || d["replay.method"] != "post" || d["mode"] != "test" {
			t.Errorf("%s: dead letter row %v", path, d)
		}
		if dead["evt_dead2"]["mode"] != "live" {
			t.Errorf("%s: live dead letter: %v", path, dead["evt_dead2"])
		}
	}
}

func TestAdminPageEmptyAndDegraded(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	doc, _ := e.page(t, "/admin")
	if rows := cells(t, doc, "holds", "data-subscription-id"); rows != nil {
		t.Errorf("holds table on an empty page: %v", rows)
	}
	if found := ids(doc); !found["no-holds"] || !found["no-dead-letters"] {
		t.Errorf("empty-state markers missing: %v", found)
	}

	// A failing dead-letter source degrades the page instead of failing it.
	e.dead.set(nil, errors.New("inbox down"))
	doc, _ = e.page(t, "/admin")
	if found := ids(doc); !found["dead-letters-error"] {
		t.Errorf("no error marker: %v", found)
	}

	// Without a dead-letter source the section says so.
	c := New(Deps{Holds: e.svc})
	ec := echo.New()
	c.Mount(ec.Group("/admin"))
	rec := httptest.NewRecorder()
	ec.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/admin", nil))
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `id="dead-letters-unavailable"`) {
		t.Errorf("without dead letters: %d %s", rec.Code, rec.Body)
	}
}

// GET /admin/holds entries carry exactly the fields of the admin API, nulls included.
func TestAdminHoldsJSONFields(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.handle(t,
		stripeevents.SubscriptionEvent("e1", billing.EventSubscriptionCreated, at(1), false, sub1),
		stripeevents.InvoiceEvent("f1", billing.EventInvoicePaymentFailed, at(2), false,
			stripeevents.Invoice{ID: "in_1", Customer: "cus_1", Subscription: "sub_1", Status: "open", Currency: "usd", AmountDue: 100, AttemptCount: 1}))
	rec := e.get(t, "/admin/holds")
	var b struct {
		Holds []map[string]any `json:"holds"`
	}
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &b) != nil || len(b.Holds) != 1 {
		t.Fatalf("GET /admin/holds: %d %s", rec.Code, rec.Body)
	}
	want := []string{"amount_due", "attempt_count", "currency", "hold_reason", "hosted_invoice_url", "livemode",
		"next_payment_attempt", "on_hold_since", "status", "stripe_customer_id", "subscription_id", "user_id"}
	got := make([]string, 0, len(b.Holds[0]))
	for k := range b.Holds[0] {
		got = append(got, k)
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("fields %v, want %v", got, want)
	}
	if b.Holds[0]["user_id"] != nil || b.Holds[0]["next_payment_attempt"] != nil || b.Holds[0]["amount_due"] != float64(100) ||
		b.Holds[0]["subscription_id"] != "sub_1" {
		t.Errorf("entry %s", rec.Body)
	}

	// None on hold: an empty list, not null.
	e.handle(t, stripeevents.InvoiceEvent("p1", billing.EventInvoicePaymentSucceeded, at(3), false,
		stripeevents.Invoice{ID: "in_1", Customer: "cus_1", Subscription: "sub_1", Status: "paid", Currency: "usd", AmountDue: 100, AttemptCount: 1}))
	if rec := e.get(t, "/admin/holds"); rec.Code != http.StatusOK || strings.TrimSpace(rec.Body.String()) != `{"holds":[]}` {
		t.Errorf("no holds: %d %s", rec.Code, rec.Body)
	}
}

// The database being down is an outage the caller should retry (503), not a 500.
func TestAdminAnswers503WhenTheDatabaseIsDown(t *testing.T) {
	t.Parallel()
	svc := billing.New(billing.Deps{DB: apitest.UnreachableDB(t)})
	e := echo.New()
	e.HTTPErrorHandler = httpserver.ErrorHandler(slog.New(slog.DiscardHandler))
	New(Deps{Holds: svc, DeadLetters: &fakeDeadLetters{}}).Mount(e.Group("/admin"))
	for _, path := range []string{"/admin/holds", "/admin"} {
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), `"database_unavailable"`) {
			t.Errorf("GET %s = %d %s, want 503 database_unavailable", path, rec.Code, rec.Body)
		}
	}
}
