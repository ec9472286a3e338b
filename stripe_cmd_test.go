package main

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stripe/stripe-go/v79/client"

	"billing/config"
	"billing/internal/apitest"
	"billing/internal/stripeclient"
	"billing/internal/stripeemu"
	"billing/internal/testenv"
)

const setupURL = "https://billing.example/webhooks/stripe"

// stripeAccount is an account behind the test double: webhook endpoints and portal configurations
// kept by the test, the rest answered by stripe-mock.
type stripeAccount struct {
	proxy     *stripeemu.Proxy
	endpoints *stripeemu.WebhookEndpoints
	portal    *stripeemu.PortalConfigurations
	client    *client.API
}

func newStripeAccount(t *testing.T) *stripeAccount {
	t.Helper()
	p := stripeemu.New(t, testenv.StripeMockURL(t))
	return &stripeAccount{
		proxy:     p,
		endpoints: p.WebhookEndpoints(),
		portal:    p.PortalConfigurations(),
		client:    stripeclient.New(p.URL, "sk_test_setup", apitest.Logger(t, slog.LevelWarn)),
	}
}

// endpointWrites are the requests that would change the account's webhook endpoints.
func (a *stripeAccount) endpointWrites() []stripeemu.Request {
	var out []stripeemu.Request
	for _, r := range a.proxy.Requests() {
		if r.Method != http.MethodGet && strings.HasPrefix(r.Path, "/v1/webhook_endpoints") {
			out = append(out, r)
		}
	}
	return out
}

type setupRun struct {
	code           int
	stdout, stderr string
}

func (a *stripeAccount) setup(t *testing.T, opts setupOptions) setupRun {
	t.Helper()
	if opts.URL == "" {
		opts.URL = setupURL
	}
	if opts.Mode == "" {
		opts.Mode = "test"
	}
	if opts.Types == nil {
		opts.Types = handledEventTypes()
	}
	var stdout, stderr bytes.Buffer
	code := stripeSetup(context.Background(), opts, a.client, &stdout, &stderr)
	t.Logf("exit %d\nstdout: %s\nstderr: %s", code, stdout.String(), stderr.String())
	return setupRun{code, stdout.String(), stderr.String()}
}

// expectEndpoint checks that exactly one endpoint has setupURL and that it is what setup makes.
func (a *stripeAccount) expectEndpoint(t *testing.T) map[string]any {
	t.Helper()
	var mine []map[string]any
	for _, ep := range a.endpoints.All() {
		if ep["url"] == setupURL {
			mine = append(mine, ep)
		}
	}
	if len(mine) != 1 {
		t.Fatalf("%d endpoints with the URL, want 1: %v", len(mine), mine)
	}
	ep := mine[0]
	events, _ := ep["enabled_events"].([]string)
	slices.Sort(events)
	if ep["status"] != "enabled" || ep["api_version"] != stripeclient.APIVersion || !slices.Equal(events, handledEventTypes()) {
		t.Errorf("endpoint %v, want enabled, api_version %s, events %v", ep, stripeclient.APIVersion, handledEventTypes())
	}
	return ep
}

// Other endpoints of the account fill more than one page, so that setup must read every page.
func (a *stripeAccount) addOtherEndpoints() {
	for i := range 14 {
		a.endpoints.Add("https://other"+string(rune('a'+i))+".example/hook", stripeclient.APIVersion, "charge.succeeded")
	}
}

// The types setup subscribes to are those the running service registers, not a copy.
func TestSetupSubscribesToWhatTheAppHandles(t *testing.T) {
	cfg, err := config.Load("")
	if err != nil {
		t.Fatal(err)
	}
	a, err := newApp(appOptions{Config: cfg, DB: testenv.DB(t), Logger: apitest.Logger(t, slog.LevelWarn)})
	if err != nil {
		t.Fatal(err)
	}
	got := handledEventTypes()
	if want := a.Events.Types(); !slices.Equal(got, want) || len(want) == 0 {
		t.Fatalf("setup subscribes to %v, the service handles %v", got, want)
	}
	for _, typ := range []string{"customer.subscription.updated", "entitlements.active_entitlement_summary.updated"} {
		if !slices.Contains(got, typ) {
			t.Errorf("handled types %v lack %s", got, typ)
		}
	}
}

