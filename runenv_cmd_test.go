package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stripe/stripe-go/v79/webhook"

	"billing/config"
	"billing/internal/devstripe"
	"billing/internal/runenv"
	"billing/internal/stripeemu"
	"billing/internal/testenv"
)

// The run file of the dev loop carries test-mode secrets only: a live deployment on the embedded
// cluster writes where it runs and nothing secret.
func TestDevRunEnvWritesSecretsOfTestModeOnly(t *testing.T) {
	cfg := &config.Config{}
	cfg.HTTP.Addr = ":8080"
	cfg.Stripe.APIURL = "http://127.0.0.1:12111"
	cfg.Stripe.SecretKey = "sk_test_123"
	cfg.Stripe.WebhookSecrets.Test = []string{"whsec_test"}
	cfg.Auth.APITokens = []string{"app_token"}
	cfg.Auth.AdminTokens = []string{"ops:admin_token"}

	cfg.Stripe.Mode = "test"
	e := devRunEnv(cfg, "postgres://db")
	if e.ServiceURL != "http://localhost:8080" || e.DatabaseURL != "postgres://db" || e.PID != os.Getpid() ||
		e.StripeKey != "sk_test_123" || e.WebhookSecret != "whsec_test" || e.APIToken != "app_token" || e.AdminToken != "admin_token" {
		t.Errorf("test mode: %+v", e)
	}

	cfg.Stripe.Mode = "live"
	cfg.Stripe.SecretKey = "sk_live_123"
	cfg.HTTP.Addr = "127.0.0.1:9000"
	e = devRunEnv(cfg, "postgres://db")
	if e.StripeKey != "" || e.WebhookSecret != "" || e.APIToken != "" || e.AdminToken != "" {
		t.Errorf("live mode wrote secrets: %+v", e)
	}
	if e.ServiceURL != "http://127.0.0.1:9000" {
		t.Errorf("live mode service URL %q", e.ServiceURL)
	}
}

// Beside a running `make run` service, the tools use its database, its dev Stripe and its secret
// without flags, from any directory of the checkout: doctor passes (the dev Portal allows
// cancelling), reconcile --dry-run finds nothing to repair on an empty account, and trigger
// posts a correctly signed event to the service.
func TestToolsUseTheRunningDevService(t *testing.T) {
	t.Parallel()
	proxy := stripeemu.New(t, testenv.StripeMockURL(t))
	devstripe.Dev(proxy)
	proxy.PortalConfigurations().Add(true, true, true)
	stripeemu.NewAccount(proxy, false)
	stripeemu.NewCatalog(proxy, false) // an empty catalog: nothing for reconcile to backfill
	var got struct {
		sync.Mutex
		sig, body string
	}
	svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got.Lock()
		got.sig, got.body = r.Header.Get("Stripe-Signature"), string(b)
		got.Unlock()
		if r.URL.Path != "/webhooks/stripe" {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		fmt.Fprintln(w, `{"status":"received"}`)
	}))
	t.Cleanup(svc.Close)

	checkout := t.TempDir()
	const secret = "whsec_running_0123456789abcdef0123456789abcdef"
	// This test's process stands for the running serve: the file names a live process.
	if err := runenv.Write(filepath.Join(checkout, runenv.File), runenv.Env{
		PID: os.Getpid(), ServiceURL: svc.URL, DatabaseURL: testenv.DatabaseURL(t), StripeURL: proxy.URL,
		StripeKey: "sk_test_123", WebhookSecret: secret,
	}); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(checkout, "docs")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	quiet := []string{"BILLING_LOG_LEVEL=warn"}

	doctor := runCLIIn(t, sub, quiet, "doctor")
	if doctor.code != 0 || !strings.Contains(doctor.stderr, "using the running `make run` service") {
		t.Errorf("doctor beside the running service: exit %d\nstdout: %s\nstderr: %s", doctor.code, doctor.stdout, doctor.stderr)
	}
	rec := runCLIIn(t, sub, quiet, "reconcile", "--dry-run")
	if rec.code != 0 || !strings.Contains(rec.stdout, "objects=0 drifted=0") {
		t.Errorf("reconcile --dry-run beside the running service: exit %d\nstdout: %s\nstderr: %s", rec.code, rec.stdout, rec.stderr)
	}
	if n := len(proxy.Requests()); n == 0 {
		t.Error("the tools never called the running service's Stripe")
	}

	trig := runCLIIn(t, sub, nil, "trigger", "customer.created")
	got.Lock()
	defer got.Unlock()
	if trig.code != 0 || got.body == "" {
		t.Fatalf("trigger beside the running service: exit %d, stdout %q, stderr %q", trig.code, trig.stdout, trig.stderr)
	}
	if _, err := webhook.ConstructEventWithOptions([]byte(got.body), got.sig, secret, webhook.ConstructEventOptions{IgnoreAPIVersionMismatch: true}); err != nil {
		t.Errorf("trigger's event is not signed with the running service's secret: %v", err)
	}
}

