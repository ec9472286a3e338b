package admin

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/html"

	"billing/internal/audit"
	"billing/internal/auth"
)

// The customer page shows each mode's world apart, with its badge, and everything hanging from
// the link: subscriptions with the policy's words, invoices, charges with their refunds, notices,
// and Stripe dashboard links of the mode.
func TestCustomerPage(t *testing.T) {
	t.Parallel()
	c := newConsole(t)
	c.story(t)
	c.money(t)

	doc := parse(t, c.html(t, "/admin/ui/customers/user-1", http.StatusOK))
	if got := byID(doc, "test-entitlement"); !strings.HasPrefix(got, "Entitled: the subscription is active.") {
		t.Errorf("entitlement: %q", got)
	}
	// user-1 is linked in both modes: both worlds, the deployment's (test) first, each with its
	// own customer; the live one has no subscription.
	var worlds []string
	walk(doc, func(n *html.Node) {
		if n.Data == "section" && attr(n, "data-mode") != "" {
			worlds = append(worlds, attr(n, "data-mode"))
		}
	})
	if !slices.Equal(worlds, []string{"test", "live"}) || !strings.Contains(byID(doc, "live-link"), "cus_1live") ||
		!strings.Contains(byID(doc, "live-no-subscriptions"), "never subscribed") || strings.Contains(byID(doc, "live-link"), "cus_1 ") {
		t.Errorf("user-1's worlds %v: live %q", worlds, byID(doc, "live-link"))
	}
	if got := byID(doc, "test-link"); !strings.Contains(got, "cus_1") || !strings.Contains(got, "u1@example.com") || !strings.Contains(got, "Ursula One") {
		t.Errorf("link: %q", got)
	}
	subs := cells(t, doc, "test-subscriptions", "data-subscription-id")
	if subs["sub_1"]["status"] != "active" || subs["sub_1"]["entitled"] != "yes" || !strings.HasPrefix(subs["sub_1"]["hold"], "payment_failed") ||
		subs["sub_1"]["subscription.href"] != "/admin/ui/subscriptions/sub_1" {
		t.Errorf("subscriptions: %v", subs)
	}
	inv := cells(t, doc, "test-invoices", "data-invoice-id")
	if inv["in_0"]["status"] != "paid" {
		t.Errorf("invoices: %v", inv)
	}
	charges := cells(t, doc, "test-charges", "data-order-id")
	if got := rowsOf(doc, "test-charges", "data-order-id"); !slices.Equal(got, []string{"order-3", "order-2", "order-1"}) {
		t.Errorf("charges, newest first: %v", got)
	}
	if charges["order-1"]["amount"] != "42.00 USD" || charges["order-1"]["refunded"] != "12.00 USD" || charges["order-1"]["status"] != "succeeded" ||
		charges["order-1"]["pi.href"] != "https://dashboard.stripe.com/test/payments/pi_1" || charges["order-1"]["order.href"] != "/admin/ui/charges/order-1?mode=test" {
		t.Errorf("order-1: %v", charges["order-1"])
	}
	if !strings.HasPrefix(charges["order-2"]["status"], "declined") || !strings.HasPrefix(charges["order-3"]["status"], "pending 1 attempt so far") {
		t.Errorf("order-2 %q, order-3 %q", charges["order-2"]["status"], charges["order-3"]["status"])
	}
	refunds := cells(t, doc, "test-charges", "data-refund-id")
	if refunds["refund-a"]["amount"] != "−12.00 USD" || refunds["refund-a"]["status"] != "succeeded" ||
		refunds["refund-a"]["stripe.href"] != "https://dashboard.stripe.com/test/refunds/re_1" {
		t.Errorf("refund: %v", refunds)
	}
	if !strings.Contains(byID(doc, "test-notices"), "payment_failed") {
		t.Errorf("notices: %q", byID(doc, "test-notices"))
	}

	// A live-mode link: its badge, and dashboard links without /test.
	page := c.html(t, "/admin/ui/customers/user-live", http.StatusOK)
	doc = parse(t, page)
	if ids := ids(doc); !ids["live-link"] || ids["test-link"] {
		t.Errorf("user-live's worlds: %v", ids)
	}
	if !strings.Contains(page, `href="https://dashboard.stripe.com/customers/cus_live"`) ||
		cells(t, doc, "live-charges", "data-order-id")["order-live"]["pi.href"] != "https://dashboard.stripe.com/payments/pi_live" {
		t.Error("live-mode dashboard links")
	}
	if !strings.Contains(page, `<span class="badge live">live</span> Live mode`) {
		t.Error("the live world has no live badge")
	}

	// Linked, never subscribed: a page that says so.
	doc = parse(t, c.html(t, "/admin/ui/customers/user-nosub", http.StatusOK))
	if !strings.Contains(byID(doc, "test-no-subscriptions"), "never subscribed") || !strings.HasPrefix(byID(doc, "test-entitlement"), "Not entitled") {
		t.Errorf("user-nosub: %q / %q", byID(doc, "test-no-subscriptions"), byID(doc, "test-entitlement"))
	}
	c.html(t, "/admin/ui/customers/nobody", http.StatusNotFound)
}

