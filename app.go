package main

// The composition root: the service assembled from its parts (the HTTP server, the webhook inbox,
// the domain packages and River) on one database pool. It lives in package main, above every
// package it wires; the end-to-end tests in test/ run this binary, so they exercise this wiring.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/riverqueue/river"
	"gorm.io/gorm"

	"billing/admin"
	"billing/appevents"
	"billing/billing"
	"billing/catalog"
	"billing/checkout"
	"billing/config"
	"billing/customers"
	"billing/entitlements"
	"billing/internal/audit"
	"billing/internal/auth"
	"billing/internal/database"
	"billing/internal/httpserver"
	"billing/internal/jobs"
	"billing/internal/logging"
	"billing/internal/mail"
	"billing/internal/stripeclient"
	"billing/ledger"
	"billing/migrations"
	"billing/notices"
	"billing/openapi"
	"billing/portal"
	"billing/reconcile"
	meterusage "billing/usage"
	"billing/webhooks"
)

// appOptions are the inputs of newApp.
type appOptions struct {
	Config *config.Config
	DB     *gorm.DB
	Logger *slog.Logger
	// Now is the clock of every component; nil means time.Now.
	Now func() time.Time
}

// App is the assembled service.
type App struct {
	Echo     *echo.Echo
	River    *river.Client[*sql.Tx]
	Inbox    *webhooks.Inbox
	DB       *gorm.DB
	Registry *prometheus.Registry
	// Events is the inbox's registry of event handlers.
	Events *webhooks.Registry
	log    *slog.Logger
	// stopRescuer ends the inbox's rescue loop.
	stopRescuer context.CancelFunc
	// Reconcile runs reconciliations (periodic and admin-started); Stop ends a run going.
	Reconcile *reconcile.Service
	// Usage reports usage records to Stripe (its reporter is one of the loops).
	Usage *meterusage.Service
	// AppEvents pushes app events (its push is one of the loops).
	AppEvents *appevents.Service
	// Notices mails the customer notices (one of the loops).
	Notices *notices.Sender
	loops   []*loop
}

// loop is a background loop that runs from Start to Stop and, when stopped, finishes the work
// it has in flight and records its outcome: the usage reporter, the app events' push, the
// notices' sender.
type loop struct {
	name string
	run  func(context.Context)
	stop context.CancelFunc
	done chan struct{}
}

