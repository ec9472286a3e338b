package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/client"

	"billing/config"
	"billing/internal/database"
	"billing/internal/stripeclient"
	"billing/migrations"
)

// Each check is bounded, so that doctor and serve's start-up checks end when Stripe or the database
// hangs.
const (
	checkTimeout = 20 * time.Second
	// startupChecksTimeout bounds serve's background checks as a whole.
	startupChecksTimeout = 30 * time.Second
)

func doctorCommand(args []string) int {
	fs := flag.NewFlagSet("doctor", flag.ContinueOnError)
	endpointURL := fs.String("url", "", "also check the webhook endpoint with this URL, https://HOST/webhooks/stripe")
	cfgPath := fs.String("config", "", "YAML configuration file (default $BILLING_CONFIG)")
	help := commandHelp{
		Usage: "billing doctor [--url https://HOST/webhooks/stripe] [--config PATH]",
		About: "Checks the database, the Stripe key, the webhook secret, the webhook endpoint (with --url) and the\n" +
			"Customer Portal: one line per check, ok or FAIL with the fix; exit 0 when all pass, 1 otherwise.",
		Env: configEnv("the database, stripe.* keys and the webhook secrets are checked"),
	}
	if code, done := parseFlags(fs, help, args); done {
		return code
	}
	if fs.NArg() > 0 {
		return usageError(fs, help, fmt.Sprintf("billing doctor: unexpected argument %q", fs.Arg(0)))
	}
	cfg, err := config.Load(*cfgPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, err.Error())
		return exitUsage
	}
	useRunningService(cfg, os.Stderr)
	logger, flush := newLogger(cfg)
	defer flush()
	ctx := context.Background()

	opts := doctorOptions{Config: cfg, URL: *endpointURL, Types: handledEventTypes()}
	if cfg.Database.URL != "" {
		// Opened here rather than through openDatabase, to report the connection error itself.
		db, err := database.Open(ctx, cfg.Database.URL, logger)
		if err != nil {
			opts.DBErr = err
		} else {
			opts.DB = database.SQL(db)
			defer opts.DB.Close()
		}
	} else {
		// The embedded cluster, as serve and migrate use it.
		db, stop, _ := openDatabase(ctx, cfg, logger)
		if db == nil {
			opts.DBErr = errors.New("the embedded PostgreSQL cluster did not start (the log on stderr says why)")
		} else {
			defer stop()
			opts.DB = database.SQL(db)
		}
	}
	sc := stripeclient.New(cfg.Stripe.APIURL, cfg.Stripe.SecretKey, logger)
	return runDoctor(ctx, opts, sc, os.Stdout)
}

// doctorOptions are the inputs of runDoctor.
type doctorOptions struct {
	Config *config.Config
	// DB is the service's database; when nil, DBErr says why it could not be opened.
	DB    *sql.DB
	DBErr error
	// URL, when set, is the webhook endpoint to check.
	URL   string
	Types []string // the handled event types
}

// problem is a failed check: what is wrong, and how to fix it.
type problem struct{ what, fix string }

// checkResult is one check's outcome; problem is nil when it passed.
type checkResult struct {
	name    string
	problem *problem
}

// runDoctor runs every check and writes one line per check to out: "ok  <check>" or
// "FAIL <check>: <what is wrong> — <the fix>". It returns 0 when all pass, 1 otherwise.
func runDoctor(ctx context.Context, opts doctorOptions, sc *client.API, out io.Writer) int {
	results := append([]checkResult{{"database", checkDatabase(ctx, opts.DB, opts.DBErr)}},
		stripeChecks(ctx, opts.Config, sc, opts.URL, opts.Types)...)
	code := 0
	for _, r := range results {
		if r.problem == nil {
			fmt.Fprintf(out, "ok  %s\n", r.name)
			continue
		}
		code = exitFailure
		fmt.Fprintf(out, "FAIL %s: %s — %s\n", r.name, r.problem.what, r.problem.fix)
	}
	return code
}

