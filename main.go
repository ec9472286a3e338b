// Command billing is the billing backend of the SaaS app: Stripe webhooks in, a local
// subscription state, and idempotent calls out to Stripe. See README.md.
//
//	billing serve   [--config PATH]   HTTP API, webhook endpoint and workers
//	billing migrate [--config PATH]   apply pending migrations and exit
//	billing trigger EVENT_TYPE [...]  post a signed sample event to a running service
//	billing --version                 version, commit and the pinned Stripe API version
//
// Every command prints its usage, flags and environment with -h.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"gorm.io/gorm"

	"billing/config"
	"billing/internal/auth"
	"billing/internal/database"
	"billing/internal/httpserver"
	"billing/internal/logging"
	"billing/internal/pgcluster"
	"billing/internal/runenv"
	"billing/internal/stripeclient"
	"billing/migrations"
)

// Exit codes: 1 for a runtime failure, 2 for a configuration or usage error.
const (
	exitFailure = 1
	exitUsage   = 2
)

// embeddedDir is where `serve` keeps its own PostgreSQL cluster when no database URL is set.
const embeddedDir = ".data/postgres"

func main() {
	os.Exit(run(os.Args[1:]))
}

func usage(w io.Writer) {
	fmt.Fprintln(w, `usage: billing <command> [flags]       (billing <command> -h: its flags and environment)
       billing --version

commands:
  serve     run the HTTP API, the webhook endpoint and the workers
  migrate   apply pending database migrations and exit
  trigger   post a signed sample event to a running service (billing trigger -h)
  stripe    stripe setup --url URL: create or correct the webhook endpoint at Stripe (billing stripe setup -h)
  doctor    check the database, the Stripe key and secrets, the endpoint and the portal (billing doctor -h)
  reconcile compare every subscription with Stripe and repair what differs (billing reconcile -h)
  verify    recompute the state from the stored event log and compare it with the tables (billing verify -h)
  events    events tail: print the app events (what the app is told) and follow new ones (billing events -h)
  dev       play a customer completing Checkout, or time passing, at the dev Stripe of make run (billing dev -h)`)
}

func run(args []string) int {
	if len(args) == 0 {
		usage(os.Stderr)
		return exitUsage
	}
	switch args[0] {
	case "serve":
		return serve(args[1:])
	case "migrate":
		return migrate(args[1:])
	case "trigger":
		return trigger(args[1:])
	case "stripe":
		return stripeCommand(args[1:])
	case "doctor":
		return doctorCommand(args[1:])
	case "reconcile":
		return reconcileCommand(args[1:])
	case "verify":
		return verifyCommand(args[1:])
	case "events":
		return eventsCommand(args[1:])
	case "dev":
		return devCommand(args[1:])
	case "-h", "-help", "--help", "help":
		usage(os.Stdout)
		return 0
	case "--version", "-version", "version":
		printVersion(os.Stdout)
		return 0
	}
	fmt.Fprintf(os.Stderr, "billing: unknown command %q\n", args[0])
	usage(os.Stderr)
	return exitUsage
}

var serveHelp = commandHelp{
	Usage: "billing serve [--config PATH]",
	About: "Runs the HTTP API, the webhook endpoint and the background workers; applies pending\n" +
		"migrations first. Without database.url it runs its own PostgreSQL under " + embeddedDir + ".\n" +
		"Stops gracefully on SIGTERM or SIGINT.",
	Env: configEnv("see docs/operations.md, Configuration, for every key"),
}

var migrateHelp = commandHelp{
	Usage: "billing migrate [--config PATH]",
	About: "Applies pending database migrations (the service's and River's) and exits. Without\n" +
		"database.url it migrates the embedded cluster under " + embeddedDir + ". On a terminal it shows\n" +
		"progress on one line; otherwise it logs a line per migration.",
	Env: [][2]string{
		{config.ConfigEnv, "YAML configuration file (like --config); the whole configuration is validated"},
		{"BILLING_DATABASE_URL", "the database to migrate (empty: the embedded cluster)"},
		{"BILLING_LOG_LEVEL", "debug, info, warn, error"},
		{"BILLING_LOG_FORMAT", "json or text"},
	},
}

// loadConfig parses the command's flags and the configuration, with serve's own requirements
// (tokens, a webhook secret) when serving; on failure it prints one line and returns the exit
// code (0 after -h).
func loadConfig(name string, help commandHelp, args []string, serving bool) (*config.Config, int) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	path := fs.String("config", "", "YAML configuration file (default $BILLING_CONFIG)")
	if code, done := parseFlags(fs, help, args); done {
		return nil, code
	}
	if fs.NArg() > 0 {
		return nil, usageError(fs, help, fmt.Sprintf("billing %s: unexpected argument %q", name, fs.Arg(0)))
	}
	cfg, err := config.Load(*path)
	if err == nil && serving {
		err = cfg.ValidateServe()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err.Error())
		return nil, exitUsage
	}
	return cfg, 0
}

