package admin

import (
	"context"
	"encoding/base64"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
)

// A real browser catches what httptest cannot: a form that does not post what the handler reads,
// a link that leads nowhere, Basic credentials and the CSRF check as a browser meets them, markup
// that hides what it should show.

// chromium finds the browser. CI installs it (.ci/run), so there a missing browser fails the test;
// elsewhere the test says how to install it and skips.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("chromium is not installed; .ci/run installs it (apt-get install chromium)")
	}
	t.Skip("chromium is not installed: apt-get install chromium to run the browser test")
	return ""
}

// browser starts a headless Chromium with a new empty profile. The flags keep it off the network
// (the machine has none, and a browser left to itself calls home, updates components and syncs).
func browser(t *testing.T) context.Context {
	t.Helper()
	path := chromium(t)
	profile := t.TempDir()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.UserDataDir(profile),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.WindowSize(1400, 1000),
	}
	// Bounds a failing run; a passing one takes seconds.
	ctx, cancelTimeout := context.WithTimeout(context.Background(), 3*time.Minute)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	bctx, cancelBrowser := chromedp.NewContext(allocCtx)
	t.Cleanup(func() {
		cancelBrowser()
		cancelAlloc() // waits for the browser to exit, before the profile is removed
		cancelTimeout()
	})
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("start chromium (%s): %v", path, err)
	}
	return bctx
}

// shot saves a screenshot of the page into docs/admin when ADMIN_SCREENSHOTS=1, so that a plain
// test run leaves the repository as it was.
func shot(name string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		if os.Getenv("ADMIN_SCREENSHOTS") != "1" {
			return nil
		}
		png, err := chromedp.FullScreenshot(100)(ctx, t)
		if err != nil {
			return err
		}
		dir := filepath.Join("..", "docs", "admin")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644)
	})
}

