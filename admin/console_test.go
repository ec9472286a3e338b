package admin

import (
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"

	"golang.org/x/net/html"

	"billing/billing"
	"billing/internal/stripeevents"
)

func parse(t *testing.T, page string) *html.Node {
	t.Helper()
	doc, err := html.Parse(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	return doc
}

// byID is the text of the element with the id, "" when there is none.
func byID(doc *html.Node, id string) string {
	var out string
	walk(doc, func(n *html.Node) {
		if n.Type == html.ElementNode && attr(n, "id") == id {
			out = text(n)
		}
	})
	return out
}

// rowsOf is the row keys (data attribute rowAttr) of the table with the id, in order.
func rowsOf(doc *html.Node, tableID, rowAttr string) []string {
	var out []string
	walk(doc, func(n *html.Node) {
		if n.Type == html.ElementNode && n.Data == "table" && attr(n, "id") == tableID {
			walk(n, func(m *html.Node) {
				if m.Type == html.ElementNode && m.Data == "tr" && attr(m, rowAttr) != "" {
					out = append(out, attr(m, rowAttr))
				}
			})
		}
	})
	return out
}

func TestConsolePagesShowWhatHappened(t *testing.T) {
	t.Parallel()
	c := newConsole(t)
	c.story(t)

	// Overview: counts, and the links that lead on.
	page := c.html(t, "/admin", http.StatusOK)
	doc := parse(t, page)
	for id, want := range map[string]string{
		"count-holds": "2", "count-dead-letters": "1", "count-waiting": "1", "stripe-mode": "TEST MODE", "mode": "test",
	} {
		if got := byID(doc, id); got != want {
			t.Errorf("overview #%s = %q, want %q", id, got, want)
		}
	}
	if !strings.HasPrefix(byID(doc, "oldest-waiting"), "oldest received ") || !strings.HasPrefix(byID(doc, "lag-detail"), "median of 5 events") {
		t.Errorf("backlog: %q / %q", byID(doc, "oldest-waiting"), byID(doc, "lag-detail"))
	}
	// What Stripe sent (and what failed on it) is text, never markup.
	if strings.Contains(page, "<script>alert") || !strings.Contains(page, "boom &lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;") {
		t.Error("the dead letter's error is not escaped on the overview")
	}
	h := cells(t, doc, "holds", "data-subscription-id")
	if h["sub_1"]["subscription.href"] != "/admin/ui/subscriptions/sub_1" || h["sub_1"]["stripe.href"] != "https://dashboard.stripe.com/test/subscriptions/sub_1" ||
		h["sub_1"]["invoice.href"] != "https://invoice.stripe.com/i/in_1" || h["sub_1"]["amount"] != "25.00 USD" || h["sub_2"]["user"] != "not linked" {
		t.Errorf("overview holds: %v", h)
	}

	// Holds: filters and search.
	for query, want := range map[string]string{
		"reason=unpaid": "sub_2", "q=user-1": "sub_1", "q=cus_2": "sub_2", "status=active&reason=payment_failed": "sub_1",
		"mode=live": "", "q=sub_": "sub_2,sub_1",
	} {
		doc := parse(t, c.html(t, "/admin/ui/holds?"+query, http.StatusOK))
		if got := strings.Join(rowsOf(doc, "holds", "data-subscription-id"), ","); got != want {
			t.Errorf("holds?%s: %q, want %q", query, got, want)
		}
	}

	// Event log: search by the object an event names, filters.
	for query, want := range map[string]string{
		"q=sub_1":                       "evt_late,evt_failed,evt_created",
		"q=in_1":                        "evt_failed",
		"status=failed":                 "evt_dead",
		"mode=live":                     "evt_live",
		"type=invoice.payment_failed":   "evt_failed",
		"q=evt_unpaid":                  "evt_unpaid",
		"from=2000-01-01&to=2000-01-02": "",
	} {
		doc := parse(t, c.html(t, "/admin/ui/events?"+query, http.StatusOK))
		if got := strings.Join(rowsOf(doc, "events", "data-event-id"), ","); got != want {
			t.Errorf("events?%s: %q, want %q", query, got, want)
		}
	}
	if doc := parse(t, c.html(t, "/admin/ui/events?from=yesterday", http.StatusOK)); !strings.Contains(byID(doc, "problem"), "From is not a date") {
		t.Error("a bad date is not reported")
	}

	// Event detail: the envelope, the payload (escaped), the replay of a failed event.
	page = c.html(t, "/admin/ui/events/evt_dead", http.StatusOK)
	doc = parse(t, page)
	if byID(doc, "event-status") != "failed" || !strings.Contains(byID(doc, "dead-letter"), `boom <script>alert("x")</script>`) ||
		!strings.Contains(byID(doc, "payload"), `"id": "sub_<b>3</b>"`) || strings.Contains(page, "<b>3</b>") {
		t.Errorf("event detail: status %q, dead letter %q", byID(doc, "event-status"), byID(doc, "dead-letter"))
	}
	if !strings.Contains(page, `action="/admin/ui/events/evt_dead/replay"`) || !strings.Contains(page, `href="https://dashboard.stripe.com/test/events/evt_dead"`) {
		t.Error("event detail: no replay form or dashboard link")
	}
	if page := c.html(t, "/admin/ui/events/evt_live", http.StatusOK); !strings.Contains(page, `href="https://dashboard.stripe.com/events/evt_live"`) ||
		strings.Contains(page, "replay-form") {
		t.Error("live event: dashboard link or replay form wrong")
	}
	c.html(t, "/admin/ui/events/evt_none", http.StatusNotFound)

	// Subscription: state, why, the timeline with the skipped event, notices, invoices.
	doc = parse(t, c.html(t, "/admin/ui/subscriptions/sub_1", http.StatusOK))
	if byID(doc, "entitlement") != "Entitled: the subscription is active." || !strings.HasPrefix(byID(doc, "hold"), "On hold (payment_failed)") ||
		byID(doc, "sub-user") != "user-1" || !strings.HasPrefix(byID(doc, "sub-event"), "evt_created") {
		t.Errorf("subscription: %q / %q / %q", byID(doc, "entitlement"), byID(doc, "hold"), byID(doc, "sub-event"))
	}
	tl := cells(t, doc, "timeline", "data-event-id")
	if !strings.Contains(tl["evt_late"]["effect"], "Skipped: older than the subscription state") ||
		!strings.Contains(tl["evt_created"]["effect"], "set the current subscription state") ||
		!strings.Contains(tl["evt_failed"]["effect"], "set the current payment state") {
		t.Errorf("timeline: %v", tl)
	}
	if got := rowsOf(doc, "timeline", "data-event-id"); strings.Join(got, ",") != "evt_late,evt_created,evt_failed" {
		t.Errorf("timeline order %v", got)
	}
	if !strings.Contains(byID(doc, "notices"), "payment_failed") || !strings.Contains(byID(doc, "invoices"), "in_0INV-0001paid") {
		t.Errorf("notices %q, invoices %q", byID(doc, "notices"), byID(doc, "invoices"))
	}
	doc = parse(t, c.html(t, "/admin/ui/subscriptions/sub_2", http.StatusOK))
	if !strings.HasPrefix(byID(doc, "entitlement"), "Not entitled: Stripe stopped retrying") {
		t.Errorf("sub_2: %q", byID(doc, "entitlement"))
	}
	c.html(t, "/admin/ui/subscriptions/sub_none", http.StatusNotFound)
	c.html(t, "/admin/ui/subscriptions/"+url.PathEscape("sub_<b>3</b>"), http.StatusNotFound)
}

// From any id, email, name or order id, one request leads to its page; several matches make a
// list.
func TestFindLeadsToThePage(t *testing.T) {
	t.Parallel()
	c := newConsole(t)
	c.story(t)
	c.money(t)
	for q, want := range map[string]string{
		"user-1": "/admin/ui/customers/user-1", "cus_1": "/admin/ui/customers/user-1",
		"u1@EXAMPLE": "/admin/ui/customers/user-1", "ursula": "/admin/ui/customers/user-1", "Ursula On": "/admin/ui/customers/user-1",
		"user-nosub": "/admin/ui/customers/user-nosub",
		"carol@":     "/admin/ui/customers/user-carol",
		"user-live":  "/admin/ui/customers/user-live",
		"order-1":    "/admin/ui/charges/order-1?mode=test", "pi_2": "/admin/ui/charges/order-2?mode=test",
		"refund-a": "/admin/ui/charges/order-1?mode=test", "re_1": "/admin/ui/charges/order-1?mode=test",
		"order-live": "/admin/ui/charges/order-live?mode=live",
		"sub_2":      "/admin/ui/subscriptions/sub_2", "cus_2": "/admin/ui/subscriptions/sub_2",
		"sub_1":    "/admin/ui/subscriptions/sub_1",
		"evt_dead": "/admin/ui/events/evt_dead",
	} {
		resp := c.do(t, http.MethodGet, "/admin/ui/find?q="+url.QueryEscape(q), nil, nil)
		resp.Body.Close()
		if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != want {
			t.Errorf("find %s: %d → %q, want %s", q, resp.StatusCode, resp.Header.Get("Location"), want)
		}
	}
	// A prefix that two people share lists both, by email; a prefix inside a word matches nothing.
	doc := parse(t, c.html(t, "/admin/ui/find?q=CAROL", http.StatusOK))
	if got := rowsOf(doc, "found-people", "data-user-id"); !slices.Equal(got, []string{"user-carol", "user-caroline"}) {
		t.Errorf("find CAROL: %v", got)
	}
	// LIKE's wildcards are plain characters here.
	for _, q := range []string{"zed", "arol", "%", "_"} {
		if doc := parse(t, c.html(t, "/admin/ui/find?q="+url.QueryEscape(q), http.StatusOK)); !strings.Contains(byID(doc, "nothing-found"), q) {
			t.Errorf("find %q: nothing found is not said", q)
		}
	}
}

// Every replay form carries the page's CSRF token, and a post without it changes nothing.
func TestConsoleReplaysNeedTheCSRFToken(t *testing.T) {
	t.Parallel()
	c := newConsole(t)
	c.story(t)
	token := csrf(t, c.html(t, "/admin/ui/events/evt_dead", http.StatusOK))

	for _, tc := range []struct {
		path string
		form url.Values
	}{
		{"/admin/ui/events/evt_dead/replay", url.Values{}},
		{"/admin/ui/dead-letters/replay", url.Values{"event_id": {"evt_dead"}}},
		{"/admin/ui/dead-letters/replay-type", url.Values{"type": {"customer.subscription.updated"}, "cutoff": {"2100-01-01T00:00:00Z"}, "confirm": {"yes"}}},
		{"/admin/ui/events/evt_dead/replay", url.Values{"csrf_token": {token + "0"}}},
	} {
		resp := c.do(t, http.MethodPost, tc.path, tc.form, nil)
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("POST %s without a valid token: %d, want 403", tc.path, resp.StatusCode)
		}
	}
	if s := c.status(t, "evt_dead"); s != "failed" {
		t.Fatalf("evt_dead is %s after refused posts", s)
	}

	resp := c.do(t, http.MethodPost, "/admin/ui/events/evt_dead/replay", url.Values{"csrf_token": {token}}, nil)
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/admin/ui/events/evt_dead?replayed=1" {
		t.Fatalf("replay: %d → %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	if s := c.status(t, "evt_dead"); s != "received" {
		t.Errorf("evt_dead is %s after the replay, want received", s)
	}
	doc := parse(t, c.html(t, "/admin/ui/events/evt_dead?replayed=1", http.StatusOK))
	if byID(doc, "event-status") != "received" || !strings.Contains(byID(doc, "flash"), "queued again") {
		t.Errorf("after replay: %q %q", byID(doc, "event-status"), byID(doc, "flash"))
	}
	// A second replay is refused: the event is no longer failed.
	resp = c.do(t, http.MethodPost, "/admin/ui/events/evt_dead/replay", url.Values{"csrf_token": {token}}, nil)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict || !strings.Contains(string(b), "only a failed event can be replayed") {
		t.Errorf("second replay: %d %s", resp.StatusCode, b)
	}
}

