package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	"billing/config"
	"billing/internal/apitest"
	"billing/internal/database"
	"billing/internal/stripeclient"
	"billing/internal/stripeemu"
	"billing/internal/testenv"
)

// doctorEnv is a deployment that passes every check: a current database, a test-mode key and
// secret, the endpoint as setup makes it, a portal that allows cancelling. Each test breaks one.
type doctorEnv struct {
	*stripeAccount
	opts     doctorOptions
	endpoint string
}

func newDoctorEnv(t *testing.T) *doctorEnv {
	t.Helper()
	a := newStripeAccount(t)
	cfg := &config.Config{}
	cfg.Stripe.Mode = "test"
	cfg.Stripe.SecretKey = "sk_test_setup"
	cfg.Stripe.APIURL = a.proxy.URL
	cfg.Stripe.WebhookSecrets.Test = []string{"whsec_doctor_0123456789abcdef0123456789abcdef"}
	e := &doctorEnv{
		stripeAccount: a,
		opts: doctorOptions{
			Config: cfg, DB: database.SQL(testenv.DB(t)), URL: setupURL, Types: handledEventTypes(),
		},
	}
	a.addOtherEndpoints()
	e.endpoint = a.endpoints.Add(setupURL, stripeclient.APIVersion, handledEventTypes()...)
	a.portal.Add(false, true, false)
	a.portal.Add(true, true, true)
	return e
}

// run runs the doctor and returns its exit code and lines by check name.
func (e *doctorEnv) run(t *testing.T) (int, map[string]string, string) {
	t.Helper()
	var out bytes.Buffer
	code := runDoctor(context.Background(), e.opts, e.client, &out)
	t.Logf("exit %d\n%s", code, out.String())
	lines := map[string]string{}
	for _, l := range strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n") {
		var name string
		switch {
		case strings.HasPrefix(l, "ok  "):
			name = strings.TrimPrefix(l, "ok  ")
		case strings.HasPrefix(l, "FAIL "):
			name, _, _ = strings.Cut(strings.TrimPrefix(l, "FAIL "), ": ")
		default:
			t.Fatalf("line %q is neither ok nor FAIL", l)
		}
		lines[name] = l
	}
	return code, lines, out.String()
}

var doctorChecks = []string{"database", "stripe secret key", "webhook secret", "webhook endpoint " + setupURL, "customer portal"}

func TestDoctorAllPass(t *testing.T) {
	e := newDoctorEnv(t)
	code, lines, out := e.run(t)
	if code != 0 || len(lines) != len(doctorChecks) {
		t.Fatalf("exit %d, %d lines, want 0 and %d:\n%s", code, len(lines), len(doctorChecks), out)
	}
	for _, c := range doctorChecks {
		if lines[c] != "ok  "+c {
			t.Errorf("check %q: %q", c, lines[c])
		}
	}
	if w := e.endpointWrites(); len(w) != 0 {
		t.Errorf("the doctor wrote to Stripe: %+v", w)
	}
}

// Without --url there is no endpoint check; the rest still runs.
func TestDoctorWithoutURLSkipsTheEndpoint(t *testing.T) {
	e := newDoctorEnv(t)
	e.opts.URL = ""
	e.endpoints.Disable(e.endpoint)
	code, lines, out := e.run(t)
	if code != 0 || len(lines) != len(doctorChecks)-1 || strings.Contains(out, "webhook endpoint") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
}

