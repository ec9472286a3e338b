package billing

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"golang.org/x/net/html"

	"billing/webhooks"
)

type holdsBody struct {
	Holds []HoldView `json:"holds"`
}

func (e *env) holds(t *testing.T) map[string]HoldView {
	t.Helper()
	var b holdsBody
	if code, body := e.get(t, "/admin/holds", &b); code != http.StatusOK {
		t.Fatalf("GET /admin/holds: %d %s", code, body)
	}
	out := map[string]HoldView{}
	for _, h := range b.Holds {
		out[h.SubscriptionID] = h
	}
	return out
}

func TestAdminHoldsAppearAndVanish(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.link(t, "u1", "cus_1", "u1@example.com")
	inv := invObj{ID: "in_1", Customer: "cus_1", Subscription: "sub_1", Currency: "usd", AmountDue: 2500,
		AttemptCount: 1, NextAttempt: 86400, URL: "https://invoice.stripe.com/i/in_1"}
	e.mustHandle(t, created("e1", 1, s1))
	if h := e.holds(t); len(h) != 0 {
		t.Fatalf("holds before any failure: %v", h)
	}

	e.mustHandle(t, failed("f1", 100, inv))
	h, ok := e.holds(t)["sub_1"]
	if !ok {
		t.Fatal("payment failure not listed")
	}
	if ptrStr(h.UserID) != "u1" || h.StripeCustomerID != "cus_1" || h.Status != StatusActive || h.HoldReason != HoldPaymentFailed ||
		ptrTime(h.OnHoldSince) != "2024-06-01T00:01:40Z" || ptrInt(h.AttemptCount) != "1" || ptrTime(h.NextPaymentAttempt) != "2024-06-02T00:00:00Z" ||
		ptrInt(h.AmountDue) != "2500" || ptrStr(h.Currency) != "usd" || ptrStr(h.HostedInvoiceURL) != inv.URL || h.Livemode {
		t.Errorf("hold entry: %+v", h)
	}

	// An unlinked customer's hold is listed with user_id null; the raw JSON says so.
	e.mustHandle(t, updated("x1", 5, subObj{ID: "sub_x", Customer: "cus_unlinked", Status: StatusPastDue}))
	code, body := e.get(t, "/admin/holds", nil)
	if code != http.StatusOK || !strings.Contains(string(body), `"subscription_id":"sub_x","stripe_customer_id":"cus_unlinked","user_id":null,"status":"past_due","hold_reason":"past_due"`) {
		t.Errorf("unlinked hold JSON: %s", body)
	}
	if got := e.holds(t); len(got) != 2 {
		t.Errorf("%d holds, want 2", len(got))
	}

	// Paid, and back to active: both vanish.
	e.mustHandle(t, succeeded("p1", 200, inv), updated("x2", 6, subObj{ID: "sub_x", Customer: "cus_unlinked", Status: StatusActive}))
	if got := e.holds(t); len(got) != 0 {
		t.Errorf("holds after recovery: %v", got)
	}

	// Canceled while past_due: not a hold.
	e.mustHandle(t, updated("x3", 7, subObj{ID: "sub_x", Customer: "cus_unlinked", Status: StatusUnpaid}))
	if _, ok := e.holds(t)["sub_x"]; !ok {
		t.Error("unpaid not listed")
	}
	e.mustHandle(t, deleted("x4", 8, subObj{ID: "sub_x", Customer: "cus_unlinked", Status: StatusCanceled}))
	if _, ok := e.holds(t)["sub_x"]; ok {
		t.Error("canceled subscription still listed")
	}
}

// cells returns, for every <tr> with the given data attribute inside the table with id tableID,
// the attribute's value mapped to the row's cells by class name (text content, and the href or
// form action for links and forms).
func cells(t *testing.T, doc *html.Node, tableID, rowAttr string) map[string]map[string]string {
	t.Helper()
	var table *html.Node
	walk(doc, func(n *html.Node) {
		if n.Type == html.ElementNode && n.Data == "table" && attr(n, "id") == tableID {
			table = n
		}
	})
	if table == nil {
		return nil
	}
	rows := map[string]map[string]string{}
	walk(table, func(n *html.Node) {
		if n.Type != html.ElementNode || n.Data != "tr" || attr(n, rowAttr) == "" {
			return
		}
		row := map[string]string{}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			if c.Type != html.ElementNode || c.Data != "td" {
				continue
			}
			class := attr(c, "class")
			if i := strings.IndexByte(class, ' '); i >= 0 {
				class = class[:i]
			}
			row[class] = strings.TrimSpace(text(c))
			walk(c, func(m *html.Node) {
				if m.Type == html.ElementNode && m.Data == "a" {
					row[class+".href"] = attr(m, "href")
				}
				if m.Type == html.ElementNode && m.Data == "form" {
					row[class+".action"] = attr(m, "action")
					row[class+".method"] = attr(m, "method")
				}
			})
		}
		rows[attr(n, rowAttr)] = row
	})
	return rows
}

