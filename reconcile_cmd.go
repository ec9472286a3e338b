package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverdatabasesql"

	"billing/appevents"
	"billing/billing"
	"billing/catalog"
	"billing/config"
	"billing/entitlements"
	"billing/internal/database"
	"billing/internal/stripeclient"
	"billing/reconcile"
)

// reconcileCommand is `billing reconcile [--dry-run] [--mode test|live] [--config PATH]`.
func reconcileCommand(args []string) int {
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	return runReconcileCommand(ctx, args, os.Stdout, os.Stderr)
}

// runReconcileCommand runs a reconciliation of the configured mode: a progress line per page on
// stderr, exactly one summary line on stdout (also when the run could not start), and the exit
// code of reconcile.Summary.ExitCode (2 for a run that stopped or could not start; 2 also for
// a usage error, after which no summary is printed).
func runReconcileCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("reconcile", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dry := fs.Bool("dry-run", false, "compare and report only; change nothing")
	mode := fs.String("mode", "", "test or live: must be stripe.mode, since the secret key decides the mode (default: stripe.mode)")
	cfgPath := fs.String("config", "", "YAML configuration file (default $BILLING_CONFIG)")
	help := commandHelp{
		Usage: "billing reconcile [--dry-run] [--mode test|live] [--config PATH]",
		About: "Lists every subscription of the Stripe account (the mode of stripe.secret_key), compares each with\n" +
			"the local state and repairs what differs through the code that applies events; links customers\n" +
			"to users by metadata.user_id. Then does the same with the catalog: every product and price\n" +
			"(archived ones too) and each product's features. On an empty database this is the backfill of\n" +
			"an existing account.\n" +
			"stderr: a line per page; stdout: one summary line. Exit 0 when nothing differs or all was\n" +
			"repaired, 1 when something still differs (a dry run's drift), 2 when the run stopped.",
		Env: configEnv("stripe.secret_key decides the account and mode; database.url holds the local state"),
	}
	if code, done := parseFlagsTo(fs, help, args, stdout, stderr, true); done {
		return code
	}
	stopped := func(format string, args ...any) int {
		fmt.Fprintf(stderr, "billing reconcile: "+format+"\n", args...)
		// The catalog's counts too: every summary line of the command has the same fields.
		fmt.Fprintln(stdout, reconcile.Summary{Errors: 1, Catalog: true}.Line())
		return reconcile.ExitStopped
	}
	if *mode != "" && *mode != "test" && *mode != "live" {
		return stopped("--mode must be test or live, got %q", *mode)
	}
	cfg, err := config.Load(*cfgPath)
	if err != nil {
		return stopped("%s", err.Error())
	}
	if *mode != "" && *mode != cfg.Stripe.Mode {
		return stopped("--mode %s does not match stripe.mode %s: the secret key decides the mode, so configure stripe.mode and a %s secret key to reconcile %s mode",
			*mode, cfg.Stripe.Mode, *mode, *mode)
	}
	useRunningService(cfg, stderr)
	if cfg.Stripe.SecretKey == "" {
		return stopped("stripe.secret_key is not set: nothing to list")
	}
	db, logger, release, problem := openToolDatabase(ctx, cfg, true)
	if problem != "" {
		return stopped("%s", problem)
	}
	defer release()
	sqlDB := database.SQL(db)
	// Insert-only: a snapshot may queue jobs (a re-read at the renewal) that serve runs.
	jobs, err := river.NewClient(riverdatabasesql.New(sqlDB), &river.Config{Logger: logger.With("component", "river")})
	if err != nil {
		return stopped("river client: %v", err)
	}
	sc := stripeclient.New(cfg.Stripe.APIURL, cfg.Stripe.SecretKey, logger)
	livemode := cfg.Stripe.Mode == "live"
	// As serve wires it, so that a repaired subscription gets its renewal's re-read planned and
	// the app is told of each repair that changes its answers (serve's workers push them).
	policy := policyOf(cfg)
	subs := billing.New(billing.Deps{
		DB: db, Livemode: livemode, Jobs: jobs, Logger: logger, PeriodGrace: policy.PeriodGrace, Renewals: policy,
		Reread: billing.RereadDeps{Stripe: sc.Subscriptions, Livemode: livemode},
	})
	ents := entitlements.New(entitlements.Deps{DB: db, Billing: subs, Livemode: livemode, Policy: policy, Jobs: jobs,
		Logger: logger, AppEvents: appevents.NewTeller(nil)})
	subs.SetTeller(ents)
	// The catalog's writes only: the run reads products, prices and features with its own client.
	sold := catalog.New(catalog.Deps{DB: db, Livemode: livemode, Logger: logger})
	rec := reconcile.New(reconcile.Deps{
		DB:           db,
		Stripe:       sc,
		Billing:      subs,
		Entitlements: ents,
		Catalog:      sold,
		Livemode:     livemode,
		Logger:       logger,
	})
	sum, err := rec.Run(ctx, reconcile.RunOptions{DryRun: *dry, Trigger: reconcile.TriggerCommand, Progress: stderr})
	if errors.Is(err, reconcile.ErrRunning) {
		return stopped("another reconcile run of %s mode is going (the periodic one of serve, or another command); try again when it has finished", cfg.Stripe.Mode)
	}
	if err != nil {
		return stopped("%v", err)
	}
	if sum.Err != nil {
		fmt.Fprintf(stderr, "billing reconcile: run %s stopped: %v\n", sum.RunID, sum.Err)
	}
	fmt.Fprintln(stdout, sum.Line())
	return sum.ExitCode()
}
