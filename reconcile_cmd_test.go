package main

import (
	"bytes"
	"context"
	"database/sql"
	"net/http"
	"strings"
	"testing"
	"time"

	"billing/billing"
	"billing/internal/stripetest"
	"billing/internal/testenv"
)

// billing reconcile: the summary line on stdout (exactly one), progress on stderr, and the exit
// codes: 1 for a dry run that found drift, 0 once repaired, 2 for a mode that is not the key's
// and for a run Stripe stopped.
func TestReconcileCommand(t *testing.T) {
	proxy := stripetest.New(t, testenv.StripeMockURL(t))
	acct := stripetest.NewAccount(proxy, false)
	cus := acct.AddCustomer(stripetest.CustomerSpec{Email: "u1@example.com", Metadata: map[string]string{"user_id": "u1"}})
	now := time.Now().UTC().Truncate(time.Second)
	acct.PutSubscription(stripetest.SubscriptionSpec{Customer: cus, Status: "active", PriceID: "price_a",
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

	code, out, errOut := run("--dry-run")
	if code != 1 || out != "reconcile: objects=1 drifted=1 repaired=0 missing_at_stripe=0 errors=0\n" {
		t.Fatalf("dry run: exit %d, stdout %q", code, out)
	}
	if !strings.Contains(errOut, "reconcile: page 1: objects=1") {
		t.Errorf("no progress line on stderr: %q", errOut)
	}
	code, out, _ = run()
	if code != 0 || out != "reconcile: objects=1 drifted=1 repaired=1 missing_at_stripe=0 errors=0\n" {
		t.Fatalf("run: exit %d, stdout %q", code, out)
	}
	// The repair queued the renewal's re-read, as an event would have; serve runs it.
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var rereads int
	if err := db.QueryRow(`SELECT count(*) FROM river_job WHERE kind = $1`, billing.RereadJobKind).Scan(&rereads); err != nil {
		t.Fatal(err)
	}
	if rereads != 1 {
		t.Errorf("%d renewal re-reads queued by the repair, want 1", rereads)
	}
	code, out, _ = run("--mode", "test")
	if code != 0 || out != "reconcile: objects=1 drifted=0 repaired=0 missing_at_stripe=0 errors=0\n" {
		t.Fatalf("second run: exit %d, stdout %q", code, out)
	}

	code, out, errOut = run("--mode", "live")
	if code != 2 || out != "reconcile: objects=0 drifted=0 repaired=0 missing_at_stripe=0 errors=1\n" ||
		!strings.Contains(errOut, "--mode live does not match stripe.mode test") {
		t.Fatalf("--mode live on a test key: exit %d, stdout %q, stderr %q", code, out, errOut)
	}

	proxy.Respond(http.MethodGet, "/v1/subscriptions", 1, func(stripetest.Request) stripetest.Answer {
		return stripetest.Answer{Status: http.StatusUnauthorized, Body: map[string]any{"error": map[string]any{
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
