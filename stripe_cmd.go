package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/client"

	"billing/config"
	"billing/internal/stripeclient"
)

// stripeCommand runs `billing stripe SUBCOMMAND`.
func stripeCommand(args []string) int {
	if len(args) > 0 && args[0] == "setup" {
		return stripeSetupCommand(args[1:])
	}
	const synopsis = "usage: billing stripe setup --url https://HOST/webhooks/stripe [--secret-file PATH] [--dry-run] [--recreate] [--config PATH]\n" +
		"       (billing stripe setup -h: what it does, its flags and environment)"
	if len(args) == 1 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
		fmt.Println(synopsis)
		return 0
	}
	fmt.Fprintln(os.Stderr, synopsis)
	return exitUsage
}

func stripeSetupHelp() commandHelp {
	return commandHelp{
		Usage: "billing stripe setup --url https://HOST/webhooks/stripe [flags]",
		About: "Makes sure exactly one webhook endpoint with that URL exists at Stripe (in the mode of\n" +
			"stripe.secret_key): enabled, API version " + stripeclient.APIVersion + ", and exactly the handled event types:\n  " +
			strings.Join(handledEventTypes(), "\n  "),
		Env: [][2]string{
			{config.ConfigEnv, "YAML configuration file (like --config); the whole configuration is validated"},
			{"BILLING_STRIPE_SECRET_KEY", "the key of the mode the endpoint serves"},
			{"BILLING_STRIPE_MODE", "test or live"},
			{"BILLING_STRIPE_API_URL", "the Stripe API"},
			{"BILLING_LOG_LEVEL", "debug, info, warn, error"},
			{"BILLING_LOG_FORMAT", "json or text"},
		},
	}
}

func stripeSetupCommand(args []string) int {
	fs := flag.NewFlagSet("stripe setup", flag.ContinueOnError)
	endpointURL := fs.String("url", "", "public URL of the service's webhook endpoint, https://HOST/webhooks/stripe (required)")
	secretFile := fs.String("secret-file", "", "write the signing secret of a created endpoint to this file (mode 0600) instead of printing it")
	dryRun := fs.Bool("dry-run", false, "only say what would change: exit 1 if something would, 0 if the endpoint is in sync")
	recreate := fs.Bool("recreate", false, "delete and create the endpoint when its API version is not "+stripeclient.APIVersion+" (a new signing secret)")
	cfgPath := fs.String("config", "", "YAML configuration file (default $BILLING_CONFIG)")
	help := stripeSetupHelp()
	if code, done := parseFlags(fs, help, args); done {
		return code
	}
	if *endpointURL == "" || fs.NArg() > 0 {
		return usageError(fs, help, "billing stripe setup: --url is required, and takes no arguments")
	}
	cfg, err := config.Load(*cfgPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, err.Error())
		return exitUsage
	}
	if cfg.Stripe.SecretKey == "" {
		fmt.Fprintln(os.Stderr, "billing stripe setup: stripe.secret_key is not set: the endpoint is made with the key of the mode it serves")
		return exitUsage
	}
	logger, flush := newLogger(cfg)
	defer flush()
	sc := stripeclient.New(cfg.Stripe.APIURL, cfg.Stripe.SecretKey, logger)
	return stripeSetup(context.Background(), setupOptions{
		URL: *endpointURL, SecretFile: *secretFile, DryRun: *dryRun, Recreate: *recreate,
		Mode: cfg.Stripe.Mode, Types: handledEventTypes(),
	}, sc, os.Stdout, os.Stderr)
}

// setupOptions are the inputs of stripeSetup.
type setupOptions struct {
	URL        string
	SecretFile string // empty: print the secret of a created endpoint
	DryRun     bool
	// Recreate deletes an endpoint of another API version and creates it anew: Stripe cannot change
	// the version of an endpoint, and a new endpoint has a new signing secret.
	Recreate bool
	Mode     string   // stripe.mode, the mode of the key: where the secret goes
	Types    []string // the handled event types
}

