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
	"encoding/base64"
	"fmt"
	"log/slog"
	"net"
	"net/mail"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/spf13/viper"

	"billing/internal/auth"
	"billing/internal/database"
)

const envPrefix = "BILLING"

// ConfigEnv names the environment variable consulted when Load gets no path.
const ConfigEnv = "BILLING_CONFIG"

// MinTokenLength is the shortest accepted API or admin token, in characters: long enough that a
// random token cannot be guessed over the network.
const MinTokenLength = 32

// MinTokenDistinct is the fewest distinct characters an API or admin token may have: 32 copies of
// one character, or a word repeated, are long but guessable. A random token of 32 hex digits has
// about 14 (fewer than 8 once in hundreds of thousands).
const MinTokenDistinct = 8

// MinWebhookSecretLength is the shortest accepted webhook signing secret after its whsec_ prefix:
// Stripe's own are 32 characters (the Dashboard's) or 64 (the CLI's).
const MinWebhookSecretLength = 32

// MaxWebhookTolerance caps stripe.webhook_tolerance: a longer window only widens the time in
// which a captured signed request can be replayed.
const MaxWebhookTolerance = time.Hour

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

// DefaultQueueWorkers is how many River workers run the default queue (notices, Stripe re-reads,
// checkout syncs, reconcile and ledger jobs) beside worker.concurrency's webhook workers.
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

// Error is an invalid-configuration error. Key is the dotted config key (or
// "config" for problems with the file itself).
type Error struct {
	Key string
	Msg string
}