// The customer page's lists page on, each on its own.
func TestCustomerPageLists(t *testing.T) {
	t.Parallel()
	c := newConsole(t)
	c.story(t)
	for i := range customerCharges + 5 {
		c.exec(t, `INSERT INTO charges (order_id, user_id, stripe_customer_id, amount, currency, request_hash, idempotency_key,
			livemode, state, status, answer, created_at)
			VALUES ($1, 'user-1', 'cus_1', 100, 'usd', 'h', 'charge-' || $1, false, 'completed', 'succeeded', '{}', $2)`,
			fmt.Sprintf("o-%02d", i), at(int64(i)))
	}
	doc := parse(t, c.html(t, "/admin/ui/customers/user-1", http.StatusOK))
	first := rowsOf(doc, "test-charges", "data-order-id")
	var older string
	walk(doc, func(n *html.Node) {
		if attr(n, "class") == "older-charges" {
			older = attr(n, "href")
		}
	})
	if len(first) != customerCharges || first[0] != "o-24" || older == "" {
		t.Fatalf("first page: %v, older link %q", first, older)
	}
	u, _ := url.Parse(older)
	doc = parse(t, c.html(t, u.RequestURI(), http.StatusOK))
	if rest := rowsOf(doc, "test-charges", "data-order-id"); !slices.Equal(rest, []string{"o-04", "o-03", "o-02", "o-01", "o-00"}) {
		t.Errorf("second page: %v", rest)
	}
}