// stripeChecks are the checks of the configuration against Stripe: the key, the webhook secret,
// the endpoint (when endpointURL is set) and the Customer Portal. serve runs them at start too.
func stripeChecks(ctx context.Context, cfg *config.Config, sc *client.API, endpointURL string, types []string) []checkResult {
	key := checkSecretKey(ctx, cfg, sc)
	results := []checkResult{
		{"stripe secret key", key},
		{"webhook secret", checkWebhookSecret(cfg)},
	}
	dependent := []checkResult{{name: "customer portal"}}
	if endpointURL != "" {
		dependent = append([]checkResult{{name: "webhook endpoint " + endpointURL}}, dependent...)
	}
	for i := range dependent {
		switch {
		case key != nil:
			dependent[i].problem = &problem{"not checked: the secret key does not work", "fix the stripe secret key check first"}
		case i == 0 && endpointURL != "":
			dependent[i].problem = checkEndpoint(ctx, sc, endpointURL, types)
		default:
			dependent[i].problem = checkPortal(ctx, sc)
		}
	}
	return append(results, dependent...)
}

func checkDatabase(ctx context.Context, db *sql.DB, openErr error) *problem {
	fix := "check database.url and that the PostgreSQL server runs and accepts the configured user"
	if db == nil {
		return &problem{fmt.Sprintf("cannot connect: %v", openErr), fix}
	}
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		return &problem{fmt.Sprintf("cannot connect: %v", err), fix}
	}
	pending, err := migrations.Pending(ctx, db)
	if err != nil {
		return &problem{fmt.Sprintf("cannot read the schema version: %v", err), "run `billing migrate`, and check that the configured user may read the database"}
	}
	if pending {
		return &problem{"the schema is not current: migrations are pending", "run `billing migrate` (serve also applies them at start)"}
	}
	return nil
}

// checkSecretKey makes one cheap authenticated call (the balance) and compares the mode Stripe
// answers in with stripe.mode: a key of the other mode would act on the other mode's objects.
func checkSecretKey(ctx context.Context, cfg *config.Config, sc *client.API) *problem {
	mode := cfg.Stripe.Mode
	fix := "set stripe.secret_key to a " + mode + "-mode key of the account (sk_" + mode + "_… or rk_" + mode + "_…; Dashboard → Developers → API keys)"
	k := cfg.Stripe.SecretKey
	if k == "" {
		return &problem{"stripe.secret_key is not set", fix}
	}
	if parts := strings.SplitN(k, "_", 3); len(parts) != 3 || parts[1] != mode {
		return &problem{"the key is not a " + mode + "-mode key but stripe.mode is " + mode, fix + ", or change stripe.mode"}
	}
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	params := &stripe.BalanceParams{}
	params.Context = ctx
	bal, err := sc.Balance.Get(params)
	var se *stripe.Error
	switch {
	case errors.As(err, &se) && se.HTTPStatusCode == http.StatusForbidden:
		// Authenticated: a restricted key without access to the balance still works.
		return nil
	case errors.As(err, &se) && se.HTTPStatusCode == http.StatusUnauthorized:
		return &problem{"Stripe refused the key (" + se.Msg + ")", fix}
	case err != nil:
		return &problem{describeStripeError(err), "check stripe.api_url (" + cfg.Stripe.APIURL + ") and the network path to it"}
	}
	if stripeMode := modeName(bal.Livemode); stripeMode != mode {
		return &problem{"Stripe answers this key in " + stripeMode + " mode but stripe.mode is " + mode, fix}
	}
	return nil
}

func checkWebhookSecret(cfg *config.Config) *problem {
	if len(cfg.WebhookSecrets(cfg.Stripe.Mode == "live")) > 0 {
		return nil
	}
	key := "stripe.webhook_secrets." + cfg.Stripe.Mode
	return &problem{
		key + " is empty: every " + cfg.Stripe.Mode + "-mode event would be refused",
		"run `billing stripe setup --url https://HOST/webhooks/stripe` and put the signing secret it prints in " + key,
	}
}

