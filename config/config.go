// Package config loads and validates the billing service configuration.
//
// Precedence (lowest to highest): built-in defaults, an optional YAML file,
// then the environment. Environment names are BILLING_ + the dotted key
// upper-cased with "." replaced by "_" (stripe.webhook_secrets.test →
// BILLING_STRIPE_WEBHOOK_SECRETS_TEST). Every secret key K can also be read
// from a file named by BILLING_<K>_FILE (or the YAML key "<k>_file").
//
// As with viper's AutomaticEnv, an environment variable set to the empty
// string counts as unset.
package config

import (
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/viper"

	"billing/internal/database"
)

const envPrefix = "BILLING"

// ConfigEnv names the environment variable consulted when Load gets no path.
const ConfigEnv = "BILLING_CONFIG"

// Config is the complete service configuration. Fields holding secrets are
// marked; LogValue never prints them.
type Config struct {
	HTTP struct {
		Addr string
		// DebugAddr, when set, serves Go's profiler (net/http/pprof) on a loopback address of its
		// own, never on the API's listener: profiles name code paths and goroutine dumps carry
		// request URLs.
		DebugAddr string
	}
	Database struct {
		URL string // secret: may embed a password; empty means embedded database
		// PoolSize caps the connections the process opens; 0 sizes the pool from the shares
		// (PoolShares). A set value must hold them.
		PoolSize int
	}
	Stripe struct {
		Mode           string // "test" or "live"
		SecretKey      string // secret
		APIURL         string
		WebhookSecrets struct {
			Test, Live []string // secrets
		}
		WebhookTolerance time.Duration
		// MaxConcurrentCalls bounds the app's requests that call Stripe at once (each holds a
		// database connection for its call); beyond it they are answered 503 busy.
		MaxConcurrentCalls int
	}
	Auth struct {
		APITokens, AdminTokens []string // secrets
	}
	Portal struct {
		ReturnURL string
	}
	Checkout struct {
		SuccessURL, CancelURL string
		// AutomaticTax: every Checkout session asks Stripe Tax to compute the tax.
		AutomaticTax bool
	}
	Worker struct {
		MaxAttempts int
		RetryDelay  time.Duration
		// RescueAfter is how long a job may stay running (its process died) before another
		// worker runs it again.
		RescueAfter time.Duration
		// Concurrency is how many events one process handles at once (River workers of the
		// webhooks queue); each holds one of the process's database connections while it works.
		Concurrency int
	}
	Webhooks struct {
		// Retention is how long processed and ignored events are kept; 0 keeps them forever.
		Retention time.Duration
		// ApplyInline applies a handled event in the transaction that stores it, before the 200;
		// the queue takes over only when that attempt fails.
		ApplyInline bool
		// GroupCommit is how many inline applies that arrive together may share one transaction
		// and its COMMIT (1: each has its own).
		GroupCommit int
		// BodyBudgetMiB bounds the MiB of delivery bodies held at once before their signature
		// is verified; deliveries beyond it are answered 503 busy.
		BodyBudgetMiB int
	}
	Reconcile struct {
		// Interval is how often serve reconciles with Stripe; 0 turns it off.
		Interval time.Duration
	}
	Usage struct {
		// ReportRate is how many meter events a second one replica's reporter sends at most.
		ReportRate int
		// ReviewAfter is how long after a usage record's first attempt the reporter still sends
		// it; past it, a record Stripe never acknowledged waits for an operator (needs_review).
		// It must stay under Stripe's 24-hour identifier window.
		ReviewAfter time.Duration
	}
	Policy struct {
		PastDueEntitled bool
		// PeriodGrace is how long past its period (or trial) end an active or trialing
		// subscription stays entitled without a renewal from Stripe.
		PeriodGrace time.Duration
		// PausedCollectionEntitled: whether an active subscription whose collection is paused
		// (pause_collection) keeps access.
		PausedCollectionEntitled bool
	}
	Mail struct {
		SMTPURL string // secret: may embed a password
		From    string
	}
	// AppEvents is the push of the app events to the app's endpoint (PushesAppEvents).
	AppEvents struct {
		// URL is the app's endpoint for pushed app events (absolute http:// or https://, no
		// credentials, no fragment); empty pushes nothing (the feed still fills).
		URL string
		// Secrets are Standard Webhooks signing secrets (whsec_ and the standard base64 of 24 to
		// 64 bytes), newest first. Every one of them signs each push: to rotate, add the new one
		// first, and remove the old one once the app trusts the new one.
		Secrets []string // secrets
		// Timeout is how long one push attempt waits for the app's answer.
		Timeout time.Duration
		// Concurrency is how many users' events one process pushes at once (River workers of
		// the app events queue); each holds one of the workers' connections while it works.
		Concurrency int
	}
	Log struct {
		Level  string
		Format string
	}
}