// The charges page filters by status, mode and date, searches by order, user or PaymentIntent,
// pages by keyset, and each row leads to its customer.
func TestChargesPage(t *testing.T) {
	t.Parallel()
	c := newConsole(t)
	c.story(t)
	c.money(t)
	for path, want := range map[string][]string{
		"/admin/ui/charges":                               {"order-3", "order-2", "order-1"},
		"/admin/ui/charges?mode=live":                     {"order-live"},
		"/admin/ui/charges?status=succeeded":              {"order-1"},
		"/admin/ui/charges?status=pending":                {"order-3"},
		"/admin/ui/charges?status=declined":               {"order-2"},
		"/admin/ui/charges?q=user-1":                      {"order-3", "order-2", "order-1"},
		"/admin/ui/charges?q=pi_2":                        {"order-2"},
		"/admin/ui/charges?q=order-1":                     {"order-1"},
		"/admin/ui/charges?q=order-live":                  nil, // another mode's
		"/admin/ui/charges?from=2024-06-01&to=2024-06-01": {"order-3", "order-2", "order-1"},
		"/admin/ui/charges?from=2024-06-02":               nil,
	} {
		doc := parse(t, c.html(t, path, http.StatusOK))
		if got := rowsOf(doc, "charges", "data-order-id"); !slices.Equal(got, want) {
			t.Errorf("%s: %v, want %v", path, got, want)
		}
	}
	doc := parse(t, c.html(t, "/admin/ui/charges", http.StatusOK))
	if row := cells(t, doc, "charges", "data-order-id")["order-1"]; row["user.href"] != "/admin/ui/customers/user-1" {
		t.Errorf("row: %v", row)
	}
	if p := byID(parse(t, c.html(t, "/admin/ui/charges?status=bogus&from=x", http.StatusOK)), "problem"); !strings.Contains(p, "Unknown status bogus") || !strings.Contains(p, "From is not a date") {
		t.Errorf("problem: %q", p)
	}

	// Keyset paging over more than a page, both ways.
	for i := range chargesPerPage + 10 {
		c.exec(t, `INSERT INTO charges (order_id, user_id, stripe_customer_id, amount, currency, request_hash, idempotency_key,
			livemode, state, status, answer, created_at)
			VALUES ($1, 'user-x', 'cus_x', 100, 'usd', 'h', 'charge-' || $1, false, 'completed', 'succeeded', '{}', $2)`,
			fmt.Sprintf("p-%03d", i), at(int64(1000+i)))
	}
	seen := map[string]bool{}
	path := "/admin/ui/charges?q=user-x"
	for pages := 0; path != ""; pages++ {
		if pages > 3 {
			t.Fatal("paging does not end")
		}
		doc := parse(t, c.html(t, path, http.StatusOK))
		for _, id := range rowsOf(doc, "charges", "data-order-id") {
			if seen[id] {
				t.Errorf("%s listed twice", id)
			}
			seen[id] = true
		}
		path = ""
		walk(doc, func(n *html.Node) {
			if attr(n, "id") == "older" {
				path = attr(n, "href")
			}
		})
	}
	if len(seen) != chargesPerPage+10 {
		t.Errorf("paged through %d charges, want %d", len(seen), chargesPerPage+10)
	}

	// One charge, with its refund.
	doc = parse(t, c.html(t, "/admin/ui/charges/order-1", http.StatusOK))
	if byID(doc, "charge-amount") != "42.00 USD · refunded 12.00 USD" || !strings.Contains(byID(doc, "refunds"), "re_1") {
		t.Errorf("charge page: %q / %q", byID(doc, "charge-amount"), byID(doc, "refunds"))
	}
	c.html(t, "/admin/ui/charges/order-live", http.StatusNotFound) // the live one is not a test-mode charge
	c.html(t, "/admin/ui/charges/order-live?mode=live", http.StatusOK)
}