// checkEndpoint checks the endpoint with the URL: exactly one, enabled, of the pinned API version,
// receiving every handled type (others it may receive: they are acknowledged and ignored).
func checkEndpoint(ctx context.Context, sc *client.API, endpointURL string, types []string) *problem {
	setupWith := func(flags string) string { return "run `billing stripe setup --url " + endpointURL + flags + "`" }
	setup := setupWith("")
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	found, err := endpointsWithURL(ctx, sc, endpointURL)
	if err != nil {
		return &problem{"cannot list the webhook endpoints: " + describeStripeError(err), "check that the key may read webhook endpoints"}
	}
	switch len(found) {
	case 0:
		return &problem{"no webhook endpoint has this URL: Stripe sends the service no events", setup}
	case 1:
	default:
		ids := make([]string, len(found))
		for i, ep := range found {
			ids[i] = ep.ID
		}
		return &problem{fmt.Sprintf("%d endpoints have this URL (%s): each event is delivered %d times", len(found), strings.Join(ids, ", "), len(found)),
			"delete all but one (Dashboard → Developers → Webhooks), then " + setup}
	}
	ep := found[0]
	d := compareEndpoint(ep, types)
	if d.versionDiffers() {
		return &problem{fmt.Sprintf("%s renders events in API version %s, not %s: they are dead-lettered with api_version_mismatch", ep.ID, versionOrDefault(ep.APIVersion), stripeclient.APIVersion),
			setupWith(" --recreate") + " (Stripe cannot change an endpoint's version; the new endpoint has a new signing secret to configure)"}
	}
	var wrong []string
	if d.disabled {
		wrong = append(wrong, "it is disabled")
	}
	if len(d.missing) > 0 && !d.wildcard {
		wrong = append(wrong, "it does not receive "+strings.Join(d.missing, ", "))
	}
	if len(wrong) > 0 {
		return &problem{ep.ID + ": " + strings.Join(wrong, "; "), setup}
	}
	return nil
}

// checkPortal checks that the default Customer Portal configuration, which the service's portal
// sessions use, lets customers cancel: the cancel endpoint redirects to the portal's cancel flow.
func checkPortal(ctx context.Context, sc *client.API) *problem {
	fix := "enable \"Cancel subscriptions\" in the Customer Portal settings (Dashboard → Settings → Billing → Customer portal) and save"
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	params := &stripe.BillingPortalConfigurationListParams{IsDefault: stripe.Bool(true)}
	params.Context = ctx
	it := sc.BillingPortalConfigurations.List(params)
	var def *stripe.BillingPortalConfiguration
	for it.Next() {
		if c := it.BillingPortalConfiguration(); c.IsDefault && def == nil {
			def = c
		}
	}
	if err := it.Err(); err != nil {
		return &problem{"cannot list the Customer Portal configurations: " + describeStripeError(err), "check that the key may read the Customer Portal settings"}
	}
	if def == nil {
		return &problem{"the Customer Portal has no default configuration: portal sessions fail", fix}
	}
	if !def.Active {
		return &problem{"the default Customer Portal configuration " + def.ID + " is inactive", fix}
	}
	if def.Features == nil || def.Features.SubscriptionCancel == nil || !def.Features.SubscriptionCancel.Enabled {
		return &problem{"the default Customer Portal configuration " + def.ID + " does not let customers cancel subscriptions: the cancel redirect fails", fix}
	}
	return nil
}

func modeName(livemode bool) string {
	if livemode {
		return "live"
	}
	return "test"
}

// startupChecks runs the Stripe checks once for serve, bounded by startupChecksTimeout, and logs a
// warning for each failure. serve runs it in the background: Stripe being unreachable or set up
// wrongly must not keep the service from receiving webhooks.
func startupChecks(ctx context.Context, cfg *config.Config, sc *client.API, logger *slog.Logger) {
	ctx, cancel := context.WithTimeout(ctx, startupChecksTimeout)
	defer cancel()
	failed := 0
	for _, r := range stripeChecks(ctx, cfg, sc, "", handledEventTypes()) {
		if r.problem != nil {
			failed++
			logger.Warn("stripe check failed", "check", r.name, "problem", r.problem.what, "fix", r.problem.fix)
		}
	}
	if failed == 0 {
		logger.Info("stripe checks passed")
	}
}
