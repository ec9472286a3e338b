package main

import (
	"bytes"
	"context"
	"database/sql"
	"net/http"
	"strings"
	"testing"
	"time"

	"billing/internal/stripeemu"
	"billing/internal/stripeevents"
	"billing/internal/testenv"
)

// billing reconcile: the summary line on stdout (exactly one, the catalog's counts at its end),
// progress on stderr, and the exit codes: 1 for a dry run that found drift (of a subscription or
// of the catalog), 0 once repaired, 2 for a mode that is not the key's and for a run Stripe
// stopped.
func TestReconcileCommand(t *testing.T) {
	proxy := stripeemu.New(t, testenv.StripeMockURL(t))
	acct := stripeemu.NewAccount(proxy, false)
	cat := stripeemu.NewCatalog(proxy, false)
	cat.PutProduct(stripeevents.Product{ID: "prod_a", Name: "Plan A"})
	cat.PutPrice(stripeevents.Price{ID: "price_a", Product: "prod_a", UnitAmount: 1000, Interval: "month", LookupKey: "a_monthly"})
	cat.SetProductFeatures("prod_a", "reports")
	cus := acct.AddCustomer(stripeemu.CustomerSpec{Email: "u1@example.com", Metadata: map[string]string{"user_id": "u1"}})
	now := time.Now().UTC().Truncate(time.Second)
	acct.PutSubscription(stripeemu.SubscriptionSpec{Customer: cus, Status: "active", PriceID: "price_a",
		CurrentPeriodStart: now.Add(-time.Hour), CurrentPeriodEnd: now.AddDate(0, 1, 0)})
	url := testenv.DatabaseURL(t)
	for k, v := range map[string]string{
		"BILLING_CONFIG":            "",
		"BILLING_DATABASE_URL":      url,
		"BILLING_STRIPE_MODE":       "test",
		"BILLING_STRIPE_SECRET_KEY": "sk_test_reconcile",
		"BILLING_STRIPE_API_URL":    proxy.URL,
		"BILLING_LOG_LEVEL":         "error",
	} {
		t.Setenv(k, v)
	}
	run := func(args ...string) (int, string, string) {
		t.Helper()
		var out, errOut bytes.Buffer
		code := runReconcileCommand(context.Background(), args, &out, &errOut)
		t.Logf("billing reconcile %s: exit %d\nstdout: %sstderr: %s", strings.Join(args, " "), code, out.String(), errOut.String())
		return code, out.String(), errOut.String()
	}

	// The subscription, the product and the price: the catalog's drift counts in drifted too.
	code, out, errOut := run("--dry-run")
	if code != 1 || out != "reconcile: objects=1 drifted=3 repaired=0 missing_at_stripe=0 errors=0 catalog_objects=2 catalog_drifted=2 catalog_repaired=0\n" {
		t.Fatalf("dry run: exit %d, stdout %q", code, out)
	}
	if !strings.Contains(errOut, "reconcile: page 1: objects=1") || !strings.Contains(errOut, "reconcile: catalog prices page 1: catalog_objects=2") {
		t.Errorf("no progress lines on stderr: %q", errOut)
	}
	code, out, _ = run()
	if code != 0 || out != "reconcile: objects=1 drifted=3 repaired=3 missing_at_stripe=0 errors=0 catalog_objects=2 catalog_drifted=2 catalog_repaired=2\n" {
		t.Fatalf("run: exit %d, stdout %q", code, out)
	}
	// The repair planned the renewal's re-read, as an event would have; serve's sweep queues it.
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var rereads int
	if err := db.QueryRow(`SELECT count(*) FROM subscriptions WHERE renewal_reread_due IS NOT NULL AND NOT renewal_reread_queued AND NOT livemode`).Scan(&rereads); err != nil {
		t.Fatal(err)
	}
	if rereads != 1 {
		t.Errorf("%d renewal re-reads planned by the repair, want 1", rereads)
	}
	// The catalog backfilled: the price, by its lookup key, with its product's features.
	var features string
	if err := db.QueryRow(`SELECT array_to_string(pr.features, ',') FROM catalog_prices p JOIN catalog_products pr USING (product_id, livemode)
		WHERE p.lookup_key = 'a_monthly' AND p.price_id = 'price_a' AND p.active AND NOT p.livemode`).Scan(&features); err != nil || features != "reports" {
		t.Fatalf("backfilled catalog: features %q (%v)", features, err)
	}
	code, out, _ = run("--mode", "test")
	if code != 0 || out != "reconcile: objects=1 drifted=0 repaired=0 missing_at_stripe=0 errors=0 catalog_objects=2 catalog_drifted=0 catalog_repaired=0\n" {
		t.Fatalf("second run: exit %d, stdout %q", code, out)
	}

	// Renamed at Stripe, the event lost: reported by a dry run (exit 1), repaired by a run. The
	// row's news is made older than the rename (the runs may share the last run's second).
	cat.PutProduct(stripeevents.Product{ID: "prod_a", Name: "Plan A+"})
	if _, err := db.Exec(`UPDATE catalog_products SET event_created = event_created - interval '1 hour' WHERE product_id = 'prod_a'`); err != nil {
		t.Fatal(err)
	}
	code, out, _ = run("--dry-run")
	if code != 1 || out != "reconcile: objects=1 drifted=1 repaired=0 missing_at_stripe=0 errors=0 catalog_objects=2 catalog_drifted=1 catalog_repaired=0\n" {
		t.Fatalf("dry run after a rename: exit %d, stdout %q", code, out)
	}
	code, out, _ = run()
	var name string
	if err := db.QueryRow(`SELECT name FROM catalog_products WHERE product_id = 'prod_a' AND NOT livemode`).Scan(&name); err != nil ||
		code != 0 || out != "reconcile: objects=1 drifted=1 repaired=1 missing_at_stripe=0 errors=0 catalog_objects=2 catalog_drifted=1 catalog_repaired=1\n" || name != "Plan A+" {
		t.Fatalf("run after a rename: exit %d, stdout %q, name %q (%v)", code, out, name, err)
	}

	code, out, errOut = run("--mode", "live")
	if code != 2 || out != "reconcile: objects=0 drifted=0 repaired=0 missing_at_stripe=0 errors=1 catalog_objects=0 catalog_drifted=0 catalog_repaired=0\n" ||
		!strings.Contains(errOut, "--mode live does not match stripe.mode test") {
		t.Fatalf("--mode live on a test key: exit %d, stdout %q, stderr %q", code, out, errOut)
	}

	proxy.Respond(http.MethodGet, "/v1/subscriptions", 1, func(stripeemu.Request) stripeemu.Answer {
		return stripeemu.Answer{Status: http.StatusUnauthorized, Body: map[string]any{"error": map[string]any{
			"type": "invalid_request_error", "message": "Invalid API Key provided"}}}
	})
	code, out, errOut = run()
	if code != 2 || strings.Count(out, "\n") != 1 || !strings.Contains(out, "errors=1") || !strings.Contains(errOut, "stopped") {
		t.Fatalf("refused key: exit %d, stdout %q, stderr %q", code, out, errOut)
	}

	if code, out, _ := run("extra"); code != exitUsage || out != "" {
		t.Fatalf("stray argument: exit %d, stdout %q", code, out)
	}
}