// TestConsoleInABrowser drives every page as an admin would: logs in with the admin token as the
// Basic password, follows the navigation and the links between ids, filters and searches, and
// replays dead letters through the forms (CSRF token included), finds a user by email, opens
// their customer page, follows a charge, starts a reconcile run and sees it in the audit log,
// reading what the page shows.
func TestConsoleInABrowser(t *testing.T) {
	t.Parallel()
	c := newConsole(t)
	c.story(t)
	c.money(t)
	c.deadLetter(t, "evt_waiting", "connection reset by peer")
	ctx := browser(t)
	base := c.server.URL

	// What the person reads in an element (whitespace collapsed).
	read := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("read %s: %v", sel, err)
		}
		return strings.Join(strings.Fields(s), " ")
	}
	run := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		start := time.Now()
		defer func() { t.Logf("%s: %v", what, time.Since(start)) }()
		if err := chromedp.Do(ctx, actions...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	location := func() string {
		t.Helper()
		u, err := chromedp.Run(ctx, chromedp.Location())
		if err != nil {
			t.Fatalf("read the location: %v", err)
		}
		return strings.TrimPrefix(u, base)
	}
	expect := func(sel, want string) {
		t.Helper()
		if got := read(sel); !strings.Contains(got, want) {
			t.Errorf("%s on %s: %q, want it to contain %q", sel, location(), got, want)
		}
	}

	// Without credentials the console answers 401 with a Basic challenge, which a headless
	// browser (no one to type a password) reports as a failed load; either way nothing shows.
	if err := chromedp.Do(ctx, chromedp.Navigate(base+"/admin")); err == nil {
		if body := read("body"); strings.Contains(body, "Customers on hold") {
			t.Fatalf("the console shows without credentials: %q", body)
		}
	} else if !strings.Contains(err.Error(), "ERR_INVALID_AUTH_CREDENTIALS") {
		t.Fatalf("open without credentials: %v", err)
	}

	// Log in: the admin token as the Basic password, on every request of the page.
	basic := base64.StdEncoding.EncodeToString([]byte("admin:" + consoleAdminToken))
	run("log in",
		chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
			if _, err := cdp.Call(ctx, t, network.Enable, network.EnableParams{}); err != nil {
				return err
			}
			_, err := cdp.Call(ctx, t, network.SetExtraHTTPHeaders,
				network.SetExtraHTTPHeadersParams{Headers: network.Headers{"Authorization": "Basic " + basic}})
			return err
		}),
		chromedp.Navigate(base+"/admin"),
		chromedp.WaitVisible(chromedp.CSS("#summary")))

	// Overview.
	expect("#count-holds", "2")
	expect("#count-dead-letters", "2")
	expect("#stripe-mode", "TEST MODE")
	expect("#holds", "user-1")
	expect("#holds", "25.00 USD")
	expect("#dead-letters", `boom <script>alert("x")</script>`) // shown as text, not run
	run("overview screenshot", shot("overview"))

	// Holds: follow the navigation, filter by reason.
	run("open holds", chromedp.Click(chromedp.CSS(`header nav a[href="/admin/ui/holds"]`)), chromedp.WaitVisible(chromedp.CSS("#holds-filter")))
	expect("#holds-count", "2 of 2 holds")
	run("holds screenshot", shot("holds"))
	run("filter holds by reason",
		chromedp.SetValue(chromedp.CSS(`#holds-filter select[name="reason"]`), "unpaid"),
		chromedp.Click(chromedp.CSS(`#holds-filter button[type="submit"]`)),
		// Only the filtered page has the option selected in its markup.
		chromedp.WaitReady(chromedp.CSS(`#holds-filter option[value="unpaid"][selected]`)))
	expect("#holds-count", "1 of 2 holds")
	if rows := read("#holds tbody"); strings.Contains(rows, "sub_1") {
		t.Errorf("filtered holds still list sub_1: %q", rows)
	}
	run("search holds by user",
		chromedp.Navigate(base+"/admin/ui/holds"),
		chromedp.WaitVisible(chromedp.CSS("#holds-filter")),
		chromedp.SendKeys(chromedp.CSS(`#holds-filter input[name="q"]`), "user-1"),
		chromedp.Submit(chromedp.CSS(`#holds-filter input[name="q"]`)),
		chromedp.WaitReady(chromedp.CSS(`#holds-filter input[name="q"][value="user-1"]`)))
	expect("#holds-count", "1 of 2 holds")

	// One click from the subscription id to its page: state, reason, timeline.
	run("open sub_1",
		chromedp.Click(chromedp.CSS(`#holds tr[data-subscription-id="sub_1"] td.subscription a`)),
		chromedp.WaitVisible(chromedp.CSS("#entitlement")))
	if loc := location(); loc != "/admin/ui/subscriptions/sub_1" {
		t.Errorf("subscription link led to %s", loc)
	}
	expect("#entitlement", "Entitled: the subscription is active.")
	expect("#hold", "On hold (payment_failed)")
	expect(`#timeline tr[data-event-id="evt_late"]`, "Skipped: older than the subscription state already stored")
	expect(`#timeline tr[data-event-id="evt_created"]`, "Applied: it set the current subscription state.")
	expect("#notices", "payment_failed")
	expect("#invoices", "INV-0001")
	run("subscription screenshot", shot("subscription"))

	// From the timeline to the event.
	run("open evt_late",
		chromedp.Click(chromedp.CSS(`#timeline tr[data-event-id="evt_late"] td.event a`)),
		chromedp.WaitVisible(chromedp.CSS("#envelope")))
	expect("#event-id", "evt_late")
	expect("#event-status", "processed")
	expect("#payload", `"status": "trialing"`)

	// Event log: search by the subscription an invoice names, then filter by status.
	run("search the event log",
		chromedp.Click(chromedp.CSS(`header nav a[href="/admin/ui/events"]`)),
		chromedp.WaitVisible(chromedp.CSS("#events-filter")),
		chromedp.SendKeys(chromedp.CSS(`#events-filter input[name="q"]`), "sub_1"),
		chromedp.Submit(chromedp.CSS(`#events-filter input[name="q"]`)),
		chromedp.WaitReady(chromedp.CSS(`#events-filter input[name="q"][value="sub_1"]`)))
	if rows := read("#events tbody"); !strings.Contains(rows, "evt_created") || !strings.Contains(rows, "evt_late") || strings.Contains(rows, "evt_unpaid") {
		t.Errorf("events naming sub_1: %q", rows)
	}
	run("event log screenshot", chromedp.Navigate(base+"/admin/ui/events"), chromedp.WaitVisible(chromedp.CSS("#events")), shot("events"))
	run("filter the event log by status",
		chromedp.SetValue(chromedp.CSS(`#events-filter select[name="status"]`), "failed"),
		chromedp.Click(chromedp.CSS(`#events-filter button[type="submit"]`)),
		chromedp.WaitReady(chromedp.CSS(`#events-filter option[value="failed"][selected]`)))
	if rows := read("#events tbody"); strings.Contains(rows, "evt_created") {
		t.Errorf("failed events list a processed one: %q", rows)
	}

	// Event detail of a dead letter, and its replay through the form.
	run("open evt_dead",
		chromedp.Click(chromedp.CSS(`#events tr[data-event-id="evt_dead"] td.event a`)),
		chromedp.WaitVisible(chromedp.CSS("#replay-form")))
	expect("#failure-reason", "handler_error")
	expect("#dead-letter", `boom <script>alert("x")</script>`)
	run("event screenshot", shot("event"))
	run("replay evt_dead",
		chromedp.Click(chromedp.CSS(`#replay-form button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS("#flash")))
	expect("#flash", "queued again")
	expect("#event-status", "received")
	if s := c.status(t, "evt_dead"); s != "received" {
		t.Errorf("evt_dead is %s after the replay, want received", s)
	}

	// Dead letters: the one left, replayed as "all of its type" after the confirmation.
	run("open dead letters",
		chromedp.Click(chromedp.CSS(`header nav a[href="/admin/ui/dead-letters"]`)),
		chromedp.WaitVisible(chromedp.CSS("#dead-letter-types")))
	expect(`#dead-letters tr[data-event-id="evt_waiting"]`, "connection reset by peer")
	run("dead letters screenshot", shot("dead-letters"))
	run("ask to replay the type",
		chromedp.Click(chromedp.CSS(`#dead-letter-types tr[data-type="customer.subscription.updated"] button`)),
		chromedp.WaitVisible(chromedp.CSS("#confirm-form")))
	expect("#confirm-text", "Replay 1 dead-lettered events of type customer.subscription.updated?")
	run("confirm",
		chromedp.Click(chromedp.CSS(`#confirm-form button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS("#no-dead-letters")))
	expect("#flash", "Replayed 1 dead letters of type customer.subscription.updated; 0 of those confirmed are left.")
	if s := c.status(t, "evt_waiting"); s != "received" {
		t.Errorf("evt_waiting is %s after the replay, want received", s)
	}

	// The find box leads from an email to the person: their customer page.
	run("find a user by email",
		chromedp.SendKeys(chromedp.CSS(`header input[name="q"]`), "U1@example"),
		chromedp.Submit(chromedp.CSS(`header input[name="q"]`)),
		chromedp.WaitVisible(chromedp.CSS("#test-entitlement")))
	if loc := location(); loc != "/admin/ui/customers/user-1" {
		t.Errorf("find U1@example led to %s", loc)
	}
	expect("#test-link", "Ursula One")
	expect("#test-entitlement", "Entitled: the subscription is active.")
	expect(`#test-subscriptions tr[data-subscription-id="sub_1"]`, "payment_failed")
	expect(`#test-charges tr[data-order-id="order-1"]`, "42.00 USD")
	expect(`#test-charges tr[data-refund-id="refund-a"]`, "−12.00 USD")
	run("customer screenshot", shot("customer"))

	// Follow a charge, then back to its customer.
	run("open order-1",
		chromedp.Click(chromedp.CSS(`#test-charges tr[data-order-id="order-1"] td.order a`)),
		chromedp.WaitVisible(chromedp.CSS("#charge")))
	expect("#charge-amount", "42.00 USD · refunded 12.00 USD")
	expect("#refunds", "re_1")
	run("charge screenshot", shot("charge"))
	run("back to the customer",
		chromedp.Click(chromedp.CSS(`#charge-user a`)),
		chromedp.WaitVisible(chromedp.CSS("#test-entitlement")))

	// The charges page: filter by status; each row leads to its customer.
	run("open charges",
		chromedp.Click(chromedp.CSS(`header nav a[href="/admin/ui/charges"]`)),
		chromedp.WaitVisible(chromedp.CSS("#charges-filter")))
	expect("#charges", "order-3")
	run("charges screenshot", shot("charges"))
	run("filter charges by status",
		chromedp.SetValue(chromedp.CSS(`#charges-filter select[name="status"]`), "declined"),
		chromedp.Click(chromedp.CSS(`#charges-filter button[type="submit"]`)),
		chromedp.WaitReady(chromedp.CSS(`#charges-filter option[value="declined"][selected]`)))
	if rows := read("#charges tbody"); !strings.Contains(rows, "order-2") || strings.Contains(rows, "order-1") {
		t.Errorf("declined charges: %q", rows)
	}

	// A name prefix two people share is a list.
	run("find by name",
		chromedp.SendKeys(chromedp.CSS(`header input[name="q"]`), "carol"),
		chromedp.Submit(chromedp.CSS(`header input[name="q"]`)),
		chromedp.WaitVisible(chromedp.CSS("#found-people")))
	expect("#found-people", "Carol Danvers")
	expect("#found-people", "Caroline Forbes")
	run("find screenshot", shot("find"))

	// Start a reconcile run through the form, then find it in the audit log with who started it.
	run("open reconcile",
		chromedp.Click(chromedp.CSS(`header nav a[href="/admin/ui/reconcile"]`)),
		chromedp.WaitVisible(chromedp.CSS("#reconcile-form")))
	run("start a run",
		chromedp.Click(chromedp.CSS(`#reconcile-form input[name="dry_run"]`)),
		chromedp.Click(chromedp.CSS(`#reconcile-form button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS("#flash")))
	expect("#flash", "started")
	expect("#runs", "dry run")
	run("reconcile screenshot", shot("reconcile"))
	run("open the audit log",
		chromedp.Click(chromedp.CSS(`header nav a[href="/admin/ui/audit"]`)),
		chromedp.WaitVisible(chromedp.CSS("#audit")))
	expect(`#audit tr[data-action="reconcile_start"]`, "alice")
	expect(`#audit tr[data-action="reconcile_start"]`, "started (dry run)")
	expect(`#audit tr[data-target="evt_dead"]`, "alice")
	expect(`#audit tr[data-target="evt_waiting"]`, "replay_type")
	run("audit screenshot", shot("audit"))
}