// Every admin action lands in the audit log with its actor (the token's name, or its
// fingerprint), target and result, on the page and in GET /admin/audit.
func TestAuditLog(t *testing.T) {
	t.Parallel()
	c := newConsole(t)
	c.story(t)

	// A replay by the named token through the console's form.
	page := c.html(t, "/admin/ui/events/evt_dead", http.StatusOK)
	resp := c.do(t, http.MethodPost, "/admin/ui/events/evt_dead/replay", url.Values{"csrf_token": {csrf(t, page)}}, nil)
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("replay: %d", resp.StatusCode)
	}
	// A refused replay by the unnamed token through the JSON API.
	bearer := func(method, path string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(method, c.server.URL+path, nil)
		req.Header.Set("Authorization", "Bearer "+consoleOtherToken)
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	resp = bearer(http.MethodPost, "/admin/events/evt_created/replay")
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict {
		t.Fatalf("replay of a processed event: %d", resp.StatusCode)
	}
	// Replay all of a type.
	c.deadLetter(t, "evt_waiting", "timeout")
	page = c.html(t, "/admin/ui/dead-letters/replay-type?type=customer.subscription.updated", http.StatusOK)
	cutoff := regexpValue(t, page, "cutoff")
	resp = c.do(t, http.MethodPost, "/admin/ui/dead-letters/replay-type", url.Values{"csrf_token": {csrf(t, page)},
		"type": {"customer.subscription.updated"}, "cutoff": {cutoff}, "confirm": {"yes"}}, nil)
	resp.Body.Close()
	// A reconcile run started through the JSON API.
	resp = bearer(http.MethodPost, "/admin/reconcile?dry_run=true")
	var started struct {
		RunID string `json:"run_id"`
	}
	json.NewDecoder(resp.Body).Decode(&started)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted || started.RunID == "" {
		t.Fatalf("start a run: %d", resp.StatusCode)
	}

	resp = bearer(http.MethodGet, "/admin/audit")
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var got struct {
		Entries []audit.Entry `json:"entries"`
	}
	if err := json.Unmarshal(body, &got); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /admin/audit: %d %s", resp.StatusCode, body)
	}
	fp := auth.Fingerprint(consoleOtherToken)
	want := []string{
		fp + " reconcile_start " + started.RunID + " started (dry run)",
		"alice replay_type evt_waiting replayed with every dead letter of type customer.subscription.updated",
		fp + " replay evt_created refused: the event is processed",
		"alice replay evt_dead replayed: queued again",
	}
	var lines []string
	for _, e := range got.Entries {
		lines = append(lines, e.Actor+" "+e.Action+" "+e.Target+" "+e.Result)
		if e.At.IsZero() || time.Since(e.At) > time.Hour {
			t.Errorf("entry time %v", e.At)
		}
	}
	if !slices.Equal(lines, want) {
		t.Errorf("audit log:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
	if strings.Contains(string(body), consoleOtherToken) || strings.Contains(string(body), consoleAdminToken) {
		t.Error("the audit log holds a token")
	}
	// Paged: two at a time reach all four, newest first.
	var all []string
	before := ""
	for range 3 {
		resp = bearer(http.MethodGet, "/admin/audit?limit=2&before="+before)
		var p audit.Page
		json.NewDecoder(resp.Body).Decode(&p)
		resp.Body.Close()
		for _, e := range p.Entries {
			all = append(all, e.Target)
		}
		if before = p.Next; before == "" {
			break
		}
	}
	if len(all) != 4 || all[0] != started.RunID || all[3] != "evt_dead" {
		t.Errorf("paged targets: %v", all)
	}
	resp = bearer(http.MethodGet, "/admin/audit?limit=0")
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("limit=0: %d", resp.StatusCode)
	}
	// The page, filtered by actor.
	doc := parse(t, c.html(t, "/admin/ui/audit?actor=alice", http.StatusOK))
	if got := rowsOf(doc, "audit", "data-target"); !slices.Equal(got, []string{"evt_waiting", "evt_dead"}) {
		t.Errorf("alice's entries: %v", got)
	}
	if row := cells(t, doc, "audit", "data-target")["evt_dead"]; row["target.href"] != "/admin/ui/events/evt_dead" || row["actor"] != "alice" {
		t.Errorf("row: %v", row)
	}
}

