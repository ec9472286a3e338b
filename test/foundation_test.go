package test

import (
	"database/sql"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"billing/internal/testenv"
	"billing/migrations"
)

func TestMain(m *testing.M) {
	if benchServeBare() {
		return
	}
	testenv.SetMigrator(migrations.ApplyQuietly)
	testenv.Main(m)
}

// worldReadableTempDir is a temp dir the postgres user can reach when the tests run as root.
func worldReadableTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "billing-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// With no database URL, serve creates, starts and stops its own cluster under .data/postgres.
func TestEmbeddedDatabaseDefault(t *testing.T) {
	t.Parallel()
	dir := worldReadableTempDir(t)
	p := start(t, dir, map[string]string{"BILLING_STRIPE_WEBHOOK_SECRETS_TEST": "whsec_e2e_0123456789abcdef0123456789abcdef"})
	if !strings.Contains(p.out.String(), "embedded PostgreSQL") {
		t.Errorf("the log does not say that the embedded database is used")
	}
	matches, _ := filepath.Glob(filepath.Join(dir, ".data/postgres/*/postmaster.pid"))
	if len(matches) == 0 {
		if _, err := os.Stat(filepath.Join(dir, ".data/postgres/postmaster.pid")); err == nil {
			matches = []string{filepath.Join(dir, ".data/postgres/postmaster.pid")}
		}
	}
	if len(matches) != 1 {
		t.Fatalf("no running cluster under .data/postgres")
	}
	if code := p.stop(t, syscall.SIGTERM); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0", code)
	}
	if _, err := os.Stat(matches[0]); !os.IsNotExist(err) {
		t.Errorf("cluster still running after shutdown (%s exists)", matches[0])
	}
	// A second start reuses the cluster it made.
	p2 := start(t, dir, nil)
	if code := p2.stop(t, syscall.SIGINT); code != 0 {
		t.Errorf("exit code %d after SIGINT, want 0", code)
	}
}

func TestInvalidConfigurationExitsTwo(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		env  map[string]string
		key  string
	}{
		{"unknown mode", map[string]string{"BILLING_STRIPE_MODE": "prod"}, "stripe.mode"},
		{"live key in test mode", map[string]string{"BILLING_STRIPE_SECRET_KEY": "sk_live_abc"}, "stripe.secret_key"},
		{"bad duration", map[string]string{"BILLING_WORKER_RETRY_DELAY": "soon"}, "worker.retry_delay"},
		{"bad url", map[string]string{"BILLING_STRIPE_API_URL": "not a url"}, "stripe.api_url"},
		{"webhook secret without prefix", map[string]string{"BILLING_STRIPE_WEBHOOK_SECRETS_TEST": "abc"}, "stripe.webhook_secrets.test"},
		{"serve without tokens", map[string]string{"BILLING_STRIPE_WEBHOOK_SECRETS_TEST": "whsec_e2e_0123456789abcdef0123456789abcdef"}, "auth.api_tokens"},
		{"serve without a webhook secret", map[string]string{"BILLING_AUTH_API_TOKENS": e2eAPIToken, "BILLING_AUTH_ADMIN_TOKENS": e2eAdminToken}, "stripe.webhook_secrets.test"},
		{"short token", map[string]string{"BILLING_AUTH_API_TOKENS": "sk_live_abc"}, "auth.api_tokens"},
		// The password is the secret the loop checks is not printed.
		{"malformed database url", map[string]string{"BILLING_DATABASE_URL": "postgres://billing:sk_live_abc@%zz/billing"}, "database.url"},
		{"live mode on the embedded database", map[string]string{"BILLING_STRIPE_MODE": "live"}, "database.url"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code, out := runCmd(t, t.TempDir(), tc.env, "serve")
			if code != 2 {
				t.Errorf("exit code %d, want 2", code)
			}
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if len(lines) != 1 || !strings.Contains(lines[0], tc.key) {
				t.Errorf("output %q: want one line naming %s", out, tc.key)
			}
			if strings.Contains(out, "sk_live_abc") {
				t.Errorf("the secret was printed")
			}
		})
	}
}