// InlineApplies is how many webhook events a process applies in their requests at once (the
// inbox's inline slots), when webhooks.apply_inline is on.
const InlineApplies = 16

// DefaultQueueWorkers is how many River workers run the default queue (Stripe re-reads, checkout
// syncs, reconcile and ledger jobs, notices queued by earlier builds) beside worker.concurrency's webhook workers.
const DefaultQueueWorkers = 5

// PoolShares is how the process's connections are shared out (database.PoolShares).
func (c *Config) PoolShares() database.PoolShares {
	s := database.PoolShares{StripeCalls: c.Stripe.MaxConcurrentCalls, Workers: c.Worker.Concurrency + DefaultQueueWorkers}
	if c.PushesAppEvents() {
		// The app events queue runs only when there is an endpoint to push to. A push holds no
		// connection while it waits for the app, but its statements do.
		s.Workers += c.AppEvents.Concurrency
	}
	if c.Webhooks.ApplyInline {
		s.InlineApplies = InlineApplies
	}
	return s
}

// PushesAppEvents reports whether app events are pushed to the app (app_events.url is set).
// Without it the feed still fills; nothing is pushed.
func (c *Config) PushesAppEvents() bool { return c.AppEvents.URL != "" }

// PoolSize is the size of the process's pool: database.pool_size, or the shares' size.
func (c *Config) PoolSize() int {
	if c.Database.PoolSize > 0 {
		return c.Database.PoolSize
	}
	return c.PoolShares().Size()
}

// secretKeys are the keys that hold secrets: each also reads its value from the file named by
// "<key>_file" (YAML) or BILLING_<KEY>_FILE (environment).
var secretKeys = []string{
	"database.url", "stripe.secret_key", "stripe.webhook_secrets.test", "stripe.webhook_secrets.live",
	"auth.api_tokens", "auth.admin_tokens", "mail.smtp_url", "app_events.secrets",
}

// EnvNames returns the environment variable of every configuration key, sorted (the secrets
// also read NAME_FILE).
func EnvNames() []string {
	out := make([]string, 0, len(defaults))
	for k := range defaults {
		out = append(out, envName(k))
	}
	slices.Sort(out)
	return out
}

// defaults are registered with viper so AutomaticEnv knows every key.
// Scalars are strings so that every layer goes through the same parsers.
var defaults = map[string]string{
	"http.addr":                   ":8080",
	"http.debug_addr":             "",
	"database.url":                "",
	"database.pool_size":          "0",
	"stripe.mode":                 "test",
	"stripe.secret_key":           "",
	"stripe.api_url":              "https://api.stripe.com",
	"stripe.webhook_secrets.test": "",
	"stripe.webhook_secrets.live": "",
	"stripe.webhook_tolerance":    "5m",
	"stripe.max_concurrent_calls": "16",
	"auth.api_tokens":             "",
	"auth.admin_tokens":           "",
	"portal.return_url":           "",
	"checkout.success_url":        "",
	"checkout.automatic_tax":      "false",
	"checkout.cancel_url":         "",
	"worker.max_attempts":         "3",
	"worker.retry_delay":          "30s",
	"worker.rescue_after":         "1m",
	"worker.concurrency":          "8",
	"webhooks.retention":          "2160h",
	"webhooks.apply_inline":       "true",
	"webhooks.body_budget_mib":    "32",
	"webhooks.group_commit":       "16",
	"reconcile.interval":          "6h",
	"usage.report_rate":           "20",
	"usage.review_after":          "20h",
	"policy.past_due_entitled":    "true",
	"policy.period_grace":         "2h",
	"mail.smtp_url":               "",
	"mail.from":                   "",
	"app_events.url":              "",
	"app_events.secrets":          "",
	"app_events.timeout":          "10s",
	"app_events.concurrency":      "16",
	"log.level":                   "info",
	"log.format":                  "json",
	// Whether an active subscription with collection paused keeps access (entitlements.Policy).
	"policy.paused_collection_entitled": "true",
}