// newApp wires the service. It starts nothing: Start runs the workers, and main serves Echo.
func newApp(opts appOptions) (*App, error) {
	cfg, db, logger := opts.Config, opts.DB, opts.Logger
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	sqlDB := database.SQL(db)
	// Every kind of work that can hold a connection for long has a bounded share of the pool
	// (Stripe calls by LimitConcurrency, inline applies by the inbox's slots, workers by River's
	// queues), and the pool holds them all with connections to spare: however slow Stripe is and
	// whatever the workers wait on, entitlement reads and webhook receipt find a connection.
	database.SizePool(sqlDB, cfg.PoolSize())

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// Package-level metrics of the parts that have no service object of their own to carry them.
	reg.MustRegister(stripeclient.Calls, ledger.Outcomes)
	reg.MustRegister(notices.Collectors()...)

	tokens := auth.New(cfg.Auth.APITokens, cfg.Auth.AdminTokens)
	e := httpserver.New(httpserver.Options{
		Logger:   logger,
		Registry: reg,
		Ready: func(ctx context.Context) error {
			if err := sqlDB.PingContext(ctx); err != nil {
				return errors.Join(httpserver.ErrNotReady{Reason: "database unreachable"}, err)
			}
			pending, err := migrations.Pending(ctx, sqlDB)
			if err != nil {
				return errors.Join(httpserver.ErrNotReady{Reason: "schema version unknown"}, err)
			}
			if pending {
				return httpserver.ErrNotReady{Reason: "schema not current: migrations pending"}
			}
			return nil
		},
	})
	// Requests that call Stripe are bounded to their share of the pool (config.PoolShares).
	v1 := e.Group("/v1", tokens.Require(auth.RoleApp, false),
		httpserver.LimitConcurrency(cfg.Stripe.MaxConcurrentCalls, 5*time.Second, httpserver.CallsStripe))
	adminAPI := e.Group("/admin", tokens.Require(auth.RoleAdmin, true))

	// The inbox and its handlers.
	registry := webhooks.NewRegistry()
	inbox := webhooks.New(webhooks.Config{
		DB:          db,
		Logger:      logger,
		Registry:    registry,
		TestSecrets: cfg.Stripe.WebhookSecrets.Test,
		LiveSecrets: cfg.Stripe.WebhookSecrets.Live,
		Tolerance:   cfg.Stripe.WebhookTolerance,
		MaxAttempts: cfg.Worker.MaxAttempts,
		RetryDelay:  cfg.Worker.RetryDelay,
		Retention:   cfg.Webhooks.Retention,
		ApplyInline: cfg.Webhooks.ApplyInline,
		GroupCommit: cfg.Webhooks.GroupCommit,
		// The inline applies' share of the pool (config.PoolShares).
		InlineConcurrency: config.InlineApplies,
		BodyBudget:        int64(cfg.Webhooks.BodyBudgetMiB) << 20,
		Metrics:           webhooks.NewMetrics(reg),
		Now:               now,
	})

	workers := river.NewWorkers()
	inbox.AddWorkers(workers)
	mailCfg := mail.Config{SMTPURL: cfg.Mail.SMTPURL, From: cfg.Mail.From}
	// The notices' jobs queued by earlier builds still find their worker.
	river.AddWorker(workers, notices.NewWorker(db, mailCfg, logger))
	// Checkout's subscription reads need the checkout service, which is built after the client.
	checkoutSync := checkout.NewSyncWorker()
	river.AddWorker(workers, checkoutSync)

	stripe := stripeclient.New(cfg.Stripe.APIURL, cfg.Stripe.SecretKey, logger)
	livemode := cfg.Stripe.Mode == "live"
	// Reconciliation compares with billing, which is built after the client; its periodic job
	// must be known to River before.
	rec := reconcile.New(reconcile.Deps{DB: db, Stripe: stripe, Livemode: livemode, Logger: logger, Registerer: reg,
		Interval: cfg.Reconcile.Interval, Now: now})
	rec.AddWorkers(workers)
	// The ledger finishes its pending rows by a periodic job, which River must know before.
	// App events are written by every package that changes what the app reads, pushed by the
	// push loop of every replica when app_events.url is set (Start).
	told, err := newAppEvents(cfg, db, livemode, logger, now, reg)
	if err != nil {
		return nil, err
	}
	told.AddWorkers(workers)
	charges := ledger.New(ledger.Deps{DB: db, Stripe: stripe, Livemode: livemode, Logger: logger, Now: now, AppEvents: told.Teller()})
	charges.AddWorkers(workers)
	queues := map[string]int{river.QueueDefault: config.DefaultQueueWorkers, webhooks.QueueWebhooks: cfg.Worker.Concurrency}

	riverClient, err := jobs.NewClient(sqlDB, jobs.ClientOptions{
		Workers: workers,
		// The workers' share of the pool (config.PoolShares).
		Queues:      queues,
		RescueAfter: cfg.Worker.RescueAfter,
		// Events are applied in their requests; the queues carry retries (30 s apart at least),
		// notices and Stripe reads, for which 200 ms more is nothing, and an idle replica then
		// polls PostgreSQL 10 times a second instead of 40.
		PollInterval: 200 * time.Millisecond,
		PeriodicJobs: slices.Concat(inbox.PeriodicJobs(), rec.PeriodicJobs(), charges.PeriodicJobs(), told.PeriodicJobs(),
			billing.PeriodicJobs()),
		Logger: slog.New(logging.Demote(logger.Handler(), ": Producer job counts")).With("component", "river"),
	})
	if err != nil {
		return nil, err
	}
	inbox.SetJobs(riverClient)
	inbox.RegisterGauges(reg, workers, riverClient.PeriodicJobs())

	// Domain packages: billing owns subscription state and handles its events, entitlements
	// decides access from it and keeps the customers' features; customers, the ledger and the
	// portal call out to Stripe.
	policy := policyOf(cfg)
	subs := billing.New(billing.Deps{
		DB:          db,
		Livemode:    livemode,
		Jobs:        riverClient,
		Logger:      logger,
		Now:         now,
		PeriodGrace: policy.PeriodGrace,
		Renewals:    policy,
		Reread:      billing.RereadDeps{Stripe: stripe.Subscriptions, Livemode: livemode},
		Registerer:  reg,
	})
	ents := entitlements.New(entitlements.Deps{
		DB: db, Billing: subs, Livemode: livemode, Policy: policy, Jobs: riverClient, Logger: logger, Now: now,
		Read:       entitlements.ReadDeps{Stripe: stripe.EntitlementsActiveEntitlements, Livemode: livemode},
		Registerer: reg, AppEvents: told.Teller(),
	})
	// Billing tells the app of its changes through the entitlements it does not import.
	subs.SetTeller(ents)
	told.SetRecheck(ents.TellUser)
	// The re-read worker needs the service, which needs the client: River looks workers up in
	// the bundle when it inserts or works a job, so adding it before Start is in time.
	subs.AddWorkers(workers)
	ents.AddWorkers(workers)
	rec.SetBilling(subs, ents)
	links := customers.NewHandlers(customers.Deps{DB: db, Accounts: ents, Stripe: stripe, Livemode: livemode, Logger: logger, Now: now})
	links.Mount(v1)
	// What the app sells: products, prices and their features, from events, reads and reconcile.
	sold := catalog.New(catalog.Deps{DB: db, Livemode: livemode, Features: stripe.ProductFeatures, Jobs: riverClient,
		Logger: logger, Now: now, Registerer: reg})
	sold.AddWorkers(workers)
	sold.Mount(v1)
	rec.SetCatalog(sold)
	sessions := checkout.New(checkout.Deps{
		DB: db, Stripe: stripe, Customers: links, Billing: subs, Entitlements: ents, Jobs: riverClient, Livemode: livemode,
		SuccessURL: cfg.Checkout.SuccessURL, CancelURL: cfg.Checkout.CancelURL, Logger: logger, Now: now,
		Prices: sold, AutomaticTax: cfg.Checkout.AutomaticTax,
	})
	sessions.Mount(v1)
	checkoutSync.Bind(sessions)
	registerEventHandlers(registry, subs, ents, sessions, charges, sold)
	charges.Mount(v1)
	portal.New(portal.Deps{DB: db, Stripe: stripe, Subscriptions: subs, Livemode: livemode, DefaultReturnURL: cfg.Portal.ReturnURL,
		Prices: sold, Now: now, Logger: logger}).Mount(v1)
	subs.MountAPI(v1)
	ents.MountAPI(v1)
	// Usage records are stored by the request and sent to Stripe by the reporter (Start).
	meters := meterusage.New(meterusage.Deps{DB: db, Stripe: stripe, Livemode: livemode, Periods: ents,
		ReviewAfter: cfg.Usage.ReviewAfter, ReportRate: float64(cfg.Usage.ReportRate), Registerer: reg, Logger: logger, Now: now,
		AppEvents: told.Teller()})
	meters.Mount(v1)
	told.Mount(v1)

	inbox.MountWebhook(e)
	// The API's description, for anyone (it describes no data).
	openapi.Mount(e)

	// The admin console reads billing (holds, subscriptions), the inbox (event log, dead letters,
	// replay), the ledger and the reconcile runs; the inbox's JSON event log and replay share its
	// /admin group.
	admin.New(admin.Deps{
		Holds: subs, DeadLetters: inbox, Events: inbox, Subscriptions: subs, Policy: ents, Charges: charges,
		Reconcile: rec, People: customers.NewDirectory(db), Accounts: subs, Runs: rec, Usage: meters,
		AppEvents: told, Audit: audit.NewLog(db), Catalog: sold, Livemode: livemode, Logger: logger, Now: now,
	}).Mount(adminAPI)
	inbox.MountAdmin(adminAPI)
	rec.MountAdmin(adminAPI)
	meters.MountAdmin(adminAPI)
	told.MountAdmin(adminAPI)

	return &App{Echo: e, River: riverClient, Inbox: inbox, DB: db, Registry: reg, Events: registry, log: logger, Reconcile: rec,
		Usage: meters, AppEvents: told, Notices: notices.NewSender(notices.SenderConfig{DB: db, Mail: mailCfg, Logger: logger, Now: now})}, nil
}