// A missing endpoint is created with the pinned version and exactly the handled types; its
// secret is printed once; a second run finds it in sync and changes nothing.
func TestSetupCreatesTheEndpointAndPrintsTheSecretOnce(t *testing.T) {
	a := newStripeAccount(t)
	a.addOtherEndpoints()
	run := a.setup(t, setupOptions{})
	if run.code != 0 || !strings.Contains(run.stdout, "created we_") {
		t.Fatalf("exit %d, stdout %q", run.code, run.stdout)
	}
	if n := strings.Count(run.stdout, "whsec_"); n != 1 || !strings.Contains(run.stdout, "stripe.webhook_secrets.test") {
		t.Errorf("the secret appears %d times in %q, want once, naming stripe.webhook_secrets.test", n, run.stdout)
	}
	a.expectEndpoint(t)
	if pages := len(a.proxy.Filter(http.MethodGet, "/v1/webhook_endpoints")); pages < 1 {
		t.Errorf("no list request")
	}

	again := a.setup(t, setupOptions{})
	if again.code != 0 || !strings.Contains(again.stdout, "in sync") || strings.Contains(again.stdout, "whsec_") {
		t.Fatalf("second run: exit %d, stdout %q", again.code, again.stdout)
	}
	if w := a.endpointWrites(); len(w) != 1 {
		t.Errorf("%d writes, want the one create: %+v", len(w), w)
	}
	a.expectEndpoint(t)
}

// The endpoint setup is looking for is on the last page of the list: it is found, not created
// again.
func TestSetupReadsEveryPage(t *testing.T) {
	a := newStripeAccount(t)
	a.endpoints.Add(setupURL, stripeclient.APIVersion, handledEventTypes()...)
	for i := range 120 {
		a.endpoints.Add("https://other.example/"+strings.Repeat("x", i+1), stripeclient.APIVersion, "charge.succeeded")
	}
	run := a.setup(t, setupOptions{})
	if run.code != 0 || !strings.Contains(run.stdout, "in sync") {
		t.Fatalf("exit %d, stdout %q", run.code, run.stdout)
	}
	if w := a.endpointWrites(); len(w) != 0 {
		t.Errorf("writes %+v, want none", w)
	}
	if pages := len(a.proxy.Filter(http.MethodGet, "/v1/webhook_endpoints")); pages != 2 {
		t.Errorf("%d list requests, want 2 pages of 100", pages)
	}
}