// newLogger logs to stderr through a logging.Writer, so that no request waits for another's log
// line to be written; flush writes out what is queued (call it before exiting).
func newLogger(cfg *config.Config) (logger *slog.Logger, flush func()) {
	logger, _, flush = newLogWriter(cfg)
	return logger, flush
}

// newLogWriter is newLogger that also returns the log's writer, for output that must come out in
// order with the log lines.
func newLogWriter(cfg *config.Config) (logger *slog.Logger, out io.Writer, flush func()) {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.Log.Level))
	opts := &slog.HandlerOptions{Level: level}
	w := logging.NewWriter(os.Stderr, 0)
	flush = func() { _ = w.Close() }
	if cfg.Log.Format == "text" {
		return slog.New(slog.NewTextHandler(w, opts)), w, flush
	}
	return slog.New(slog.NewJSONHandler(w, opts)), w, flush
}

// openDatabase connects to the configured database, or starts the embedded cluster when none is
// configured. stop releases what it started.
func openDatabase(ctx context.Context, cfg *config.Config, logger *slog.Logger) (db *gorm.DB, stop func(), code int) {
	db, _, stop, code = openDatabaseURL(ctx, cfg, logger)
	return db, stop, code
}

// openDatabaseURL is openDatabase that also answers the embedded cluster's URL ("" when
// database.url is configured).
func openDatabaseURL(ctx context.Context, cfg *config.Config, logger *slog.Logger) (db *gorm.DB, embeddedURL string, stop func(), code int) {
	url := cfg.Database.URL
	stop = func() {}
	if url == "" {
		cluster, err := pgcluster.Start(ctx, pgcluster.Options{Dir: embeddedDir, Logger: logger})
		if errors.Is(err, pgcluster.ErrNoServer) {
			fmt.Fprintln(os.Stderr, "billing: "+err.Error())
			return nil, "", stop, exitUsage
		}
		if err != nil {
			logger.Error("start embedded PostgreSQL", "dir", embeddedDir, "error", err)
			return nil, "", stop, exitFailure
		}
		url = cluster.URL("postgres")
		embeddedURL = url
		logger.Info("no database.url configured: using the embedded PostgreSQL cluster", "dir", embeddedDir, "port", cluster.Port(),
			"psql", "psql '"+url+"'")
		stop = func() {
			sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := cluster.Stop(sctx); err != nil {
				logger.Error("stop embedded PostgreSQL", "error", err)
				return
			}
			logger.Info("embedded PostgreSQL stopped")
		}
	}
	db, err := database.Open(ctx, url, logger)
	if err != nil {
		logger.Error("cannot reach the database", "error", err)
		stop()
		return nil, "", func() {}, exitFailure
	}
	closeDB := func() {
		if sqlDB, err := db.DB(); err == nil {
			_ = sqlDB.Close()
		}
	}
	stopCluster := stop
	return db, embeddedURL, func() { closeDB(); stopCluster() }, 0
}

func migrate(args []string) int {
	cfg, code := loadConfig("migrate", migrateHelp, args, false)
	if cfg == nil {
		return code
	}
	logger, out, flush := newLogWriter(cfg)
	defer flush()
	ctx := context.Background()
	db, stop, code := openDatabase(ctx, cfg, logger)
	if db == nil {
		return code
	}
	defer stop()
	opts := migrations.Options{Logger: logger}
	if isTerminal(os.Stderr) {
		// A person watching: one line that says where the run is, instead of a line each.
		opts = migrations.Options{
			Progress: migrationProgress(out),
			Waiting:  func() { fmt.Fprintln(out, "waiting for another process's migration to finish …") },
		}
	}
	if err := migrations.ApplyWith(ctx, database.SQL(db), opts); err != nil {
		logger.Error("migrate", "error", err)
		return exitFailure
	}
	logger.Info("migrations up to date")
	return 0
}