// Each check fails alone when its part is broken, with what is wrong and the fix; a key that
// does not work leaves the checks that need it unchecked, and says so.
func TestDoctorFailsEachCheck(t *testing.T) {
	endpointCheck := "webhook endpoint " + setupURL
	for _, tc := range []struct {
		name  string
		brk   func(t *testing.T, e *doctorEnv)
		fails map[string]string // check → what its line must say
	}{
		{"database unreachable", func(t *testing.T, e *doctorEnv) {
			e.opts.DB = database.SQL(apitest.UnreachableDB(t))
		}, map[string]string{"database": "cannot connect"}},
		{"database not opened", func(t *testing.T, e *doctorEnv) {
			e.opts.DB, e.opts.DBErr = nil, errors.New("connection refused")
		}, map[string]string{"database": "connection refused"}},
		{"migration pending", func(t *testing.T, e *doctorEnv) {
			if _, err := e.opts.DB.Exec(`DELETE FROM goose_db_version WHERE version_id = (SELECT max(version_id) FROM goose_db_version)`); err != nil {
				t.Fatal(err)
			}
		}, map[string]string{"database": "billing migrate"}},
		{"key of the other mode", func(t *testing.T, e *doctorEnv) {
			e.opts.Config.Stripe.Mode = "live"
			e.opts.Config.Stripe.WebhookSecrets.Live = []string{"whsec_live_0123456789abcdef0123456789abcdef"}
		}, map[string]string{"stripe secret key": "not a live-mode key", endpointCheck: "not checked", "customer portal": "not checked"}},
		{"Stripe answers in the other mode", func(t *testing.T, e *doctorEnv) {
			e.proxy.Mutate(http.MethodGet, "/v1/balance", -1, func(_ stripeemu.Request, obj map[string]any) { obj["livemode"] = true })
		}, map[string]string{"stripe secret key": "live mode", endpointCheck: "not checked", "customer portal": "not checked"}},
		{"key refused", func(t *testing.T, e *doctorEnv) {
			e.proxy.Respond(http.MethodGet, "/v1/balance", -1, func(stripeemu.Request) stripeemu.Answer {
				return stripeemu.Answer{Status: 401, Body: map[string]any{"error": map[string]any{
					"type": "invalid_request_error", "message": "Invalid API Key provided: sk_test_****etup"}}}
			})
		}, map[string]string{"stripe secret key": "Stripe refused the key", endpointCheck: "not checked", "customer portal": "not checked"}},
		{"no key", func(t *testing.T, e *doctorEnv) {
			e.opts.Config.Stripe.SecretKey = ""
		}, map[string]string{"stripe secret key": "not set", endpointCheck: "not checked", "customer portal": "not checked"}},
		{"Stripe unreachable", func(t *testing.T, e *doctorEnv) {
			e.proxy.InjectFault(http.MethodGet, "/v1/balance", stripeemu.FaultDrop, stripeclient.Retries+1)
		}, map[string]string{"stripe secret key": "cannot reach Stripe", endpointCheck: "not checked", "customer portal": "not checked"}},
		{"no webhook secret", func(t *testing.T, e *doctorEnv) {
			e.opts.Config.Stripe.WebhookSecrets.Test = nil
			e.opts.Config.Stripe.WebhookSecrets.Live = []string{"whsec_live_0123456789abcdef0123456789abcdef"}
		}, map[string]string{"webhook secret": "stripe.webhook_secrets.test is empty"}},
		{"endpoint missing", func(t *testing.T, e *doctorEnv) {
			e.opts.URL = "https://elsewhere.example/webhooks/stripe"
		}, map[string]string{"webhook endpoint https://elsewhere.example/webhooks/stripe": "billing stripe setup --url https://elsewhere.example/webhooks/stripe"}},
		{"endpoint disabled", func(t *testing.T, e *doctorEnv) {
			e.endpoints.Disable(e.endpoint)
		}, map[string]string{endpointCheck: "disabled"}},
		{"endpoint of another version", func(t *testing.T, e *doctorEnv) {
			e.endpoint = ""
			e.stripeAccount = newStripeAccount(t)
			e.opts.Config.Stripe.APIURL = e.proxy.URL
			e.endpoints.Add(setupURL, "2023-10-16", handledEventTypes()...)
			e.portal.Add(true, true, true)
		}, map[string]string{endpointCheck: "2023-10-16, not " + stripeclient.APIVersion}},
		{"endpoint lacks a type", func(t *testing.T, e *doctorEnv) {
			e.stripeAccount = newStripeAccount(t)
			e.opts.Config.Stripe.APIURL = e.proxy.URL
			e.endpoints.Add(setupURL, stripeclient.APIVersion, handledEventTypes()[1:]...)
			e.portal.Add(true, true, true)
		}, map[string]string{endpointCheck: "does not receive " + handledEventTypes()[0]}},
		{"two endpoints", func(t *testing.T, e *doctorEnv) {
			e.endpoints.Add(setupURL, stripeclient.APIVersion, handledEventTypes()...)
		}, map[string]string{endpointCheck: "2 endpoints"}},
		{"portal without cancellation", func(t *testing.T, e *doctorEnv) {
			e.portal.Add(true, true, false)
		}, map[string]string{"customer portal": "cancel"}},
		{"portal never configured", func(t *testing.T, e *doctorEnv) {
			e.stripeAccount = newStripeAccount(t)
			e.opts.Config.Stripe.APIURL = e.proxy.URL
			e.endpoints.Add(setupURL, stripeclient.APIVersion, handledEventTypes()...)
		}, map[string]string{"customer portal": "no default configuration"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newDoctorEnv(t)
			tc.brk(t, e)
			code, lines, out := e.run(t)
			if code != 1 {
				t.Errorf("exit %d, want 1", code)
			}
			if len(lines) != len(doctorChecks) {
				t.Errorf("%d lines, want %d:\n%s", len(lines), len(doctorChecks), out)
			}
			for name, line := range lines {
				want, fails := tc.fails[name]
				switch {
				case !fails && !strings.HasPrefix(line, "ok  "):
					t.Errorf("check %q failed too: %q", name, line)
				case fails && (!strings.HasPrefix(line, "FAIL ") || !strings.Contains(line, want) || !strings.Contains(line, " — ")):
					t.Errorf("check %q: %q, want FAIL saying %q, with a fix after —", name, line, want)
				}
			}
			for name := range tc.fails {
				if _, ok := lines[name]; !ok {
					t.Errorf("no line for check %q", name)
				}
			}
		})
	}
}