// An address given in BILLING_HTTP_ADDR is where trigger posts, before any running service.
func TestTriggerURLFollowsTheListenAddress(t *testing.T) {
	t.Setenv("BILLING_HTTP_ADDR", ":9191")
	if got := triggerURL(); got != "http://localhost:9191/webhooks/stripe" {
		t.Errorf("triggerURL with BILLING_HTTP_ADDR=:9191: %s", got)
	}
	t.Setenv("BILLING_HTTP_ADDR", "127.0.0.1:9192")
	if got := triggerURL(); got != "http://127.0.0.1:9192/webhooks/stripe" {
		t.Errorf("triggerURL with BILLING_HTTP_ADDR=127.0.0.1:9192: %s", got)
	}
}

// The running service fills only what the configuration leaves unset, in test mode only.
func TestUseRunningServiceFillsOnlyWhatIsUnset(t *testing.T) {
	dir := t.TempDir()
	if err := runenv.Write(filepath.Join(dir, runenv.File), runenv.Env{
		PID: os.Getpid(), DatabaseURL: "postgres://running", StripeURL: "http://127.0.0.1:12111", StripeKey: "sk_test_123", WebhookSecret: "whsec_running",
	}); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	fresh := func() *config.Config {
		c := &config.Config{}
		c.Stripe.Mode = "test"
		c.Stripe.APIURL = defaultStripeAPIURL
		return c
	}
	var out strings.Builder

	c := fresh()
	if !useRunningService(c, &out) || c.Database.URL != "postgres://running" || c.Stripe.SecretKey != "sk_test_123" ||
		c.Stripe.APIURL != "http://127.0.0.1:12111" || fmt.Sprint(c.Stripe.WebhookSecrets.Test) != "[whsec_running]" {
		t.Errorf("nothing configured: %+v", c.Stripe)
	}
	c = fresh()
	c.Stripe.SecretKey = "sk_test_mine"
	c.Stripe.WebhookSecrets.Test = []string{"whsec_mine"}
	if !useRunningService(c, &out) || c.Stripe.SecretKey != "sk_test_mine" || c.Stripe.APIURL != defaultStripeAPIURL ||
		fmt.Sprint(c.Stripe.WebhookSecrets.Test) != "[whsec_mine]" {
		t.Errorf("a configured key and secret are kept, with their API URL: %+v", c.Stripe)
	}
	c = fresh()
	c.Database.URL = "postgres://mine"
	if useRunningService(c, &out) || c.Database.URL != "postgres://mine" || c.Stripe.SecretKey != "" {
		t.Errorf("a configured database is the tool's world: %+v %+v", c.Database, c.Stripe)
	}
	c = fresh()
	c.Stripe.Mode = "live"
	if useRunningService(c, &out) || c.Database.URL != "" {
		t.Errorf("live mode never uses the dev loop's file: %+v", c.Database)
	}
	if err := os.Remove(filepath.Join(dir, runenv.File)); err != nil {
		t.Fatal(err)
	}
	if c := fresh(); useRunningService(c, &out) || c.Database.URL != "" {
		t.Errorf("no running service: %+v", c.Database)
	}
}