// --secret-file gets the secret, mode 0600, replacing what was there; stdout does not.
func TestSetupWritesTheSecretToAFile(t *testing.T) {
	a := newStripeAccount(t)
	path := filepath.Join(t.TempDir(), "webhook-secret")
	if err := os.WriteFile(path, []byte("old\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	run := a.setup(t, setupOptions{SecretFile: path})
	if run.code != 0 || strings.Contains(run.stdout, "whsec_") || !strings.Contains(run.stdout, path) {
		t.Fatalf("exit %d, stdout %q", run.code, run.stdout)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if s := string(b); !strings.HasPrefix(s, "whsec_") || !strings.HasSuffix(s, "\n") || strings.Count(s, "\n") != 1 {
		t.Errorf("file holds %q, want one whsec_ line", s)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if mode := fi.Mode().Perm(); mode != 0o600 {
		t.Errorf("file mode %o, want 600", mode)
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".billing-webhook-secret-*")); len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
	a.expectEndpoint(t)
}

// A secret file that cannot be written stops setup before anything is created.
func TestSetupChecksTheSecretFileFirst(t *testing.T) {
	a := newStripeAccount(t)
	run := a.setup(t, setupOptions{SecretFile: filepath.Join(t.TempDir(), "missing-dir", "secret")})
	if run.code != 2 || !strings.Contains(run.stderr, "--secret-file") {
		t.Fatalf("exit %d, stderr %q", run.code, run.stderr)
	}
	if n := len(a.proxy.Requests()); n != 0 {
		t.Errorf("%d requests to Stripe, want none", n)
	}
}

// An endpoint that differs is updated in place: the handled types exactly, enabled.
func TestSetupUpdatesAnEndpointThatDiffers(t *testing.T) {
	types := handledEventTypes()
	for _, tc := range []struct {
		name  string
		make  func(a *stripeAccount) string
		wants []string // in the update's description
	}{
		{"missing types and an extra one", func(a *stripeAccount) string {
			// payout.paid: a type the service does not handle.
			return a.endpoints.Add(setupURL, stripeclient.APIVersion, append(types[1:], "payout.paid")...)
		}, []string{"add " + types[0], "remove payout.paid"}},
		{"disabled", func(a *stripeAccount) string {
			id := a.endpoints.Add(setupURL, stripeclient.APIVersion, types...)
			a.endpoints.Disable(id)
			return id
		}, []string{"enable"}},
		{"every event", func(a *stripeAccount) string {
			return a.endpoints.Add(setupURL, stripeclient.APIVersion, "*")
		}, []string{"remove *"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newStripeAccount(t)
			a.addOtherEndpoints()
			id := tc.make(a)
			run := a.setup(t, setupOptions{})
			if run.code != 0 || !strings.Contains(run.stdout, "updated "+id) {
				t.Fatalf("exit %d, stdout %q", run.code, run.stdout)
			}
			for _, w := range tc.wants {
				if !strings.Contains(run.stdout, w) {
					t.Errorf("stdout %q does not say %q", run.stdout, w)
				}
			}
			if strings.Contains(run.stdout, "whsec_") {
				t.Errorf("an update printed a secret: %q", run.stdout)
			}
			writes := a.endpointWrites()
			if len(writes) != 1 || writes[0].Path != "/v1/webhook_endpoints/"+id {
				t.Errorf("writes %+v, want one update of %s", writes, id)
			}
			if ep := a.expectEndpoint(t); ep["id"] != id {
				t.Errorf("the endpoint is %v, want %s updated", ep["id"], id)
			}
		})
	}
}

// An endpoint in sync (its types in another order) is left alone: no write reaches Stripe.
func TestSetupLeavesAnEndpointInSyncAlone(t *testing.T) {
	a := newStripeAccount(t)
	reversed := slices.Clone(handledEventTypes())
	slices.Reverse(reversed)
	id := a.endpoints.Add(setupURL, stripeclient.APIVersion, reversed...)
	run := a.setup(t, setupOptions{SecretFile: filepath.Join(t.TempDir(), "secret")})
	if run.code != 0 || !strings.Contains(run.stdout, "in sync: "+id) {
		t.Fatalf("exit %d, stdout %q", run.code, run.stdout)
	}
	if w := a.endpointWrites(); len(w) != 0 {
		t.Errorf("writes %+v, want none", w)
	}
}

// A dry run says what it would do, exits 1 when that is a change and 0 when in sync, and
// writes nothing.
func TestSetupDryRun(t *testing.T) {
	types := handledEventTypes()
	for _, tc := range []struct {
		name string
		make func(a *stripeAccount)
		code int
		says string
	}{
		{"missing", func(a *stripeAccount) {}, 1, "would create"},
		{"differs", func(a *stripeAccount) { a.endpoints.Add(setupURL, stripeclient.APIVersion, types[1:]...) }, 1, "would update"},
		{"disabled", func(a *stripeAccount) {
			a.endpoints.Disable(a.endpoints.Add(setupURL, stripeclient.APIVersion, types...))
		}, 1, "would update"},
		{"in sync", func(a *stripeAccount) { a.endpoints.Add(setupURL, stripeclient.APIVersion, types...) }, 0, "in sync"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newStripeAccount(t)
			tc.make(a)
			before := a.endpoints.All()
			secret := filepath.Join(t.TempDir(), "secret")
			run := a.setup(t, setupOptions{DryRun: true, SecretFile: secret})
			if run.code != tc.code || !strings.Contains(run.stdout, tc.says) {
				t.Fatalf("exit %d, stdout %q; want %d saying %q", run.code, run.stdout, tc.code, tc.says)
			}
			if w := a.endpointWrites(); len(w) != 0 {
				t.Errorf("writes %+v, want none", w)
			}
			if after := a.endpoints.All(); len(after) != len(before) {
				t.Errorf("%d endpoints after a dry run, %d before", len(after), len(before))
			}
			if _, err := os.Stat(secret); !os.IsNotExist(err) {
				t.Errorf("a dry run wrote the secret file (stat: %v)", err)
			}
		})
	}
}

// Two endpoints with the URL are reported, with their ids, and neither is touched nor a third made.
func TestSetupRefusesTwoEndpointsWithTheURL(t *testing.T) {
	for _, dry := range []bool{false, true} {
		a := newStripeAccount(t)
		first := a.endpoints.Add(setupURL, stripeclient.APIVersion, handledEventTypes()...)
		a.addOtherEndpoints()
		second := a.endpoints.Add(setupURL, "", "invoice.paid")
		run := a.setup(t, setupOptions{DryRun: dry})
		if run.code != 2 || !strings.Contains(run.stderr, first) || !strings.Contains(run.stderr, second) {
			t.Fatalf("dry run %v: exit %d, stderr %q; want 2 naming %s and %s", dry, run.code, run.stderr, first, second)
		}
		if w := a.endpointWrites(); len(w) != 0 {
			t.Errorf("dry run %v: writes %+v, want none", dry, w)
		}
	}
}

// Stripe cannot change an endpoint's API version: setup explains the fix and exits 2, and only
// with --recreate deletes the endpoint and creates it anew, with a new secret.
func TestSetupAPIVersionDiffers(t *testing.T) {
	for _, version := range []string{"2023-10-16", ""} {
		a := newStripeAccount(t)
		old := a.endpoints.Add(setupURL, version, handledEventTypes()...)

		run := a.setup(t, setupOptions{})
		if run.code != 2 || !strings.Contains(run.stderr, "--recreate") || !strings.Contains(run.stderr, old) {
			t.Fatalf("version %q: exit %d, stderr %q; want 2 explaining --recreate", version, run.code, run.stderr)
		}
		dry := a.setup(t, setupOptions{Recreate: true, DryRun: true})
		if dry.code != 1 || !strings.Contains(dry.stdout, "would delete "+old) || !strings.Contains(dry.stdout, "would create") {
			t.Fatalf("version %q: dry run exit %d, stdout %q", version, dry.code, dry.stdout)
		}
		if w := a.endpointWrites(); len(w) != 0 {
			t.Fatalf("version %q: writes before --recreate: %+v", version, w)
		}

		re := a.setup(t, setupOptions{Recreate: true})
		if re.code != 0 || !strings.Contains(re.stdout, "deleted "+old) || strings.Count(re.stdout, "whsec_") != 1 {
			t.Fatalf("version %q: exit %d, stdout %q", version, re.code, re.stdout)
		}
		if ep := a.expectEndpoint(t); ep["id"] == old {
			t.Errorf("version %q: the old endpoint is still there", version)
		}
		if n := len(a.endpoints.All()); n != 1 {
			t.Errorf("version %q: %d endpoints, want 1", version, n)
		}
	}
}

// A URL Stripe cannot deliver to is refused before any call.
func TestSetupRefusesABadURL(t *testing.T) {
	for _, tc := range []struct{ url, mode string }{
		{"billing.example/webhooks/stripe", "test"},
		{"ftp://billing.example/webhooks/stripe", "test"},
		{"http://billing.example/webhooks/stripe", "live"},
	} {
		a := newStripeAccount(t)
		run := a.setup(t, setupOptions{URL: tc.url, Mode: tc.mode})
		if run.code != 2 || !strings.Contains(run.stderr, "--url") {
			t.Errorf("%s (%s): exit %d, stderr %q", tc.url, tc.mode, run.code, run.stderr)
		}
		if n := len(a.proxy.Requests()); n != 0 {
			t.Errorf("%s: %d requests to Stripe", tc.url, n)
		}
	}
}

// An error from Stripe is an exit 2 with what Stripe said.
func TestSetupReportsStripeErrors(t *testing.T) {
	a := newStripeAccount(t)
	a.proxy.Respond(http.MethodPost, "/v1/webhook_endpoints", 1, func(stripeemu.Request) stripeemu.Answer {
		return stripeemu.Answer{Status: 400, Body: map[string]any{"error": map[string]any{
			"type": "invalid_request_error", "message": "Invalid URL: URL must be publicly accessible.",
		}}}
	})
	run := a.setup(t, setupOptions{})
	if run.code != 2 || !strings.Contains(run.stderr, "publicly accessible") {
		t.Fatalf("exit %d, stderr %q", run.code, run.stderr)
	}
	if n := len(a.endpoints.All()); n != 0 {
		t.Errorf("%d endpoints", n)
	}
}

// The operations guide's list of handled event types is the code's.
func TestDocsListTheHandledEventTypes(t *testing.T) {
	const doc = "docs/operations.md"
	b, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "<!-- handled event types:")
	list, _, ok2 := strings.Cut(rest, "<!-- end of handled event types -->")
	if !ok || !ok2 {
		t.Fatalf("%s has no marked list of handled event types", doc)
	}
	var listed []string
	for _, line := range strings.Split(list, "\n") {
		if typ, found := strings.CutPrefix(strings.TrimSpace(line), "- `"); found {
			listed = append(listed, strings.TrimSuffix(typ, "`"))
		}
	}
	slices.Sort(listed)
	if want := handledEventTypes(); !slices.Equal(listed, want) {
		t.Errorf("%s lists %v, the code handles %v", doc, listed, want)
	}
}
