package config

import (
	"encoding/base64"
	"fmt"
	"net"
	"net/mail"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"

	"billing/internal/auth"
	"billing/internal/database"
)

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
