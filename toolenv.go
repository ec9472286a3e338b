package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"gorm.io/gorm"

	"billing/config"
	"billing/internal/database"
	"billing/internal/runenv"
	"billing/migrations"
)

// defaultStripeAPIURL is stripe.api_url when nothing configures it.
const defaultStripeAPIURL = "https://api.stripe.com"

// useRunningService points a tool (doctor, reconcile, verify) at the service `make run` runs,
// when the configuration names no database: its embedded cluster is already started by that
// serve, and starting it a second time fails (or, worse, tempts one to stop it). It fills only
// what the configuration leaves unset, and only in test mode: the dev Stripe's key and URL (the
// two go together: the dev key means nothing to api.stripe.com), and the test webhook secret.
// It says on w what it used, and answers whether it found a running service.
func useRunningService(cfg *config.Config, w io.Writer) bool {
	if cfg.Database.URL != "" || cfg.Stripe.Mode != "test" {
		return false
	}
	e, path, err := runenv.Find(workDir())
	if errors.Is(err, runenv.ErrNotRunning) {
		return false
	}
	if err != nil {
		fmt.Fprintf(w, "billing: ignoring %s: %v\n", path, err)
		return false
	}
	if e.DatabaseURL == "" {
		return false
	}
	cfg.Database.URL = e.DatabaseURL
	used := []string{"its database"}
	if cfg.Stripe.SecretKey == "" && e.StripeKey != "" && (cfg.Stripe.APIURL == "" || cfg.Stripe.APIURL == defaultStripeAPIURL) {
		cfg.Stripe.SecretKey, cfg.Stripe.APIURL = e.StripeKey, e.StripeURL
		used = append(used, "its Stripe ("+e.StripeURL+")")
	}
	if len(cfg.Stripe.WebhookSecrets.Test) == 0 && e.WebhookSecret != "" {
		cfg.Stripe.WebhookSecrets.Test = []string{e.WebhookSecret}
		used = append(used, "its webhook secret")
	}
	fmt.Fprintf(w, "billing: using the running `make run` service (pid %d, %s): %s\n", e.PID, path, strings.Join(used, ", "))
	return true
}

// workDir is where the tools look for the running service's file: the current directory and its
// parents, as `make run` writes it in the checkout.
func workDir() string {
	d, err := os.Getwd()
	if err != nil {
		return "."
	}
	return d
}

// triggerURL is the webhook endpoint trigger posts to by default: BILLING_HTTP_ADDR's port on
// localhost (the address serve listens on, when set), else the running `make run` service's, else
// localhost:8080.
func triggerURL() string {
	if addr := os.Getenv("BILLING_HTTP_ADDR"); addr != "" {
		return localURL(addr) + "/webhooks/stripe"
	}
	if e, _, err := runenv.Find(workDir()); err == nil && e.ServiceURL != "" {
		return strings.TrimRight(e.ServiceURL, "/") + "/webhooks/stripe"
	}
	return "http://localhost:8080/webhooks/stripe"
}

// toolDatabase is the preamble of the tools that read the service's database without changing
// its schema (verify, events tail): the running service's database under make run, the log, the
// database opened and its schema current. On failure it returns the one line to print (release
// is then a no-op); release closes the database and writes the log out.
func toolDatabase(ctx context.Context, cfg *config.Config, stderr io.Writer) (db *gorm.DB, logger *slog.Logger, release func(), problem string) {
	useRunningService(cfg, stderr)
	return openToolDatabase(ctx, cfg, false)
}

// openToolDatabase is toolDatabase after the running service's settings were taken: the log and
// the database, its schema current, or (migrate) brought up to date as serve would, for a tool
// that writes the state (reconcile).
func openToolDatabase(ctx context.Context, cfg *config.Config, migrate bool) (db *gorm.DB, logger *slog.Logger, release func(), problem string) {
	logger, flush := newLogger(cfg)
	db, stop, _ := openDatabase(ctx, cfg, logger)
	if db == nil {
		// The log says why; written out first, so that the line printed after it is the reason.
		flush()
		return nil, nil, func() {}, "cannot open the database (see the log line above)"
	}
	release = func() { stop(); flush() }
	if migrate {
		if err := migrations.Apply(ctx, database.SQL(db), logger); err != nil {
			release()
			return nil, nil, func() {}, "migrate: " + err.Error()
		}
		return db, logger, release, ""
	}
	pending, err := migrations.Pending(ctx, database.SQL(db))
	switch {
	case err != nil:
		release()
		return nil, nil, func() {}, "check the schema: " + err.Error()
	case pending:
		release()
		return nil, nil, func() {}, "the schema is not current: run billing migrate (or start serve) first"
	}
	return db, logger, release, ""
}