func serve(args []string) int {
	cfg, code := loadConfig("serve", serveHelp, args, true)
	if cfg == nil {
		return code
	}
	logger, flush := newLogger(cfg)
	defer flush()
	ctx, cancelSignals := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancelSignals()

	logger.Info("starting billing", "config", cfg, "stripe_api_version", stripeclient.APIVersion)
	if cfg.Stripe.SecretKey == "" {
		logger.Warn("stripe.secret_key is not set: calls to Stripe will fail")
	}

	db, embeddedURL, stop, code := openDatabaseURL(ctx, cfg, logger)
	if db == nil {
		return code
	}
	defer stop()
	if err := migrations.Apply(ctx, database.SQL(db), logger); err != nil {
		logger.Error("migrate", "error", err)
		return exitFailure
	}

	a, err := newApp(appOptions{Config: cfg, DB: db, Logger: logger})
	if err != nil {
		logger.Error("assemble service", "error", err)
		return exitFailure
	}
	// Workers run on their own context: a signal stops them through Stop, which lets in-flight
	// jobs finish instead of cancelling them.
	if err := a.Start(context.WithoutCancel(ctx)); err != nil {
		logger.Error("start", "error", err)
		return exitFailure
	}

	// Timeouts and header limit come from httpserver, where they are kept consistent with the
	// handlers' outbound budget.
	srv := httpserver.NewHTTPServer(cfg.HTTP.Addr, a.Echo)
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.ListenAndServe() }()
	logger.Info("listening", "addr", cfg.HTTP.Addr)
	if embeddedURL != "" {
		// The dev loop's tools (doctor, reconcile, trigger, dev) find this service and its cluster
		// here instead of starting a second cluster on the same directory.
		if err := runenv.Write(runenv.File, devRunEnv(cfg, embeddedURL)); err != nil {
			logger.Warn("cannot write "+runenv.File+": doctor, reconcile, trigger and dev will not find this service", "error", err)
		} else {
			defer runenv.Remove(runenv.File, os.Getpid())
		}
	}
	var debugSrv *http.Server
	if cfg.HTTP.DebugAddr != "" {
		debugSrv = httpserver.NewDebugServer(cfg.HTTP.DebugAddr)
		go func() {
			// The profiler is a diagnostic: losing it is logged and never stops the service.
			if err := debugSrv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				logger.Error("profiler stopped", "addr", cfg.HTTP.DebugAddr, "error", err)
			}
		}()
		logger.Info("profiler listening", "addr", cfg.HTTP.DebugAddr, "path", "/debug/pprof/")
	}
	// Stripe's side of the setup is checked once in the background: a problem there is logged and
	// never keeps the service from receiving webhooks.
	go startupChecks(ctx, cfg, stripeclient.New(cfg.Stripe.APIURL, cfg.Stripe.SecretKey, logger), logger)

	exit := 0
	select {
	case <-ctx.Done():
		logger.Info("shutting down: signal received")
	case err := <-serveErr:
		logger.Error("http server stopped", "error", err)
		exit = exitFailure
	}

	// Stop accepting and let in-flight requests finish, and let in-flight jobs finish, at the
	// same time and each within its own budget: slow requests cannot use up the workers' time,
	// nor the reverse. Jobs that requests enqueue meanwhile are in the database and run later.
	const (
		httpDrain   = 20 * time.Second
		workerDrain = 20 * time.Second
	)
	var drained sync.WaitGroup
	drained.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), httpDrain)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			logger.Error("http shutdown", "error", err)
		}
	})
	drained.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), workerDrain)
		defer cancel()
		if err := a.Stop(ctx); err != nil {
			logger.Error("worker shutdown", "error", err)
		}
	})
	drained.Wait()
	if debugSrv != nil {
		_ = debugSrv.Close()
	}
	logger.Info("stopped")
	return exit
}

// localURL is the URL a tool on this machine reaches a listen address at: a wildcard or empty
// host is localhost.
func localURL(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		host, port = addr, "80"
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "localhost"
	}
	return "http://" + net.JoinHostPort(host, port)
}

// devRunEnv is what a serve on the embedded cluster tells the dev loop's tools. Secrets are
// written only in test mode: a live key or secret never lands in a file of the checkout.
func devRunEnv(cfg *config.Config, databaseURL string) runenv.Env {
	e := runenv.Env{PID: os.Getpid(), ServiceURL: localURL(cfg.HTTP.Addr), DatabaseURL: databaseURL,
		StripeURL: cfg.Stripe.APIURL}
	if cfg.Stripe.Mode != "test" {
		return e
	}
	if strings.HasPrefix(cfg.Stripe.SecretKey, "sk_test_") {
		e.StripeKey = cfg.Stripe.SecretKey
	}
	if len(cfg.Stripe.WebhookSecrets.Test) > 0 {
		e.WebhookSecret = cfg.Stripe.WebhookSecrets.Test[0]
	}
	if len(cfg.Auth.APITokens) > 0 {
		e.APIToken = cfg.Auth.APITokens[0]
	}
	if len(cfg.Auth.AdminTokens) > 0 {
		_, e.AdminToken = auth.SplitAdminToken(cfg.Auth.AdminTokens[0])
	}
	return e
}