// The reconciliation page lists runs with their counts, shows a run's drift by field, starts a
// run through its form and says so when one is going (409).
func TestReconcilePage(t *testing.T) {
	t.Parallel()
	c := newConsole(t)
	c.story(t)
	c.exec(t, `INSERT INTO reconcile_runs (run_id, livemode, dry_run, trigger, started_at, finished_at, objects, drifted, repaired)
		VALUES ('rr_old', false, false, 'periodic', $1, $2, 10, 2, 2)`, at(100), at(101))
	c.exec(t, `INSERT INTO reconcile_drift (run_id, subscription_id, livemode, field, local, stripe, repaired) VALUES
		('rr_old', 'sub_1', false, 'status', 'trialing', 'active', true),
		('rr_old', 'sub_2', false, 'status', 'active', 'unpaid', true),
		('rr_old', 'sub_2', false, 'price_id', 'price_a', 'price_b', false)`)
	doc := parse(t, c.html(t, "/admin/ui/reconcile", http.StatusOK))
	if row := cells(t, doc, "runs", "data-run-id")["rr_old"]; row["objects"] != "10" || row["drifted"] != "2" || row["run.href"] != "/admin/ui/reconcile/rr_old" {
		t.Errorf("runs: %v", row)
	}
	doc = parse(t, c.html(t, "/admin/ui/reconcile/rr_old", http.StatusOK))
	fields := cells(t, doc, "drift-fields", "data-field")
	if fields["status"]["count"] != "2" || fields["price_id"]["count"] != "1" {
		t.Errorf("drift by field: %v", fields)
	}
	doc = parse(t, c.html(t, "/admin/ui/reconcile/rr_old?field=price_id", http.StatusOK))
	if got := rowsOf(doc, "drift", "data-subscription-id"); !slices.Equal(got, []string{"sub_2"}) {
		t.Errorf("price_id drift: %v", got)
	}

	// Start one through the form while the account's first page is held: a second start is
	// refused with 409, said on the page.
	_, release := c.acct.HoldNextPage()
	defer release()
	page := c.html(t, "/admin/ui/reconcile", http.StatusOK)
	resp := c.do(t, http.MethodPost, "/admin/ui/reconcile", url.Values{"csrf_token": {csrf(t, page)}}, nil)
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/admin/ui/reconcile?started=rr_") {
		t.Fatalf("start: %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	resp = c.do(t, http.MethodPost, "/admin/ui/reconcile", url.Values{"csrf_token": {csrf(t, page)}}, nil)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict || !strings.Contains(byID(parse(t, string(b)), "problem"), "A run is going") {
		t.Errorf("second start: %d %s", resp.StatusCode, byID(parse(t, string(b)), "problem"))
	}
	resp = c.do(t, http.MethodPost, "/admin/ui/reconcile", url.Values{}, nil)
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("start without the CSRF token: %d", resp.StatusCode)
	}
	release()
	var results []string
	if err := c.db.Raw(`SELECT result FROM admin_audit WHERE action = 'reconcile_start' AND livemode = false ORDER BY id`).Scan(&results).Error; err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(results, []string{"started", "refused: a run is going"}) {
		t.Errorf("audit of the starts: %v", results)
	}
}

// "Latest failed invoice" only while the payment hold holds; counts are pluralised; the
// overview counts holds by subscription status apart from hold reasons.
func TestConsoleWording(t *testing.T) {
	t.Parallel()
	c := newConsole(t)
	c.story(t)
	page := c.html(t, "/admin", http.StatusOK)
	statuses, reasons := map[string]string{}, map[string]string{}
	walk(parse(t, page), func(n *html.Node) {
		switch {
		case attr(n, "class") == "status-count":
			statuses[attr(n, "data-status")] = text(n)
		case attr(n, "class") == "hold-count":
			reasons[attr(n, "data-reason")] = text(n)
		}
	})
	if statuses["past_due"] != "0" || statuses["unpaid"] != "1" || reasons["payment_failed"] != "1" || reasons["unpaid"] != "1" ||
		!strings.Contains(page, "by subscription status") || !strings.Contains(page, "by hold reason") {
		t.Errorf("overview counts: statuses %v, reasons %v", statuses, reasons)
	}

	page = c.html(t, "/admin/ui/subscriptions/sub_1", http.StatusOK)
	if got := byID(parse(t, page), "latest-invoice"); !strings.Contains(page, "Latest failed invoice") || !strings.Contains(got, "2 attempts") {
		t.Errorf("held: %q", got)
	}
	c.exec(t, `UPDATE subscriptions SET attempt_count = 1 WHERE subscription_id = 'sub_1' AND livemode = false`)
	if got := byID(parse(t, c.html(t, "/admin/ui/subscriptions/sub_1", http.StatusOK)), "latest-invoice"); !strings.Contains(got, "1 attempt ·") {
		t.Errorf("one attempt: %q", got)
	}
	c.exec(t, `UPDATE subscriptions SET payment_hold = false WHERE subscription_id = 'sub_1' AND livemode = false`)
	page = c.html(t, "/admin/ui/subscriptions/sub_1", http.StatusOK)
	if got := byID(parse(t, page), "latest-invoice"); strings.Contains(page, "Latest failed invoice") || got != "in_1 paid after 1 attempt" {
		t.Errorf("paid: %q", got)
	}

}