// stripeSetup converges the account's webhook endpoints for opts.URL to exactly one, enabled, of
// the pinned API version and exactly the handled types. Results go to stdout, errors to stderr.
// Exit codes: 0 done or in sync, 1 a dry run found something to change, 2 an error.
func stripeSetup(ctx context.Context, opts setupOptions, sc *client.API, stdout, stderr io.Writer) int {
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "billing stripe setup: "+format+"\n", a...)
		return exitUsage
	}
	if err := checkEndpointURL(opts.URL, opts.Mode); err != nil {
		return fail("--url: %v", err)
	}
	secretKey := "stripe.webhook_secrets." + opts.Mode

	// The secret of a created endpoint cannot be read again: make sure it can be written before
	// anything is created.
	var secretOut *os.File
	if opts.SecretFile != "" && !opts.DryRun {
		f, err := os.CreateTemp(filepath.Dir(opts.SecretFile), ".billing-webhook-secret-*")
		if err != nil {
			return fail("--secret-file: %v", err)
		}
		secretOut = f
		defer func() {
			f.Close()
			os.Remove(f.Name())
		}()
	}

	found, err := endpointsWithURL(ctx, sc, opts.URL)
	if err != nil {
		return fail("list webhook endpoints: %s", describeStripeError(err))
	}
	if len(found) > 1 {
		ids := make([]string, len(found))
		for i, ep := range found {
			ids[i] = ep.ID
		}
		return fail("%d webhook endpoints have the URL %s (%s): Stripe would deliver every event to each of them. "+
			"Delete all but one (Dashboard → Developers → Webhooks, or `stripe webhook_endpoints delete ID`), then run this again",
			len(found), opts.URL, strings.Join(ids, ", "))
	}

	create := func() int {
		if opts.DryRun {
			fmt.Fprintf(stdout, "would create a webhook endpoint for %s (%s mode, api_version %s, events: %s)\n",
				opts.URL, opts.Mode, stripeclient.APIVersion, strings.Join(opts.Types, ", "))
			return exitFailure
		}
		params := &stripe.WebhookEndpointParams{
			URL:           stripe.String(opts.URL),
			APIVersion:    stripe.String(stripeclient.APIVersion),
			EnabledEvents: stripe.StringSlice(opts.Types),
			Description:   stripe.String("billing service (managed by `billing stripe setup`)"),
		}
		params.Context = ctx
		ep, err := sc.WebhookEndpoints.New(params)
		if err != nil {
			return fail("create the webhook endpoint: %s", describeStripeError(err))
		}
		fmt.Fprintf(stdout, "created %s for %s (%s mode, api_version %s, events: %s)\n",
			ep.ID, ep.URL, opts.Mode, ep.APIVersion, strings.Join(ep.EnabledEvents, ", "))
		if secretOut == nil {
			fmt.Fprintf(stdout, "signing secret (shown only now; put it first in %s): %s\n", secretKey, ep.Secret)
			return 0
		}
		if err := writeSecret(secretOut, opts.SecretFile, ep.Secret); err != nil {
			return fail("the endpoint %s was created, but its signing secret could not be written: %v. "+
				"Stripe does not show it again through the API: reveal it in the Dashboard (Developers → Webhooks → %s), "+
				"or delete the endpoint and run this again", ep.ID, err, ep.ID)
		}
		fmt.Fprintf(stdout, "signing secret written to %s (mode 0600); configure it as the first of %s (or %s_FILE=%s)\n",
			opts.SecretFile, secretKey, envName(secretKey), opts.SecretFile)
		return 0
	}
	if len(found) == 0 {
		return create()
	}

	ep := found[0]
	d := compareEndpoint(ep, opts.Types)
	if d.versionDiffers() {
		if !opts.Recreate {
			return fail("the endpoint %s renders events in API version %s, not %s (they would be dead-lettered with "+
				"api_version_mismatch), and Stripe cannot change the version of an endpoint. Run this again with --recreate: "+
				"it deletes %s and creates the endpoint anew, with a new signing secret to configure "+
				"(events meanwhile reach no endpoint; `billing reconcile` repairs what they changed)",
				ep.ID, versionOrDefault(ep.APIVersion), stripeclient.APIVersion, ep.ID)
		}
		if opts.DryRun {
			fmt.Fprintf(stdout, "would delete %s (api_version %s) and create it anew\n", ep.ID, versionOrDefault(ep.APIVersion))
			return create()
		}
		params := &stripe.WebhookEndpointParams{}
		params.Context = ctx
		if _, err := sc.WebhookEndpoints.Del(ep.ID, params); err != nil {
			return fail("delete %s: %s", ep.ID, describeStripeError(err))
		}
		fmt.Fprintf(stdout, "deleted %s (api_version %s)\n", ep.ID, versionOrDefault(ep.APIVersion))
		return create()
	}
	if d.inSync() {
		fmt.Fprintf(stdout, "in sync: %s for %s (%s mode, api_version %s, %d event types)\n",
			ep.ID, ep.URL, opts.Mode, ep.APIVersion, len(opts.Types))
		return 0
	}
	if opts.DryRun {
		fmt.Fprintf(stdout, "would update %s: %s\n", ep.ID, d)
		return exitFailure
	}
	params := &stripe.WebhookEndpointParams{EnabledEvents: stripe.StringSlice(opts.Types)}
	if d.disabled {
		params.Disabled = stripe.Bool(false)
	}
	params.Context = ctx
	if _, err := sc.WebhookEndpoints.Update(ep.ID, params); err != nil {
		return fail("update %s: %s", ep.ID, describeStripeError(err))
	}
	fmt.Fprintf(stdout, "updated %s: %s\n", ep.ID, d)
	return 0
}