// Start runs the background workers.
func (a *App) Start(ctx context.Context) error {
	if err := a.River.Start(ctx); err != nil {
		return fmt.Errorf("start workers: %w", err)
	}
	rctx, cancel := context.WithCancel(ctx)
	a.stopRescuer = cancel
	go a.Inbox.RunRescuer(rctx)
	a.loops = []*loop{
		{name: "usage reporter", run: a.Usage.RunReporter},
		{name: "app events push", run: a.AppEvents.RunPush},
		{name: "notices sender", run: a.Notices.Run},
	}
	for _, l := range a.loops {
		var lctx context.Context
		lctx, l.stop = context.WithCancel(ctx)
		l.done = make(chan struct{})
		go func() {
			defer close(l.done)
			l.run(lctx)
		}()
	}
	return nil
}

// Stop finishes in-flight jobs (and cancels them if ctx ends first).
func (a *App) Stop(ctx context.Context) error {
	if a.stopRescuer != nil {
		a.stopRescuer()
	}
	// The loops finish what they have in flight (a meter event, a push within
	// app_events.timeout, a batch of notices) and record the answers.
	for _, l := range a.loops {
		l.stop()
	}
	for _, l := range a.loops {
		select {
		case <-l.done:
		case <-ctx.Done():
			a.log.Warn(l.name + " did not stop in time")
		}
	}
	if err := a.Reconcile.Stop(ctx); err != nil {
		a.log.Warn("reconcile run did not stop in time", "error", err)
	}
	if err := a.River.Stop(ctx); err != nil {
		a.log.Warn("workers did not finish in time; cancelling", "error", err)
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return a.River.StopAndCancel(cctx)
	}
	return nil
}