// The dead-letter page pages instead of stopping at a fixed number.
func TestDeadLettersPage(t *testing.T) {
	t.Parallel()
	c := newConsole(t)
	for i := range deadLettersShown + 3 {
		id := fmt.Sprintf("evt_dl_%03d", i)
		c.exec(t, `INSERT INTO webhook_events (event_id, source, type, livemode, status, payload, attempts, failure_reason)
			VALUES ($1, 'stripe', 'customer.subscription.updated', false, 'failed', '{}', 3, 'handler_error')`, id)
		c.exec(t, `INSERT INTO webhook_dead_letters (event_id, livemode, attempts, last_error, dead_at) VALUES ($1, false, 3, 'x', $2)`, id, at(int64(i)))
	}
	doc := parse(t, c.html(t, "/admin/ui/dead-letters", http.StatusOK))
	first := rowsOf(doc, "dead-letters", "data-event-id")
	var older string
	walk(doc, func(n *html.Node) {
		if attr(n, "id") == "older" {
			older = attr(n, "href")
		}
	})
	if len(first) != deadLettersShown || older == "" {
		t.Fatalf("first page: %d rows, older %q", len(first), older)
	}
	rest := rowsOf(parse(t, c.html(t, older, http.StatusOK)), "dead-letters", "data-event-id")
	if !slices.Equal(rest, []string{"evt_dl_002", "evt_dl_001", "evt_dl_000"}) {
		t.Errorf("second page: %v", rest)
	}
}

// The customer page sums usage per meter over the entitled subscription's current period, in
// each mode's world apart: records outside the period, and the other mode's, are not counted.
func TestCustomerPageUsage(t *testing.T) {
	t.Parallel()
	c := newConsole(t)
	c.story(t)
	c.money(t)
	record := func(live bool, usageID, meter string, value int64, when time.Time, status string) {
		t.Helper()
		cus := "cus_1"
		if live {
			cus = "cus_1live"
		}
		c.exec(t, `INSERT INTO usage_records (livemode, user_id, usage_id, meter, value, occurred_at, stripe_customer_id,
			identifier, status, next_attempt_at, created_at, updated_at)
			VALUES ($1, 'user-1', $2, $3, $4, $5, $6, $7, $8, now(), now(), now())`,
			live, usageID, meter, value, when, cus, "usage-user-1-"+usageID, status)
	}
	// sub_1's current period is [at(0), at(30 days)).
	record(false, "u1", "api_calls", 5, at(10), "pending")
	record(false, "u2", "api_calls", 7, at(20), "reported")
	record(false, "u3", "api_calls", 2, at(30), "needs_review")
	record(false, "u4", "api_calls", 100, at(40), "refused")
	record(false, "u5", "api_calls", 1000, at(-10), "reported")
	record(false, "u6", "api_calls", 2000, at(30*86400), "pending")
	record(false, "u7", "storage", 3, at(50), "reported")
	record(true, "u8", "api_calls", 50, at(60), "reported")

	doc := parse(t, c.html(t, "/admin/ui/customers/user-1", http.StatusOK))
	test := cells(t, doc, "test-usage", "data-meter")
	want := map[string]string{"total": "14", "pending": "7", "review": "2", "review.href": "/admin/usage/review", "refused": "100", "records": "4"}
	for k, v := range want {
		if test["api_calls"][k] != v {
			t.Errorf("test api_calls %s = %q, want %q (row %v)", k, test["api_calls"][k], v, test["api_calls"])
		}
	}
	if test["storage"]["total"] != "3" || test["storage"]["pending"] != "0" || len(test) != 2 {
		t.Errorf("test usage rows: %v", test)
	}
	// The live world has no subscription, hence no period: every live record, and only those.
	live := cells(t, doc, "live-usage", "data-meter")
	if live["api_calls"]["total"] != "50" || len(live) != 1 {
		t.Errorf("live usage rows: %v", live)
	}
	// A user without usage has no table.
	if rows := cells(t, parse(t, c.html(t, "/admin/ui/customers/user-nosub", http.StatusOK)), "test-usage", "data-meter"); rows != nil {
		t.Errorf("user-nosub usage: %v", rows)
	}
}