// Replaying all dead letters of a type goes through a confirmation that bounds it to the dead
// letters shown.
func TestReplayAllOfATypeAfterConfirmation(t *testing.T) {
	t.Parallel()
	c := newConsole(t)
	c.story(t)
	c.deadLetter(t, "evt_waiting", "boom again")
	page := c.html(t, "/admin/ui/dead-letters/replay-type?type=customer.subscription.updated", http.StatusOK)
	doc := parse(t, page)
	if !strings.HasPrefix(byID(doc, "confirm-text"), "Replay 2 dead-lettered events of type customer.subscription.updated?") ||
		strings.Join(rowsOf(doc, "confirm-sample", "data-event-id"), ",") != "evt_waiting,evt_dead" {
		t.Fatalf("confirmation: %q %v", byID(doc, "confirm-text"), rowsOf(doc, "confirm-sample", "data-event-id"))
	}
	cutoff := regexpValue(t, page, "cutoff")
	// Dead-lettered after the confirmation was shown: not part of it.
	c.deliver(t, stripeevents.SubscriptionEvent("evt_after", billing.EventSubscriptionUpdated, at(9), false,
		stripeevents.Subscription{ID: "sub_5", Customer: "cus_5", Status: billing.StatusActive}))
	c.deadLetter(t, "evt_after", "later")

	resp := c.do(t, http.MethodPost, "/admin/ui/dead-letters/replay-type", url.Values{
		"csrf_token": {csrf(t, page)}, "type": {"customer.subscription.updated"}, "cutoff": {cutoff}, "confirm": {"yes"}}, nil)
	resp.Body.Close()
	loc := resp.Header.Get("Location")
	if resp.StatusCode != http.StatusSeeOther || !strings.Contains(loc, "n=2") || !strings.Contains(loc, "left=0") {
		t.Fatalf("replay all: %d → %q", resp.StatusCode, loc)
	}
	for id, want := range map[string]string{"evt_dead": "received", "evt_waiting": "received", "evt_after": "failed"} {
		if s := c.status(t, id); s != want {
			t.Errorf("%s is %s, want %s", id, s, want)
		}
	}
	doc = parse(t, c.html(t, loc, http.StatusOK))
	if !strings.Contains(byID(doc, "flash"), "Replayed 2 dead letters of type customer.subscription.updated") ||
		strings.Join(rowsOf(doc, "dead-letters", "data-event-id"), ",") != "evt_after" {
		t.Errorf("after: %q %v", byID(doc, "flash"), rowsOf(doc, "dead-letters", "data-event-id"))
	}
}