// Error renders "config: <key>: <msg>" ("config: <msg>" for the file itself), forced onto
// one line because main prints it verbatim before exiting.
func (e *Error) Error() string {
	if e.Key == "config" {
		return oneLine.Replace("config: " + e.Msg)
	}
	return oneLine.Replace("config: " + e.Key + ": " + e.Msg)
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

var oneLine = strings.NewReplacer("\r\n", " ", "\n", " ", "\r", " ")

func errorf(key, format string, args ...any) *Error {
	return &Error{Key: key, Msg: fmt.Sprintf(format, args...)}
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
	// Whether an active subscription with collection paused keeps access (billing.Policy).
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

// knownKey reports whether key (dotted, lower case) is a configuration key or a secret's _file.
func knownKey(key string) bool {
	if _, ok := defaults[key]; ok {
		return true
	}
	base, ok := strings.CutSuffix(key, "_file")
	return ok && slices.Contains(secretKeys, base)
}

// knownSection reports whether key is a section of keys (stripe, stripe.webhook_secrets).
func knownSection(key string) bool {
	for k := range defaults {
		if strings.HasPrefix(k, key+".") {
			return true
		}
	}
	return false
}

// checkFileKeys refuses a key of the YAML file that the service does not read: a misspelt key
// (stripe: {mod: live}) or block (databse:) would otherwise leave its default in force silently,
// and for database.url the default is a throwaway embedded cluster. A second reader sees the
// file's keys alone, without the defaults and the environment.
func checkFileKeys(path string) *Error {
	f := viper.New()
	f.SetConfigFile(path)
	f.SetConfigType("yaml")
	if err := f.ReadInConfig(); err != nil {
		return errorf("config", "reading %s: %v", path, err)
	}
	keys := f.AllKeys()
	slices.Sort(keys)
	for _, k := range keys {
		if knownKey(k) {
			continue
		}
		// An empty block ("database:" with every key commented out) sets nothing.
		if knownSection(k) {
			if f.Get(k) == nil {
				continue
			}
			return errorf(k, "in %s is a block of keys (%s.…), not a value", path, k)
		}
		return errorf(k, "unknown key in %s%s", path, suggest(k, fileKeys()))
	}
	return nil
}

// checkEnvNames refuses a BILLING_ variable that names no key (BILLING_STRIPE_MOD): the operator
// meant something by it. Empty ones are unset, as everywhere in the environment.
func checkEnvNames(environ []string) *Error {
	known := map[string]bool{ConfigEnv: true}
	for k := range defaults {
		known[envName(k)] = true
	}
	for _, k := range secretKeys {
		known[envName(k)+"_FILE"] = true
	}
	var unknown []string
	for _, kv := range environ {
		name, val, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, envPrefix+"_") && val != "" && !known[name] {
			unknown = append(unknown, name)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	slices.Sort(unknown)
	names := make([]string, 0, len(known))
	for n := range known {
		names = append(names, n)
	}
	return errorf(unknown[0], "unknown environment variable: no configuration key has this name%s", suggest(unknown[0], names))
}

// fileKeys lists every key a YAML file may set.
func fileKeys() []string {
	out := make([]string, 0, len(defaults)+len(secretKeys))
	for k := range defaults {
		out = append(out, k)
	}
	for _, k := range secretKeys {
		out = append(out, k+"_file")
	}
	return out
}

// suggest names the closest of candidates to name when it is a likely misspelling of it.
func suggest(name string, candidates []string) string {
	best, bestD := "", 3 // at most two edits away
	slices.Sort(candidates)
	for _, c := range candidates {
		if d := editDistance(strings.ToLower(name), strings.ToLower(c)); d < bestD {
			best, bestD = c, d
		}
	}
	if best == "" {
		return ""
	}
	return " (did you mean " + best + "?)"
}

// editDistance is the Levenshtein distance of a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// loader keeps the first parse error so Load can read every key linearly.
type loader struct {
	v   *viper.Viper
	err *Error
}

func (l *loader) fail(e *Error) {
	if l.err == nil {
		l.err = e
	}
}

func envName(key string) string {
	return envPrefix + "_" + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

// raw returns the value as text. YAML may yield ints/bools/lists; we
// stringify and parse ourselves so garbage is reported instead of zeroed.
func (l *loader) raw(key string) string {
	val := l.v.Get(key)
	switch t := val.(type) {
	case nil:
		return ""
	case string:
		return strings.TrimSpace(t)
	case []any:
		l.fail(errorf(key, "must be a single value, not a list"))
		return ""
	case map[string]any:
		l.fail(errorf(key, "must be a single value, not a map"))
		return ""
	default:
		return strings.TrimSpace(fmt.Sprint(t))
	}
}

func (l *loader) str(key string) string { return l.raw(key) }

func (l *loader) duration(key string) time.Duration {
	s := l.raw(key)
	d, err := time.ParseDuration(s)
	if err != nil {
		l.fail(errorf(key, "invalid duration %q (want e.g. 30s, 5m)", s))
	}
	return d
}

func (l *loader) integer(key string) int {
	s := l.raw(key)
	n, err := strconv.Atoi(s)
	if err != nil {
		l.fail(errorf(key, "invalid integer %q", s))
	}
	return n
}

func (l *loader) boolean(key string) bool {
	s := l.raw(key)
	b, err := strconv.ParseBool(s)
	if err != nil {
		l.fail(errorf(key, "invalid boolean %q (want true or false)", s))
	}
	return b
}

// secretSource resolves a secret's *_FILE variant. It returns the file
// contents and true if a file was named; otherwise the caller reads the key
// normally. Env beats YAML; naming both a value and a file at the same layer
// is ambiguous and rejected. Messages never include the secret itself.
func (l *loader) secretSource(key string) (string, bool) {
	if !slices.Contains(secretKeys, key) {
		panic("config: " + key + " is read as a secret but is not in secretKeys")
	}
	env := envName(key)
	fileEnv := env + "_FILE"
	var path, from string
	switch {
	case os.Getenv(fileEnv) != "":
		if os.Getenv(env) != "" {
			l.fail(errorf(key, "both %s and %s are set; use one", env, fileEnv))
			return "", true
		}
		path, from = os.Getenv(fileEnv), fileEnv
	case os.Getenv(env) != "":
		return "", false
	case l.v.InConfig(key + "_file"):
		if l.v.InConfig(key) {
			l.fail(errorf(key, "both %s and %s_file are set in the config file; use one", key, key))
			return "", true
		}
		path, from = l.v.GetString(key+"_file"), key+"_file"
	default:
		return "", false
	}
	b, err := os.ReadFile(path)
	if err != nil {
		l.fail(errorf(key, "reading %s: %v", from, err))
		return "", true
	}
	return strings.TrimRight(string(b), " \t\r\n"), true
}

func (l *loader) secret(key string) string {
	if s, ok := l.secretSource(key); ok {
		return s
	}
	return l.raw(key)
}

// secretList accepts a YAML list, or a string of comma-separated values
// (files may also separate with newlines). Blank entries are dropped.
func (l *loader) secretList(key string) []string {
	if s, ok := l.secretSource(key); ok {
		return splitList(s)
	}
	switch t := l.v.Get(key).(type) {
	case nil:
		return nil
	case []any:
		var out []string
		for _, e := range t {
			if s := strings.TrimSpace(fmt.Sprint(e)); s != "" {
				out = append(out, s)
			}
		}
		return out
	case []string:
		return splitList(strings.Join(t, ","))
	case string:
		return splitList(t)
	default:
		l.fail(errorf(key, "must be a list or a comma-separated string"))
		return nil
	}
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == '\n' }) {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// Validate checks every rule that holds for all commands and returns the first
// violation as *Error, or nil. Messages never echo secret values.
func (c *Config) Validate() error {
	if err := c.validate(); err != nil {
		return err // keep nil untyped below
	}
	return nil
}

// ValidateServe checks Validate's rules, then what serving needs and other commands
// (migrate, trigger) do not: API and admin tokens, and a webhook signing secret.
func (c *Config) ValidateServe() error {
	if err := c.validate(); err != nil {
		return err
	}
	if err := c.validateServe(); err != nil {
		return err
	}
	return nil
}

func (c *Config) validateServe() *Error {
	// Without tokens the API and the admin pages answer no one, and without a signing secret
	// every webhook is refused: a service that looks up but does nothing.
	if len(c.Auth.APITokens) == 0 {
		return errorf("auth.api_tokens", "is required to serve (the app backend's bearer tokens)")
	}
	if len(c.Auth.AdminTokens) == 0 {
		return errorf("auth.admin_tokens", "is required to serve (admins' bearer tokens)")
	}
	if len(c.Stripe.WebhookSecrets.Test) == 0 && len(c.Stripe.WebhookSecrets.Live) == 0 {
		// Name the key of the configured mode: that is the one an operator is most likely missing.
		return errorf("stripe.webhook_secrets."+c.Stripe.Mode,
			"is required to serve: set stripe.webhook_secrets.test or stripe.webhook_secrets.live")
	}
	// config.example.yaml's placeholders pass every shape check; served, they would be publicly
	// known credentials.
	for _, s := range []struct {
		key  string
		list []string
	}{
		{"auth.api_tokens", c.Auth.APITokens},
		{"auth.admin_tokens", c.Auth.AdminTokens},
		{"stripe.webhook_secrets.test", c.Stripe.WebhookSecrets.Test},
		{"stripe.webhook_secrets.live", c.Stripe.WebhookSecrets.Live},
		{"stripe.secret_key", []string{c.Stripe.SecretKey}},
	} {
		for i, v := range s.list {
			if strings.Contains(strings.ToUpper(v), placeholderMark) {
				return errorf(s.key, "entry %d is still the example configuration's placeholder; generate a real value", i+1)
			}
		}
	}
	return nil
}

// placeholderMark marks the values of config.example.yaml that must be replaced, in any case
// (an operator who types replace-me is just as public).
const placeholderMark = "REPLACE"

func (c *Config) validate() *Error {
	if _, _, err := net.SplitHostPort(c.HTTP.Addr); err != nil {
		return errorf("http.addr", "invalid listen address %q (want host:port or :port)", c.HTTP.Addr)
	}
	if c.HTTP.DebugAddr != "" {
		if err := checkLoopbackAddr(c.HTTP.DebugAddr); err != "" {
			return errorf("http.debug_addr", "%s", err)
		}
	}

	if err := checkDatabaseURL(c.Database.URL); err != nil {
		return err
	}

	if c.Stripe.Mode != "test" && c.Stripe.Mode != "live" {
		return errorf("stripe.mode", "must be test or live, got %q", c.Stripe.Mode)
	}
	if k := c.Stripe.SecretKey; k != "" {
		kind, mode, ok := stripeKeyParts(k)
		if !ok {
			return errorf("stripe.secret_key", "must be a Stripe secret (sk_…) or restricted (rk_…) key with a _test_ or _live_ part")
		}
		if mode != c.Stripe.Mode {
			return errorf("stripe.secret_key", "is a %s_%s_ key but stripe.mode is %s", kind, mode, c.Stripe.Mode)
		}
	}
	if c.Stripe.Mode == "live" && c.Database.URL == "" {
		// The embedded cluster lives in the working directory and is meant for development: live
		// payments must not depend on it.
		return errorf("database.url", "is required when stripe.mode is live (the embedded database is for development only)")
	}
	if err := checkHTTPURL("stripe.api_url", c.Stripe.APIURL); err != nil {
		return err
	}
	if u, _ := url.Parse(c.Stripe.APIURL); c.Stripe.Mode == "live" && u.Scheme != "https" {
		// The live secret key travels in every request's header.
		return errorf("stripe.api_url", "must be an https:// URL when stripe.mode is live")
	}
	for _, s := range []struct {
		key  string
		list []string
	}{
		{"stripe.webhook_secrets.test", c.Stripe.WebhookSecrets.Test},
		{"stripe.webhook_secrets.live", c.Stripe.WebhookSecrets.Live},
	} {
		for i, w := range s.list {
			if !strings.HasPrefix(w, "whsec_") {
				return errorf(s.key, "entry %d must be a whsec_… signing secret", i+1)
			}
			if len(w)-len("whsec_") < MinWebhookSecretLength {
				return errorf(s.key, "entry %d is too short: a whsec_ signing secret has at least %d characters after whsec_ (copy the whole secret from Stripe)",
					i+1, MinWebhookSecretLength)
			}
		}
	}
	// A secret in both lists would make its signature count for both modes: a test-signed
	// livemode=true event would be taken as live.
	for i, w := range c.Stripe.WebhookSecrets.Live {
		if slices.Contains(c.Stripe.WebhookSecrets.Test, w) {
			return errorf("stripe.webhook_secrets.live", "entry %d is also in stripe.webhook_secrets.test; each mode's endpoint has its own secret", i+1)
		}
	}
	// Each request calling Stripe holds a connection of its own share (database.PoolShares); the
	// bound keeps the whole pool, at every other maximum, under PostgreSQL's default
	// max_connections of 100.
	if c.Stripe.MaxConcurrentCalls < 1 || c.Stripe.MaxConcurrentCalls > 24 {
		return errorf("stripe.max_concurrent_calls", "must be between 1 and 24, got %d", c.Stripe.MaxConcurrentCalls)
	}
	if c.Stripe.WebhookTolerance <= 0 {
		return errorf("stripe.webhook_tolerance", "must be > 0, got %s", c.Stripe.WebhookTolerance)
	}
	if c.Stripe.WebhookTolerance > MaxWebhookTolerance {
		return errorf("stripe.webhook_tolerance", "must be at most %s, got %s", MaxWebhookTolerance, c.Stripe.WebhookTolerance)
	}

	// An empty token would let an empty bearer authenticate; a short one can be guessed. An admin
	// entry may be "name:TOKEN" (auth.SplitAdminToken): the rules hold for its token.
	adminTokens := make([]string, len(c.Auth.AdminTokens))
	adminNames := map[string]int{}
	for i, e := range c.Auth.AdminTokens {
		name, token := auth.SplitAdminToken(e)
		adminTokens[i] = token
		if name == "" {
			continue
		}
		if j, dup := adminNames[name]; dup {
			return errorf("auth.admin_tokens", "entries %d and %d have the same name %q; give each admin token its own name", j, i+1, name)
		}
		adminNames[name] = i + 1
	}
	for _, s := range []struct {
		key  string
		list []string
	}{
		{"auth.api_tokens", c.Auth.APITokens},
		{"auth.admin_tokens", adminTokens},
	} {
		for i, t := range s.list {
			if strings.TrimSpace(t) == "" {
				return errorf(s.key, "entry %d is empty", i+1)
			}
			if utf8.RuneCountInString(t) < MinTokenLength {
				return errorf(s.key, "entry %d is too short: tokens need at least %d characters", i+1, MinTokenLength)
			}
			if distinctRunes(t) < MinTokenDistinct {
				return errorf(s.key, "entry %d is not random: tokens need at least %d distinct characters (generate one with openssl rand -hex 32)", i+1, MinTokenDistinct)
			}
		}
	}
	// A token in both lists would authenticate as admin only, so the app backend holding it would
	// be refused: whoever configured it meant one role or the other.
	for i, t := range adminTokens {
		if slices.Contains(c.Auth.APITokens, t) || slices.Contains(c.Auth.APITokens, c.Auth.AdminTokens[i]) {
			return errorf("auth.admin_tokens", "entry %d is also in auth.api_tokens; a token must have one role", i+1)
		}
	}

	if c.Portal.ReturnURL != "" {
		if err := checkHTTPURL("portal.return_url", c.Portal.ReturnURL); err != nil {
			return err
		}
	}
	for _, u := range []struct{ key, url string }{
		{"checkout.success_url", c.Checkout.SuccessURL},
		{"checkout.cancel_url", c.Checkout.CancelURL},
	} {
		if u.url != "" {
			if err := checkHTTPURL(u.key, u.url); err != nil {
				return err
			}
		}
	}

	if c.Worker.MaxAttempts < 1 {
		return errorf("worker.max_attempts", "must be >= 1, got %d", c.Worker.MaxAttempts)
	}
	if c.Worker.RetryDelay <= 0 {
		return errorf("worker.retry_delay", "must be > 0, got %s", c.Worker.RetryDelay)
	}
	// Each worker holds a connection of the workers' share (database.PoolShares). More workers
	// did not process faster here (docs/benchmarks.md).
	if c.Worker.Concurrency < 1 || c.Worker.Concurrency > 32 {
		return errorf("worker.concurrency", "must be between 1 and 32, got %d", c.Worker.Concurrency)
	}
	// A pool smaller than its shares lets slow Stripe calls, stuck applies and busy workers take
	// every connection, and entitlement reads and webhook receipt wait behind them.
	if c.Database.PoolSize < 0 {
		return errorf("database.pool_size", "must be 0 (sized from the shares) or a number of connections, got %d", c.Database.PoolSize)
	}
	if sh := c.PoolShares(); c.Database.PoolSize != 0 && c.Database.PoolSize < sh.Size() {
		workers, lower := "worker.concurrency", "stripe.max_concurrent_calls or worker.concurrency"
		if c.PushesAppEvents() {
			workers, lower = "worker.concurrency + app_events.concurrency", "stripe.max_concurrent_calls, worker.concurrency or app_events.concurrency"
		}
		return errorf("database.pool_size", "%d connections cannot hold the shares: %d for stripe.max_concurrent_calls + %d inline webhook applies + %d workers (%s + %d) + %d background + %d kept for reads and webhook receipt = %d; raise it, or lower %s",
			c.Database.PoolSize, sh.StripeCalls, sh.InlineApplies, sh.Workers, workers, DefaultQueueWorkers, database.BackgroundConns, database.FreeConns, sh.Size(), lower)
	}
	if c.Worker.RescueAfter < time.Second {
		return errorf("worker.rescue_after", "must be at least 1s, got %s", c.Worker.RescueAfter)
	}
	// Shorter than a day would prune events an admin may still be looking into; 0 turns it off.
	if c.Webhooks.Retention != 0 && c.Webhooks.Retention < 24*time.Hour {
		return errorf("webhooks.retention", "must be 0 (keep forever) or at least 24h, got %s", c.Webhooks.Retention)
	}
	// At least one body of the largest size (1 MiB) must fit; beyond a GiB the bound no longer
	// protects a process's memory.
	if c.Webhooks.BodyBudgetMiB < 1 || c.Webhooks.BodyBudgetMiB > 1024 {
		return errorf("webhooks.body_budget_mib", "must be between 1 and 1024 (MiB), got %d", c.Webhooks.BodyBudgetMiB)
	}
	// A batch waits on its slowest event, and more applies than the inline slots never gather.
	if c.Webhooks.GroupCommit < 1 || c.Webhooks.GroupCommit > InlineApplies {
		return errorf("webhooks.group_commit", "must be between 1 (off) and %d (the inline applies in flight), got %d", InlineApplies, c.Webhooks.GroupCommit)
	}
	// A run lists the whole account; more often than a minute only spends Stripe's rate limit.
	if c.Reconcile.Interval != 0 && c.Reconcile.Interval < time.Minute {
		return errorf("reconcile.interval", "must be 0 (off) or at least 1m, got %s", c.Reconcile.Interval)
	}
	if c.Usage.ReportRate < 1 || c.Usage.ReportRate > 10000 {
		return errorf("usage.report_rate", "must be 1 to 10000 meter events a second, got %d", c.Usage.ReportRate)
	}
	// Stripe keeps an identifier for at least 24 hours after it first sees it; an hour of margin
	// covers clock skew and the calls still in flight when the window passes.
	if c.Usage.ReviewAfter <= 0 || c.Usage.ReviewAfter > 23*time.Hour {
		return errorf("usage.review_after", "must be more than 0 and at most 23h (under Stripe's 24-hour identifier window), got %s", c.Usage.ReviewAfter)
	}
	if c.Policy.PeriodGrace <= 0 {
		return errorf("policy.period_grace", "must be > 0, got %s", c.Policy.PeriodGrace)
	}

	if c.Mail.SMTPURL != "" {
		// url.Parse errors quote the input, which may hold a password: use
		// fixed messages only.
		u, err := url.Parse(c.Mail.SMTPURL)
		if err != nil || (u.Scheme != "smtp" && u.Scheme != "smtps") || u.Hostname() == "" {
			return errorf("mail.smtp_url", "must be an smtp://host[:port] or smtps://host[:port] URL")
		}
		if c.Mail.From == "" {
			return errorf("mail.from", "is required when mail.smtp_url is set")
		}
	}
	if c.Mail.From != "" {
		if _, err := mail.ParseAddress(c.Mail.From); err != nil {
			return errorf("mail.from", "invalid email address %q", c.Mail.From)
		}
	}
	if err := c.validateAppEvents(); err != nil {
		return err
	}

	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		return errorf("log.level", "must be debug, info, warn or error, got %q", c.Log.Level)
	}
	switch c.Log.Format {
	case "json", "text":
	default:
		return errorf("log.format", "must be json or text, got %q", c.Log.Format)
	}
	return nil
}

func distinctRunes(s string) int {
	seen := map[rune]bool{}
	for _, r := range s {
		seen[r] = true
	}
	return len(seen)
}

// stripeKeyParts splits "sk_test_…" into ("sk", "test"). ok is false for
// anything not shaped like a secret or restricted key.
func stripeKeyParts(k string) (kind, mode string, ok bool) {
	parts := strings.SplitN(k, "_", 3)
	if len(parts) != 3 || parts[2] == "" {
		return "", "", false
	}
	if parts[0] != "sk" && parts[0] != "rk" {
		return "", "", false
	}
	if parts[1] != "test" && parts[1] != "live" {
		return "", "", false
	}
	return parts[0], parts[1], true
}

// checkDatabaseURL accepts an empty value (the embedded cluster), a postgres:// or
// postgresql:// URL naming a host, or a keyword/value string ("host=db dbname=billing"), which
// the driver has always accepted. The driver's own parser decides what is well-formed, so
// nothing that connects today is refused. Messages are fixed: the value holds a password, and
// parse errors may quote it.
func checkDatabaseURL(s string) *Error {
	if s == "" {
		return nil
	}
	isURL := strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://")
	if _, err := pgconn.ParseConfig(s); err != nil {
		if isURL {
			return errorf("database.url", "is not a PostgreSQL URL the driver accepts (want postgres://user:password@host:port/dbname?param=value, special characters percent-encoded, a numeric port and known parameter values)")
		}
		return errorf("database.url", "must be a postgres:// or postgresql:// URL (postgres://user:password@host:port/dbname) or a keyword/value string (host=… dbname=…)")
	}
	if isURL && !urlNamesHost(s) {
		return errorf("database.url", "names no host (want postgres://user:password@host:port/dbname)")
	}
	return nil
}

// urlNamesHost reports whether a postgres:// URL the driver accepted names a host, in its
// authority (host[:port][,host[:port]…]) or as a host or hostaddr query parameter (a socket
// directory). Without one the driver would silently use PGHOST or a local socket.
func urlNamesHost(s string) bool {
	p, ok := strings.CutPrefix(s, "postgresql://")
	if !ok {
		p, _ = strings.CutPrefix(s, "postgres://")
	}
	// As the driver does: an '@' before the first '/' ends the user information.
	if i := strings.IndexAny(p, "@/"); i >= 0 && p[i] == '@' {
		p = p[i+1:]
	}
	authority, query := p, ""
	if i := strings.IndexAny(p, "/?"); i >= 0 {
		authority = p[:i]
		if j := strings.IndexByte(p, '?'); j >= 0 {
			query = p[j+1:]
		}
	}
	for _, hp := range strings.Split(authority, ",") {
		if strings.HasPrefix(hp, "[") {
			return true // an IPv6 address; the driver refuses an empty one
		}
		if host, _, _ := strings.Cut(hp, ":"); host != "" {
			return true
		}
	}
	for _, kv := range strings.Split(query, "&") {
		k, v, _ := strings.Cut(kv, "=")
		if (k == "host" || k == "hostaddr") && v != "" {
			return true
		}
	}
	return false
}

func checkHTTPURL(key, s string) *Error {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return errorf(key, "must be an absolute http:// or https:// URL, got %q", s)
	}
	return nil
}

// WebhookSecrets returns the signing secrets for events of the given mode
// (Stripe's event.livemode). The result is a copy.
func (c *Config) WebhookSecrets(livemode bool) []string {
	if livemode {
		return slices.Clone(c.Stripe.WebhookSecrets.Live)
	}
	return slices.Clone(c.Stripe.WebhookSecrets.Test)
}

// LogValue implements slog.LogValuer. Secrets appear only as "set"/"unset"
// (lists as a count); URLs that are not secrets still have userinfo redacted.
func (c *Config) LogValue() slog.Value {
	return slog.GroupValue(
		slog.Group("http", slog.String("addr", c.HTTP.Addr), slog.String("debug_addr", c.HTTP.DebugAddr)),
		slog.Group("database", slog.String("url", setness(c.Database.URL)), slog.Int("pool_size", c.PoolSize())),
		slog.Group("stripe",
			slog.String("mode", c.Stripe.Mode),
			slog.String("secret_key", setness(c.Stripe.SecretKey)),
			slog.String("api_url", redactURL(c.Stripe.APIURL)),
			slog.Group("webhook_secrets",
				slog.Int("test", len(c.Stripe.WebhookSecrets.Test)),
				slog.Int("live", len(c.Stripe.WebhookSecrets.Live)),
			),
			slog.String("webhook_tolerance", c.Stripe.WebhookTolerance.String()),
		),
		slog.Group("auth",
			slog.Int("api_tokens", len(c.Auth.APITokens)),
			slog.Int("admin_tokens", len(c.Auth.AdminTokens)),
		),
		slog.Group("portal", slog.String("return_url", redactURL(c.Portal.ReturnURL))),
		slog.Group("checkout",
			slog.String("success_url", redactURL(c.Checkout.SuccessURL)),
			slog.String("cancel_url", redactURL(c.Checkout.CancelURL)),
		),
		slog.Group("worker",
			slog.Int("max_attempts", c.Worker.MaxAttempts),
			slog.String("retry_delay", c.Worker.RetryDelay.String()),
			slog.String("rescue_after", c.Worker.RescueAfter.String()),
			slog.Int("concurrency", c.Worker.Concurrency),
		),
		slog.Group("webhooks", slog.String("retention", c.Webhooks.Retention.String()), slog.Bool("apply_inline", c.Webhooks.ApplyInline),
			slog.Int("body_budget_mib", c.Webhooks.BodyBudgetMiB), slog.Int("group_commit", c.Webhooks.GroupCommit)),
		slog.Group("reconcile", slog.String("interval", c.Reconcile.Interval.String())),
		slog.Group("usage", slog.Int("report_rate", c.Usage.ReportRate), slog.String("review_after", c.Usage.ReviewAfter.String())),
		slog.Group("policy", slog.Bool("past_due_entitled", c.Policy.PastDueEntitled),
			slog.String("period_grace", c.Policy.PeriodGrace.String()),
			slog.Bool("paused_collection_entitled", c.Policy.PausedCollectionEntitled)),
		slog.Group("app_events", slog.String("url", redactURL(c.AppEvents.URL)), slog.Int("secrets", len(c.AppEvents.Secrets)),
			slog.String("timeout", c.AppEvents.Timeout.String()), slog.Int("concurrency", c.AppEvents.Concurrency)),
		slog.Group("mail",
			slog.String("smtp_url", setness(c.Mail.SMTPURL)),
			slog.String("from", c.Mail.From),
		),
		slog.Group("log",
			slog.String("level", c.Log.Level),
			slog.String("format", c.Log.Format),
		),
	)
}

func setness(s string) string {
	if s == "" {
		return "unset"
	}
	return "set"
}

func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return s
	}
	return u.Redacted()
}