// A restricted key without access to the balance is still a working key.
func TestDoctorAcceptsARestrictedKeyWithoutBalanceAccess(t *testing.T) {
	e := newDoctorEnv(t)
	e.opts.Config.Stripe.SecretKey = "rk_test_setup"
	e.proxy.Respond(http.MethodGet, "/v1/balance", -1, func(stripeemu.Request) stripeemu.Answer {
		return stripeemu.Answer{Status: 403, Body: map[string]any{"error": map[string]any{
			"type": "invalid_request_error", "message": "The provided key does not have the required permissions for this endpoint."}}}
	})
	if code, _, out := e.run(t); code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	if n := len(e.proxy.Filter(http.MethodGet, "/v1/balance")); n != 1 {
		t.Errorf("%d balance requests, want 1", n)
	}
}

// lockedBuffer collects log output written from serve's background goroutine.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// serve's start-up checks log a warning per failing check and return, also when Stripe cannot be
// reached; with everything in order they log that the checks passed.
func TestStartupChecksWarnPerFailure(t *testing.T) {
	e := newDoctorEnv(t)
	var logs lockedBuffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	startupChecks(context.Background(), e.opts.Config, e.client, logger)
	if s := logs.String(); strings.Contains(s, "level=WARN") || !strings.Contains(s, "stripe checks passed") {
		t.Fatalf("all in order, logged:\n%s", s)
	}

	logs = lockedBuffer{}
	e.opts.Config.Stripe.WebhookSecrets.Test = nil
	e.portal.Add(true, true, false)
	startupChecks(context.Background(), e.opts.Config, e.client, logger)
	s := logs.String()
	if strings.Count(s, "level=WARN") != 2 || !strings.Contains(s, `check="webhook secret"`) || !strings.Contains(s, `check="customer portal"`) {
		t.Fatalf("logged:\n%s", s)
	}

	logs = lockedBuffer{}
	e.opts.Config.Stripe.WebhookSecrets.Test = []string{"whsec_doctor_0123456789abcdef0123456789abcdef"}
	unreachable := stripeclient.New("http://127.0.0.1:1", "sk_test_setup", apitest.Logger(t, slog.LevelError))
	startupChecks(context.Background(), e.opts.Config, unreachable, logger)
	s = logs.String()
	if !strings.Contains(s, `check="stripe secret key"`) || !strings.Contains(s, "cannot reach Stripe") || !strings.Contains(s, `check="customer portal"`) {
		t.Fatalf("Stripe unreachable, logged:\n%s", s)
	}
	if strings.Contains(s, "sk_test_setup") {
		t.Errorf("the key is in the log:\n%s", s)
	}
}