// Replicas starting together all migrate: every run succeeds.
func TestConcurrentMigrateCommands(t *testing.T) {
	t.Parallel()
	// A database with no schema: testenv's template is migrated, so make an empty one.
	url := emptyDatabase(t)
	const n = 3
	type result struct {
		code int
		out  string
	}
	results := make(chan result, n)
	for range n {
		go func() {
			code, out := runCmd(t, t.TempDir(), map[string]string{"BILLING_DATABASE_URL": url}, "migrate")
			results <- result{code, out}
		}()
	}
	for range n {
		r := <-results
		if r.code != 0 {
			t.Errorf("migrate exit %d:\n%s", r.code, r.out)
		}
	}
	code, out := runCmd(t, t.TempDir(), map[string]string{"BILLING_DATABASE_URL": url}, "migrate")
	if code != 0 || strings.Contains(out, "migration applied") {
		t.Errorf("a further migrate applied something or failed (%d):\n%s", code, out)
	}
}

func emptyDatabase(t *testing.T) string {
	t.Helper()
	url := testenv.DatabaseURL(t)
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`DROP SCHEMA public CASCADE; CREATE SCHEMA public`); err != nil {
		t.Fatal(err)
	}
	return url
}

// The smallest whole path: trigger posts a signed event, the worker processes it, the admin API
// shows it processed.
func TestTriggerReachesTheWorker(t *testing.T) {
	t.Parallel()
	env := map[string]string{
		"BILLING_DATABASE_URL":                testenv.DatabaseURL(t),
		"BILLING_STRIPE_WEBHOOK_SECRETS_TEST": "whsec_e2e_0123456789abcdef0123456789abcdef",
		"BILLING_AUTH_ADMIN_TOKENS":           e2eAdminToken,
		"BILLING_STRIPE_API_URL":              testenv.StripeMockURL(t),
		"BILLING_STRIPE_SECRET_KEY":           "sk_test_123",
		"BILLING_WORKER_RETRY_DELAY":          "10ms",
	}
	p := start(t, t.TempDir(), env)
	code, out := runCmd(t, t.TempDir(), map[string]string{"BILLING_STRIPE_WEBHOOK_SECRETS_TEST": "whsec_e2e_0123456789abcdef0123456789abcdef"},
		"trigger", "customer.created", "--url", p.url("/webhooks/stripe"), "--id", "e2e1", "--event-id", "evt_e2e1")
	if code != 0 || !strings.Contains(out, `"ignored"`) {
		t.Fatalf("trigger: %d %s", code, out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		status, body := get(t, p.url("/admin/events/evt_e2e1"), e2eAdminToken)
		var ev struct{ Status string }
		_ = json.Unmarshal([]byte(body), &ev)
		if status == 200 && ev.Status == "ignored" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("event not visible: %d %s", status, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code := p.stop(t, syscall.SIGTERM); code != 0 {
		t.Errorf("exit code %d", code)
	}
}

// The profiler answers on http.debug_addr only, and the API's listener knows nothing of it.
func TestProfilerListensOnlyOnTheDebugAddress(t *testing.T) {
	t.Parallel()
	debug := freeAddr(t)
	p := start(t, t.TempDir(), map[string]string{
		"BILLING_DATABASE_URL":    testenv.DatabaseURL(t),
		"BILLING_HTTP_DEBUG_ADDR": debug,
	})
	status, body := get(t, "http://"+debug+"/debug/pprof/cmdline", "")
	if status != http.StatusOK || !strings.Contains(body, "serve") {
		t.Errorf("profiler cmdline: %d %q", status, body)
	}
	if status, body := get(t, "http://"+debug+"/debug/pprof/heap?debug=1", ""); status != http.StatusOK || !strings.Contains(body, "heap profile") {
		t.Errorf("profiler heap: %d %.200s", status, body)
	}
	status, body = get(t, p.url("/debug/pprof/"), e2eAdminToken)
	if status != http.StatusNotFound || !strings.Contains(body, `"route_not_found"`) {
		t.Errorf("the API listener serves the profiler: %d %s", status, body)
	}
	if code := p.stop(t, syscall.SIGTERM); code != 0 {
		t.Errorf("exit code %d", code)
	}
}