// loopbackAlias turns localhost:port into 127.0.0.1:port. localhost is loopback by definition, but
// listening on the name would resolve it (/etc/hosts, DNS), which may answer another address.
func loopbackAlias(addr string) string {
	if host, port, err := net.SplitHostPort(addr); err == nil && strings.EqualFold(host, "localhost") {
		return net.JoinHostPort("127.0.0.1", port)
	}
	return addr
}

// checkLoopbackAddr explains why addr is not a loopback host:port ("" when it is): the profiler
// must not be reachable from the network (reach it with a port forward or from the host).
func checkLoopbackAddr(addr string) string {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Sprintf("invalid listen address %q (want a loopback host:port such as 127.0.0.1:6060)", addr)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Sprintf("%q is not a loopback address: the profiler listens only on 127.0.0.1, ::1 or localhost (taken as 127.0.0.1)", addr)
	}
	return ""
}

// Bounds of an app events secret's key, in bytes (the Standard Webhooks specification's).
const (
	MinAppEventsSecretBytes = 24
	MaxAppEventsSecretBytes = 64
)

// validateAppEvents checks the push of app events: a url that is an endpoint, and secrets the
// Standard Webhooks specification accepts (whsec_ and the base64 of 24 to 64 bytes). Messages
// name a secret by its position only, and never quote the url (its query may carry a token).
func (c *Config) validateAppEvents() *Error {
	a := c.AppEvents
	if a.URL != "" {
		// url.Parse errors quote the input: fixed messages only.
		u, err := url.Parse(a.URL)
		switch {
		case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "":
			return errorf("app_events.url", "must be an absolute http:// or https:// URL with a host")
		case u.User != nil:
			return errorf("app_events.url", "must not carry credentials (user:password@): the app verifies each push by its signature instead (app_events.secrets)")
		case strings.Contains(a.URL, "#"):
			return errorf("app_events.url", "must not have a #fragment")
		}
		if len(a.Secrets) == 0 {
			return errorf("app_events.secrets", "is empty, but app_events.url needs at least one secret to sign its pushes with")
		}
	}
	seen := make(map[string]int, len(a.Secrets))
	for i, s := range a.Secrets {
		body, ok := strings.CutPrefix(s, "whsec_")
		if !ok {
			return errorf("app_events.secrets", "entry %d must be a whsec_… secret (whsec_ and base64)", i+1)
		}
		// Only the padded standard alphabet, exactly as base64.StdEncoding writes it: the
		// decoder alone would also take line breaks and non-zero trailing bits.
		key, err := base64.StdEncoding.DecodeString(body)
		if err != nil || base64.StdEncoding.EncodeToString(key) != body {
			return errorf("app_events.secrets", "entry %d is not whsec_ followed by standard base64 (A-Z a-z 0-9 + /, padded with =)", i+1)
		}
		if len(key) < MinAppEventsSecretBytes || len(key) > MaxAppEventsSecretBytes {
			return errorf("app_events.secrets", "entry %d decodes to %d bytes; a secret must hold %d to %d (openssl rand -base64 32 makes one)",
				i+1, len(key), MinAppEventsSecretBytes, MaxAppEventsSecretBytes)
		}
		if j, dup := seen[s]; dup {
			return errorf("app_events.secrets", "entries %d and %d are the same secret", j, i+1)
		}
		seen[s] = i + 1
	}
	if a.Timeout < time.Second || a.Timeout > time.Minute {
		return errorf("app_events.timeout", "must be between 1s and 60s, got %s", a.Timeout)
	}
	if a.Concurrency < 1 || a.Concurrency > 256 {
		return errorf("app_events.concurrency", "must be between 1 and 256, got %d", a.Concurrency)
	}
	return nil
}