// Load builds a Config from defaults, the YAML file at path (or at
// $BILLING_CONFIG when path is empty; no file if both are empty) and the
// environment, then validates it. All errors are *Error.
func Load(path string) (*Config, error) {
	// A fresh viper per call: no shared state, so Load is safe concurrently.
	v := viper.New()
	for k, d := range defaults {
		v.SetDefault(k, d)
	}
	v.SetEnvPrefix(envPrefix)
	v.SetEnvKeyReplacer(strings.NewReplacer(".", "_"))
	v.AutomaticEnv()

	if path == "" {
		path = os.Getenv(ConfigEnv)
	}
	if err := checkEnvNames(os.Environ()); err != nil {
		return nil, err
	}
	if path != "" {
		v.SetConfigFile(path)
		v.SetConfigType("yaml") // the file is YAML whatever its extension
		if err := v.ReadInConfig(); err != nil {
			return nil, errorf("config", "reading %s: %v", path, err)
		}
		if err := checkFileKeys(path); err != nil {
			return nil, err
		}
	}

	l := &loader{v: v}
	c := &Config{}
	c.HTTP.Addr = l.str("http.addr")
	c.HTTP.DebugAddr = loopbackAlias(l.str("http.debug_addr"))
	c.Database.URL = l.secret("database.url")
	c.Database.PoolSize = l.integer("database.pool_size")
	c.Stripe.Mode = strings.ToLower(l.str("stripe.mode"))
	c.Stripe.SecretKey = l.secret("stripe.secret_key")
	c.Stripe.APIURL = l.str("stripe.api_url")
	c.Stripe.WebhookSecrets.Test = l.secretList("stripe.webhook_secrets.test")
	c.Stripe.WebhookSecrets.Live = l.secretList("stripe.webhook_secrets.live")
	c.Stripe.WebhookTolerance = l.duration("stripe.webhook_tolerance")
	c.Stripe.MaxConcurrentCalls = l.integer("stripe.max_concurrent_calls")
	c.Auth.APITokens = l.secretList("auth.api_tokens")
	c.Auth.AdminTokens = l.secretList("auth.admin_tokens")
	c.Portal.ReturnURL = l.str("portal.return_url")
	c.Checkout.SuccessURL = l.str("checkout.success_url")
	c.Checkout.CancelURL = l.str("checkout.cancel_url")
	c.Checkout.AutomaticTax = l.boolean("checkout.automatic_tax")
	c.Worker.MaxAttempts = l.integer("worker.max_attempts")
	c.Worker.RetryDelay = l.duration("worker.retry_delay")
	c.Worker.RescueAfter = l.duration("worker.rescue_after")
	c.Worker.Concurrency = l.integer("worker.concurrency")
	c.Webhooks.Retention = l.duration("webhooks.retention")
	c.Webhooks.ApplyInline = l.boolean("webhooks.apply_inline")
	c.Webhooks.BodyBudgetMiB = l.integer("webhooks.body_budget_mib")
	c.Webhooks.GroupCommit = l.integer("webhooks.group_commit")
	c.Reconcile.Interval = l.duration("reconcile.interval")
	c.Usage.ReportRate = l.integer("usage.report_rate")
	c.Usage.ReviewAfter = l.duration("usage.review_after")
	c.Policy.PastDueEntitled = l.boolean("policy.past_due_entitled")
	c.Policy.PeriodGrace = l.duration("policy.period_grace")
	c.Policy.PausedCollectionEntitled = l.boolean("policy.paused_collection_entitled")
	c.Mail.SMTPURL = l.secret("mail.smtp_url")
	c.Mail.From = l.str("mail.from")
	c.AppEvents.URL = l.str("app_events.url")
	c.AppEvents.Secrets = l.secretList("app_events.secrets")
	c.AppEvents.Timeout = l.duration("app_events.timeout")
	c.AppEvents.Concurrency = l.integer("app_events.concurrency")
	c.Log.Level = strings.ToLower(l.str("log.level"))
	c.Log.Format = strings.ToLower(l.str("log.format"))
	if l.err != nil {
		return nil, l.err
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// WebhookSecrets returns the signing secrets for events of the given mode
// (Stripe's event.livemode). The result is a copy.
func (c *Config) WebhookSecrets(livemode bool) []string {
	if livemode {
		return slices.Clone(c.Stripe.WebhookSecrets.Live)
	}
	return slices.Clone(c.Stripe.WebhookSecrets.Test)
}