// checkEndpointURL accepts an absolute URL that Stripe can deliver to: https, or http in test mode.
func checkEndpointURL(raw, mode string) error {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return fmt.Errorf("%q is not an absolute http(s) URL", raw)
	}
	if u.Scheme != "https" && mode == "live" {
		return fmt.Errorf("%q: live-mode endpoints must be https", raw)
	}
	return nil
}

// endpointsWithURL lists every endpoint of the account (every page) and keeps those with the URL.
func endpointsWithURL(ctx context.Context, sc *client.API, endpointURL string) ([]*stripe.WebhookEndpoint, error) {
	params := &stripe.WebhookEndpointListParams{}
	params.Limit = stripe.Int64(100)
	params.Context = ctx
	var out []*stripe.WebhookEndpoint
	it := sc.WebhookEndpoints.List(params)
	for it.Next() {
		if ep := it.WebhookEndpoint(); ep.URL == endpointURL {
			out = append(out, ep)
		}
	}
	return out, it.Err()
}

// endpointDiff is how an endpoint differs from the one the service needs.
type endpointDiff struct {
	disabled   bool
	apiVersion string // the endpoint's; "" when Stripe renders its events in the account's default
	missing    []string
	extra      []string
	// wildcard: the endpoint receives every event type ("*"), the handled ones included.
	wildcard bool
}

func compareEndpoint(ep *stripe.WebhookEndpoint, types []string) endpointDiff {
	d := endpointDiff{disabled: ep.Status != "enabled", apiVersion: ep.APIVersion}
	for _, t := range types {
		if !slices.Contains(ep.EnabledEvents, t) {
			d.missing = append(d.missing, t)
		}
	}
	for _, t := range ep.EnabledEvents {
		if t == "*" {
			d.wildcard = true
		}
		if !slices.Contains(types, t) {
			d.extra = append(d.extra, t)
		}
	}
	return d
}

func (d endpointDiff) versionDiffers() bool { return d.apiVersion != stripeclient.APIVersion }

// inSync: the endpoint is exactly what setup makes.
func (d endpointDiff) inSync() bool {
	return !d.disabled && !d.versionDiffers() && len(d.missing) == 0 && len(d.extra) == 0
}

// String describes what an update changes.
func (d endpointDiff) String() string {
	var parts []string
	if d.disabled {
		parts = append(parts, "enable it (it is disabled)")
	}
	if len(d.missing) > 0 {
		parts = append(parts, "add "+strings.Join(d.missing, ", "))
	}
	if len(d.extra) > 0 {
		parts = append(parts, "remove "+strings.Join(d.extra, ", "))
	}
	return strings.Join(parts, "; ")
}

func versionOrDefault(v string) string {
	if v == "" {
		return "none (the account's default)"
	}
	return v
}

// writeSecret writes the secret to f, a new file of mode 0600 beside path, and renames it to path,
// so that path never holds a partial secret nor, for a moment, one readable by others.
func writeSecret(f *os.File, path, secret string) error {
	if _, err := f.WriteString(secret + "\n"); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// envName is the environment variable of a configuration key.
func envName(key string) string {
	return "BILLING_" + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

// describeStripeError says what Stripe answered, or that it could not be reached; stripe-go's own
// message may hold a whole answer.
func describeStripeError(err error) string {
	var se *stripe.Error
	if errors.As(err, &se) {
		if se.Msg != "" {
			return fmt.Sprintf("Stripe answered %d (%s): %s", se.HTTPStatusCode, se.Type, se.Msg)
		}
		return fmt.Sprintf("Stripe answered %d (%s)", se.HTTPStatusCode, se.Type)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "Stripe did not answer in time"
	}
	return "cannot reach Stripe: " + err.Error()
}
