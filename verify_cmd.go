package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"billing/billing"
	"billing/catalog"
	"billing/checkout"
	"billing/config"
	"billing/entitlements"
	"billing/internal/jobs"
	"billing/ledger"
	"billing/verify"
	"billing/webhooks"
)

// verifyCommand is `billing verify [--mode test|live] [--config PATH]`.
func verifyCommand(args []string) int {
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	return runVerifyCommand(ctx, args, os.Stdout, os.Stderr)
}

// runVerifyCommand recomputes the event-driven state from the stored log and compares it with the
// live tables: a line per difference and the summary line on stdout; exit 0 when equal, 1 on
// differences, 2 when the verification could not run.
func runVerifyCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("verify", flag.ContinueOnError)
	fs.SetOutput(stderr)
	mode := fs.String("mode", "", "test or live: the mode whose state is verified (default: stripe.mode)")
	strict := fs.Bool("strict", false, "kept for scripts: the when-it-began columns are compared like the rest (the replay follows the log's order)")
	cfgPath := fs.String("config", "", "YAML configuration file (default $BILLING_CONFIG)")
	help := commandHelp{
		Usage: "billing verify [--mode test|live] [--strict] [--config PATH]",
		About: "Recomputes the state that events drive (subscriptions, invoices, customers' deletion, the\n" +
			"settled status of charges and refunds) from the stored event log and the stored reads of\n" +
			"Stripe alone — the same handlers, in the order the log says they were applied, in a transaction that is\n" +
			"rolled back — and compares it with the live tables field by field. Changes nothing and\n" +
			"calls no one. stdout: a line per difference, then one summary line. Rows whose history\n" +
			"is no longer in the log (pruned by retention) are counted as unverifiable, not compared.\n" +
			"When-it-began columns, which the handlers infer from the order of application, are\n" +
			"compared like the rest: the replay follows that order.\n" +
			"Exit 0 when equal, 1 on differences, 2 when it could not run.",
		Env: configEnv("database.url holds the state and the log; stripe.mode is the mode verified"),
	}
	if code, done := parseFlagsTo(fs, help, args, stdout, stderr, true); done {
		return code
	}
	stopped := func(format string, args ...any) int {
		fmt.Fprintf(stderr, "billing verify: "+format+"\n", args...)
		return verify.ExitError
	}
	if *mode != "" && *mode != "test" && *mode != "live" {
		return stopped("--mode must be test or live, got %q", *mode)
	}
	cfg, err := config.Load(*cfgPath)
	if err != nil {
		return stopped("%s", err.Error())
	}
	if *mode == "" {
		*mode = cfg.Stripe.Mode
	}
	db, logger, release, problem := toolDatabase(ctx, cfg, stderr)
	if problem != "" {
		return stopped("%s", problem)
	}
	defer release()
	livemode := *mode == "live"
	// The handlers as serve builds them, minus everything that reaches out: jobs are discarded
	// (the transaction is rolled back anyway) and no Stripe client is given.
	policy := policyOf(cfg)
	subs := billing.New(billing.Deps{
		DB: db, Jobs: jobs.Discard{}, Logger: logger, Livemode: livemode, PeriodGrace: policy.PeriodGrace, Renewals: policy,
	})
	// No teller: the replay tells the app nothing.
	ents := entitlements.New(entitlements.Deps{DB: db, Billing: subs, Livemode: livemode, Policy: policy,
		Jobs: jobs.Discard{}, Logger: logger})
	reg := webhooks.NewRegistry()
	registerEventHandlers(reg, subs, ents,
		checkout.New(checkout.Deps{DB: db, Billing: subs, Entitlements: ents, Jobs: jobs.Discard{}, Livemode: livemode, Logger: logger}),
		ledger.New(ledger.Deps{DB: db, Livemode: livemode, Logger: logger}),
		catalog.New(catalog.Deps{DB: db, Livemode: livemode, Logger: logger}))
	rep, err := verify.Run(ctx, verify.Deps{DB: db, Registry: reg, Snapshots: subs, Livemode: livemode, Strict: *strict, Logger: logger}, stdout)
	if err != nil {
		return stopped("%v", err)
	}
	// Every change of what the app reads has its event: the live answers are the ones told.
	if err := rep.CheckAppEvents(ctx, db, livemode, time.Now(), ents.EntitlementAnswer, entitlements.NoneAnswer, stdout); err != nil {
		return stopped("%v", err)
	}
	fmt.Fprintln(stdout, rep.Line())
	return rep.ExitCode()
}