func walk(n *html.Node, f func(*html.Node)) {
	f(n)
	for c := n.FirstChild; c != nil; c = c.NextSibling {
		walk(c, f)
	}
}

func attr(n *html.Node, key string) string {
	for _, a := range n.Attr {
		if a.Key == key {
			return a.Val
		}
	}
	return ""
}

func text(n *html.Node) string {
	var b strings.Builder
	walk(n, func(m *html.Node) {
		if m.Type == html.TextNode {
			b.WriteString(m.Data)
		}
	})
	return strings.Join(strings.Fields(b.String()), " ")
}

func (e *env) adminPage(t *testing.T, path string) *html.Node {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, path, nil)
	rec := httptest.NewRecorder()
	e.echo.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK || !strings.HasPrefix(rec.Header().Get("Content-Type"), "text/html") {
		t.Fatalf("GET %s: %d %s", path, rec.Code, rec.Header().Get("Content-Type"))
	}
	doc, err := html.Parse(rec.Body)
	if err != nil {
		t.Fatalf("parse admin page: %v", err)
	}
	return doc
}

func TestAdminPage(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.link(t, "user-<1>", "cus_1", "u1@example.com")
	inv := invObj{ID: "in_1", Customer: "cus_1", Subscription: "sub_1", Currency: "usd", AmountDue: 2500,
		AttemptCount: 2, NextAttempt: 86400, URL: "https://invoice.stripe.com/i/in_1"}
	e.mustHandle(t, created("e1", 1, s1), failed("f1", 100, inv),
		updated("x1", 5, subObj{ID: "sub_x", Customer: "cus_unlinked", Status: StatusUnpaid}),
		created("ok", 5, subObj{ID: "sub_ok", Customer: "cus_ok", Status: StatusActive}))
	e.dead.items = []webhooks.DeadLetter{
		{EventID: "evt_dead1", Type: "customer.subscription.updated", LastError: "boom <script>", Attempts: 3, DeadAt: at(500)},
		{EventID: "evt_dead2", Type: "invoice.payment_failed", LastError: "api_version_mismatch", Attempts: 1, DeadAt: at(600), Livemode: true},
	}

	for _, path := range []string{"/admin", "/admin/"} {
		doc := e.adminPage(t, path)
		holds := cells(t, doc, "holds", "data-subscription-id")
		if len(holds) != 2 {
			t.Fatalf("%s: %d hold rows, want 2: %v", path, len(holds), holds)
		}
		h := holds["sub_1"]
		want := map[string]string{
			"user": "user-<1>", "customer": "cus_1", "subscription": "sub_1", "status": "active", "reason": "payment_failed",
			"since": "June 1, 2024 00:01 UTC", "attempts": "2", "next-retry": "June 2, 2024 00:00 UTC",
			"amount": "25.00 USD", "invoice": "invoice", "invoice.href": inv.URL,
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
	doc := e.adminPage(t, "/admin")
	if rows := cells(t, doc, "holds", "data-subscription-id"); rows != nil {
		t.Errorf("holds table on an empty page: %v", rows)
	}
	found := map[string]bool{}
	walk(doc, func(n *html.Node) {
		if id := attr(n, "id"); id != "" {
			found[id] = true
		}
	})
	if !found["no-holds"] || !found["no-dead-letters"] {
		t.Errorf("empty-state markers missing: %v", found)
	}

	// A failing dead-letter source degrades the page instead of failing it.
	e.dead.err = errors.New("inbox down")
	doc = e.adminPage(t, "/admin")
	found = map[string]bool{}
	walk(doc, func(n *html.Node) {
		if id := attr(n, "id"); id != "" {
			found[id] = true
		}
	})
	if !found["dead-letters-error"] {
		t.Errorf("no error marker: %v", found)
	}
}

// GET /admin/holds entries carry exactly the fields of INTERFACE §3, nulls included.
func TestAdminHoldsJSONFields(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.mustHandle(t, created("e1", 1, s1), failed("f1", 2, invObj{ID: "in_1", Customer: "cus_1", Subscription: "sub_1",
		Currency: "usd", AmountDue: 100, AttemptCount: 1}))
	var b struct {
		Holds []map[string]any `json:"holds"`
	}
	code, body := e.get(t, "/admin/holds", &b)
	if code != http.StatusOK || len(b.Holds) != 1 {
		t.Fatalf("GET /admin/holds: %d %s", code, body)
	}
	want := []string{"amount_due", "attempt_count", "currency", "hold_reason", "hosted_invoice_url", "livemode",
		"next_payment_attempt", "on_hold_since", "status", "stripe_customer_id", "subscription_id", "user_id"}
	got := make([]string, 0, len(b.Holds[0]))
	for k := range b.Holds[0] {
		got = append(got, k)
	}
	if !slices.Equal(sortedCopy(got), want) {
		t.Errorf("fields %v, want %v", sortedCopy(got), want)
	}
	if b.Holds[0]["user_id"] != nil || b.Holds[0]["next_payment_attempt"] != nil || b.Holds[0]["amount_due"] != float64(100) {
		t.Errorf("entry %s", body)
	}
}