func regexpValue(t *testing.T, page, name string) string {
	t.Helper()
	i := strings.Index(page, `name="`+name+`" value="`)
	if i < 0 {
		t.Fatalf("no field %s", name)
	}
	rest := page[i+len(`name="`+name+`" value="`):]
	return html.UnescapeString(rest[:strings.IndexByte(rest, '"')])
}

func TestOverviewShowsTheLastReconcileRun(t *testing.T) {
	t.Parallel()
	c := newConsole(t)
	// This test's own tables, whatever the migrations create: the shape the reconcile package
	// writes, one run with drift.
	c.exec(t, `DROP TABLE IF EXISTS reconcile_drift, reconcile_runs CASCADE`)
	c.exec(t, `CREATE TABLE reconcile_runs (run_id text PRIMARY KEY, livemode boolean NOT NULL, dry_run boolean NOT NULL,
		trigger text NOT NULL, started_at timestamptz NOT NULL, finished_at timestamptz, objects integer NOT NULL DEFAULT 0,
		drifted integer NOT NULL DEFAULT 0, repaired integer NOT NULL DEFAULT 0, missing_at_stripe integer NOT NULL DEFAULT 0,
		errors integer NOT NULL DEFAULT 0, error text)`)
	c.exec(t, `CREATE TABLE reconcile_drift (id bigserial PRIMARY KEY, run_id text NOT NULL, subscription_id text NOT NULL,
		livemode boolean NOT NULL, field text NOT NULL, local text NOT NULL DEFAULT '', stripe text NOT NULL DEFAULT '',
		repaired boolean NOT NULL DEFAULT false, reason text)`)
	c.exec(t, `INSERT INTO reconcile_runs VALUES
		('run_old', false, false, 'periodic', '2024-06-01T00:00:00Z', '2024-06-01T00:01:00Z', 10, 0, 0, 0, 0, NULL),
		('run_live', true, false, 'periodic', '2024-06-03T00:00:00Z', '2024-06-03T00:01:00Z', 5, 1, 1, 0, 0, NULL),
		('run_new', false, true, 'command', '2024-06-02T00:00:00Z', '2024-06-02T00:01:00Z', 12, 2, 0, 1, 0, NULL)`)
	c.exec(t, `INSERT INTO reconcile_drift (run_id, subscription_id, livemode, field, local, stripe, repaired, reason) VALUES
		('run_new', 'sub_9', false, 'status', 'active', 'past_due', false, 'dry run'),
		('run_new', 'sub_8', false, 'current_period_end', '', '2024-07-01', false, 'dry run')`)
	doc := parse(t, c.html(t, "/admin", http.StatusOK))
	if got := byID(doc, "reconcile-drifted"); got != "2 drifted" {
		t.Errorf("last run of test mode: %q, want 2 drifted (run_new)", got)
	}
	if !strings.Contains(byID(doc, "reconcile"), "(dry run)") || !strings.Contains(byID(doc, "reconcile"), "1 missing at Stripe") {
		t.Errorf("run summary %q", byID(doc, "reconcile"))
	}
	if d := byID(doc, "reconcile-drift"); !strings.Contains(d, "sub_9statusactivepast_due") || !strings.Contains(d, "sub_8") {
		t.Errorf("drift %q", d)
	}

	// Without the tables the overview says so and still renders.
	c.exec(t, `DROP TABLE reconcile_drift, reconcile_runs`)
	if got := byID(parse(t, c.html(t, "/admin", http.StatusOK)), "reconcile-unavailable"); got != "reconcile not available" {
		t.Errorf("without tables: %q", got)
	}
}