// newAppEvents builds the app events' service: the feed always, the push when app_events.url is set.
func newAppEvents(cfg *config.Config, db *gorm.DB, livemode bool, logger *slog.Logger, now func() time.Time,
	reg prometheus.Registerer) (*appevents.Service, error) {
	var push *appevents.PusherConfig
	if cfg.AppEvents.URL != "" {
		signer, err := appevents.NewSigner(cfg.AppEvents.Secrets)
		if err != nil {
			return nil, err
		}
		push = &appevents.PusherConfig{URL: cfg.AppEvents.URL, Signer: signer, Timeout: cfg.AppEvents.Timeout,
			Concurrency: cfg.AppEvents.Concurrency}
		// The url itself is in the configuration's line at start, redacted there.
		logger.Info("app events are pushed", "secrets", len(cfg.AppEvents.Secrets), "concurrency", cfg.AppEvents.Concurrency)
	}
	return appevents.New(appevents.Deps{DB: db, Livemode: livemode, Push: push, Logger: logger, Now: now, Registerer: reg}), nil
}

// policyOf is the entitlement policy of the configuration (policy.*), which billing's re-reads
// and the entitlements' answers share.
func policyOf(cfg *config.Config) entitlements.Policy {
	return entitlements.Policy{
		PastDueEntitled:          cfg.Policy.PastDueEntitled,
		PausedCollectionEntitled: cfg.Policy.PausedCollectionEntitled,
		PeriodGrace:              cfg.Policy.PeriodGrace,
	}
}