// The subscription page shows the seats and the customer's features, and says when the policy
// withholds them (sub_1 is on hold).
func TestSubscriptionPageShowsSeatsAndFeatures(t *testing.T) {
	t.Parallel()
	c := newConsole(t)
	c.exec(t, `INSERT INTO customers (user_id, stripe_customer_id, email) VALUES ('user-1', 'cus_1', 'u1@example.com')`)
	sub := stripeevents.Subscription{ID: "sub_1", Customer: "cus_1", Status: billing.StatusActive, PriceID: "price_pro",
		CurrentPeriodStart: at(0), CurrentPeriodEnd: at(30 * 86400), Quantity: 3}
	inv := stripeevents.Invoice{ID: "in_1", Customer: "cus_1", Subscription: "sub_1", Status: "open", Currency: "usd",
		AmountDue: 2500, AttemptCount: 1}
	c.deliver(t, stripeevents.SubscriptionEvent("evt_created", billing.EventSubscriptionCreated, at(1), false, sub),
		stripeevents.InvoiceEvent("evt_failed", billing.EventInvoicePaymentFailed, at(86400), false, inv))
	c.process(t, "evt_created", "evt_failed")
	doc := parse(t, c.html(t, "/admin/ui/subscriptions/sub_1", http.StatusOK))
	if got := byID(doc, "sub-seats"); got != "3" {
		t.Errorf("seats %q, want 3", got)
	}
	if got := strings.TrimSpace(byID(doc, "sub-features")); got != "none" {
		t.Errorf("features before any summary: %q", got)
	}
	c.deliver(t, stripeevents.EntitlementSummaryEvent("evt_features", at(86400*2), false,
		stripeevents.EntitlementSummary{Customer: "cus_1", LookupKeys: []string{"sso", "<b>api</b>"}}))
	c.process(t, "evt_features")
	page := c.html(t, "/admin/ui/subscriptions/sub_1", http.StatusOK)
	doc = parse(t, page)
	if got := byID(doc, "sub-features"); !strings.Contains(got, "<b>api</b> sso") || !strings.Contains(got, "evt_features") {
		t.Errorf("features %q, want both keys, sorted, and the event that set them", got)
	}
	if strings.Contains(page, "<b>api</b>") {
		t.Error("a lookup key is markup on the page")
	}
	if !strings.Contains(byID(doc, "features-withheld"), "on hold") {
		t.Errorf("withheld: %q", byID(doc, "features-withheld"))
	}
	// The customer page: the entitlement's seats, and the features Stripe grants but the policy
	// withholds.
	grants := byID(parse(t, c.html(t, "/admin/ui/customers/user-1", http.StatusOK)), "test-grants")
	if !strings.Contains(grants, "Seats3") || !strings.Contains(grants, "Stripe grants 2; withheld") {
		t.Errorf("customer page grants %q", grants)
	}
}
