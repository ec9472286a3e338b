package config

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// clearEnv blanks every BILLING_* variable for the test (empty counts as
// unset), so the developer's shell cannot leak into results. Tests using it
// must not be parallel: the environment is process-global.
func clearEnv(t *testing.T) {
	t.Helper()
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, "BILLING_") {
			t.Setenv(name, "")
		}
	}
}

// Tokens of valid configurations: each is exactly MinTokenLength characters, so that the
// tests also pin the boundary.
const (
	tokA   = "tokA-0123456789abcdef0123456789a"
	tokB   = "tokB-0123456789abcdef0123456789a"
	admTok = "adm1-0123456789abcdef0123456789a"
	admTk2 = "adm2-0123456789abcdef0123456789a"
)

func setEnv(t *testing.T, env map[string]string) {
	t.Helper()
	for k, v := range env {
		t.Setenv(k, v)
	}
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// wantKeyErr asserts err is a one-line *Error for key.
func wantKeyErr(t *testing.T, err error, key string) *Error {
	t.Helper()
	var ce *Error
	if !errors.As(err, &ce) {
		t.Fatalf("want *Error for %s, got %T %v", key, err, err)
	}
	if ce.Key != key {
		t.Fatalf("error key = %q, want %q (err: %v)", ce.Key, key, err)
	}
	msg := err.Error()
	prefix := "config: " + key + ": "
	if key == "config" {
		prefix = "config: " // the file itself: one prefix, not "config: config: "
	}
	if !strings.HasPrefix(msg, prefix) || strings.HasPrefix(msg, "config: config:") || strings.ContainsAny(msg, "\r\n") {
		t.Fatalf("error must be one line starting with %q, got %q", prefix, msg)
	}
	return ce
}

func TestLoadDefaults(t *testing.T) {
	clearEnv(t)
	c, err := Load("")
	if err != nil {
		t.Fatal(err)
	}
	want := &Config{}
	want.HTTP.Addr = ":8080"
	want.Stripe.Mode = "test"
	want.Stripe.APIURL = "https://api.stripe.com"
	want.Stripe.WebhookTolerance = 5 * time.Minute
	want.Stripe.MaxConcurrentCalls = 16
	want.Worker.MaxAttempts = 3
	want.Worker.RetryDelay = 30 * time.Second
	want.Worker.RescueAfter = time.Minute
	want.Worker.Concurrency = 8
	want.Webhooks.Retention = 90 * 24 * time.Hour
	want.Webhooks.ApplyInline = true
	want.Webhooks.BodyBudgetMiB = 32
	want.Webhooks.GroupCommit = 16
	want.Reconcile.Interval = 6 * time.Hour
	want.Usage.ReportRate, want.Usage.ReviewAfter = 20, 20*time.Hour
	want.Policy.PastDueEntitled = true
	want.Policy.PeriodGrace = 2 * time.Hour
	want.Policy.PausedCollectionEntitled = true
	want.AppEvents.Timeout, want.AppEvents.Concurrency = 10*time.Second, 16
	want.Log.Level = "info"
	want.Log.Format = "json"
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("defaults:\n got %+v\nwant %+v", c, want)
	}
}

const fullYAML = `
http:
  addr: "127.0.0.1:9000"
database:
  url: postgres://u:p@db/billing
stripe:
  mode: live
  secret_key: sk_live_yaml
  api_url: https://stripe-proxy.internal:8443
  webhook_secrets:
    test: [whsec_t1_0123456789abcdef0123456789abcdef, whsec_t2_0123456789abcdef0123456789abcdef]
    live: "whsec_l1_0123456789abcdef0123456789abcdef, whsec_l2_0123456789abcdef0123456789abcdef"
  webhook_tolerance: 2m
auth:
  api_tokens:
    - ` + tokA + `
    - ` + tokB + `
  admin_tokens: ` + admTok + `,` + admTk2 + `
portal:
  return_url: https://example.com/account
checkout:
  success_url: https://example.com/welcome
  cancel_url: https://example.com/pricing
worker:
  max_attempts: 7
  retry_delay: 10ms
policy:
  past_due_entitled: false
  period_grace: 90m
  paused_collection_entitled: false
mail:
  smtp_url: smtps://user:pw@mail.example.com:465
  from: billing@example.com
app_events:
  url: https://app.example.com/billing/events
  secrets: [` + appSecret32 + `, ` + appSecret24 + `]
  timeout: 5s
  concurrency: 32
log:
  level: DEBUG
  format: text
`

func TestLoadYAML(t *testing.T) {
	clearEnv(t)
	path := writeFile(t, "billing.yaml", fullYAML)

	check := func(t *testing.T, c *Config) {
		t.Helper()
		want := &Config{}
		want.HTTP.Addr = "127.0.0.1:9000"
		want.Database.URL = "postgres://u:p@db/billing"
		want.Stripe.Mode = "live"
		want.Stripe.SecretKey = "sk_live_yaml"
		want.Stripe.APIURL = "https://stripe-proxy.internal:8443"
		want.Stripe.WebhookSecrets.Test = []string{"whsec_t1_0123456789abcdef0123456789abcdef", "whsec_t2_0123456789abcdef0123456789abcdef"}
		want.Stripe.WebhookSecrets.Live = []string{"whsec_l1_0123456789abcdef0123456789abcdef", "whsec_l2_0123456789abcdef0123456789abcdef"}
		want.Stripe.WebhookTolerance = 2 * time.Minute
		want.Stripe.MaxConcurrentCalls = 16
		want.Auth.APITokens = []string{tokA, tokB}
		want.Auth.AdminTokens = []string{admTok, admTk2}
		want.Portal.ReturnURL = "https://example.com/account"
		want.Checkout.SuccessURL = "https://example.com/welcome"
		want.Checkout.CancelURL = "https://example.com/pricing"
		want.Worker.MaxAttempts = 7
		want.Worker.RetryDelay = 10 * time.Millisecond
		want.Worker.RescueAfter = time.Minute
		want.Worker.Concurrency = 8
		want.Webhooks.Retention = 90 * 24 * time.Hour
		want.Webhooks.ApplyInline = true
		want.Webhooks.BodyBudgetMiB = 32
		want.Webhooks.GroupCommit = 16
		want.Webhooks.GroupCommit = 16
		want.Reconcile.Interval = 6 * time.Hour
		want.Usage.ReportRate, want.Usage.ReviewAfter = 20, 20*time.Hour
		want.Policy.PastDueEntitled = false
		want.Policy.PeriodGrace = 90 * time.Minute
		want.Policy.PausedCollectionEntitled = false
		want.Mail.SMTPURL = "smtps://user:pw@mail.example.com:465"
		want.Mail.From = "billing@example.com"
		want.AppEvents.URL = "https://app.example.com/billing/events"
		want.AppEvents.Secrets = []string{appSecret32, appSecret24}
		want.AppEvents.Timeout, want.AppEvents.Concurrency = 5*time.Second, 32
		want.Log.Level = "debug" // normalised from DEBUG
		want.Log.Format = "text"
		if !reflect.DeepEqual(c, want) {
			t.Fatalf("yaml:\n got %+v\nwant %+v", c, want)
		}
	}

	t.Run("path argument", func(t *testing.T) {
		c, err := Load(path)
		if err != nil {
			t.Fatal(err)
		}
		check(t, c)
	})
	t.Run("BILLING_CONFIG", func(t *testing.T) {
		t.Setenv("BILLING_CONFIG", path)
		c, err := Load("")
		if err != nil {
			t.Fatal(err)
		}
		check(t, c)
	})
	t.Run("path argument beats BILLING_CONFIG", func(t *testing.T) {
		t.Setenv("BILLING_CONFIG", filepath.Join(t.TempDir(), "missing.yaml"))
		c, err := Load(path)
		if err != nil {
			t.Fatal(err)
		}
		check(t, c)
	})
	t.Run("extension does not matter", func(t *testing.T) {
		c, err := Load(writeFile(t, "billing.conf", fullYAML))
		if err != nil {
			t.Fatal(err)
		}
		check(t, c)
	})
}

func TestEnvOverridesYAML(t *testing.T) {
	clearEnv(t)
	path := writeFile(t, "billing.yaml", fullYAML)
	setEnv(t, map[string]string{
		"BILLING_HTTP_ADDR":                   ":7000",
		"BILLING_STRIPE_MODE":                 "test",
		"BILLING_STRIPE_SECRET_KEY":           "rk_test_env",
		"BILLING_STRIPE_WEBHOOK_SECRETS_TEST": "whsec_e1_0123456789abcdef0123456789abcdef",
		"BILLING_AUTH_API_TOKENS":             tokA + ", " + tokB + " ,," + tokA + "3",
		"BILLING_WORKER_MAX_ATTEMPTS":         "1",
		"BILLING_WORKER_RETRY_DELAY":          "1s",
		"BILLING_WORKER_CONCURRENCY":          "4",
		"BILLING_POLICY_PAST_DUE_ENTITLED":    "true",
		"BILLING_LOG_LEVEL":                   "warn",
		"BILLING_CHECKOUT_SUCCESS_URL":        "https://env.example.com/welcome",
	})
	c, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if c.HTTP.Addr != ":7000" || c.Stripe.Mode != "test" || c.Stripe.SecretKey != "rk_test_env" ||
		c.Worker.MaxAttempts != 1 || c.Worker.RetryDelay != time.Second || !c.Policy.PastDueEntitled ||
		c.Worker.Concurrency != 4 || c.Log.Level != "warn" || c.Checkout.SuccessURL != "https://env.example.com/welcome" {
		t.Fatalf("env did not override yaml: %+v", c)
	}
	if got := c.Stripe.WebhookSecrets.Test; !reflect.DeepEqual(got, []string{"whsec_e1_0123456789abcdef0123456789abcdef"}) {
		t.Fatalf("webhook test = %q", got)
	}
	if got := c.Auth.APITokens; !reflect.DeepEqual(got, []string{tokA, tokB, tokA + "3"}) {
		t.Fatalf("api tokens = %q", got)
	}
	// Keys not in the environment keep their YAML values.
	if c.Log.Format != "text" || c.Stripe.WebhookTolerance != 2*time.Minute || c.Checkout.CancelURL != "https://example.com/pricing" ||
		!reflect.DeepEqual(c.Stripe.WebhookSecrets.Live, []string{"whsec_l1_0123456789abcdef0123456789abcdef", "whsec_l2_0123456789abcdef0123456789abcdef"}) {
		t.Fatalf("yaml values lost: %+v", c)
	}
}

func TestEnvLists(t *testing.T) {
	tests := []struct {
		name, env, value string
		get              func(*Config) []string
		want             []string
	}{
		{"api tokens", "BILLING_AUTH_API_TOKENS", tokA + "," + tokB, func(c *Config) []string { return c.Auth.APITokens }, []string{tokA, tokB}},
		{"admin tokens trimmed", "BILLING_AUTH_ADMIN_TOKENS", " " + admTok + " , " + admTk2 + " ", func(c *Config) []string { return c.Auth.AdminTokens }, []string{admTok, admTk2}},
		{"single value", "BILLING_AUTH_API_TOKENS", tokA, func(c *Config) []string { return c.Auth.APITokens }, []string{tokA}},
		{"webhook live", "BILLING_STRIPE_WEBHOOK_SECRETS_LIVE", "whsec_1_0123456789abcdef0123456789abcdef,whsec_2_0123456789abcdef0123456789abcdef", func(c *Config) []string { return c.Stripe.WebhookSecrets.Live }, []string{"whsec_1_0123456789abcdef0123456789abcdef", "whsec_2_0123456789abcdef0123456789abcdef"}},
		{"blank entries dropped", "BILLING_STRIPE_WEBHOOK_SECRETS_TEST", ",whsec_a_0123456789abcdef0123456789abcdef,,", func(c *Config) []string { return c.Stripe.WebhookSecrets.Test }, []string{"whsec_a_0123456789abcdef0123456789abcdef"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clearEnv(t)
			t.Setenv(tt.env, tt.value)
			c, err := Load("")
			if err != nil {
				t.Fatal(err)
			}
			if got := tt.get(c); !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestFileVariants(t *testing.T) {
	tests := []struct {
		name string
		env  func(t *testing.T) map[string]string
		yaml string // optional config file contents; %DIR% is not needed since paths are absolute
		get  func(*Config) any
		want any
	}{
		{
			name: "secret key with trailing newline",
			env: func(t *testing.T) map[string]string {
				return map[string]string{"BILLING_STRIPE_SECRET_KEY_FILE": writeFile(t, "sk", "sk_test_fromfile\n")}
			},
			get:  func(c *Config) any { return c.Stripe.SecretKey },
			want: "sk_test_fromfile",
		},
		{
			name: "database url with CRLF",
			env: func(t *testing.T) map[string]string {
				return map[string]string{"BILLING_DATABASE_URL_FILE": writeFile(t, "db", "postgres://u:pw@h/db\r\n")}
			},
			get:  func(c *Config) any { return c.Database.URL },
			want: "postgres://u:pw@h/db",
		},
		{
			name: "smtp url",
			env: func(t *testing.T) map[string]string {
				return map[string]string{
					"BILLING_MAIL_SMTP_URL_FILE": writeFile(t, "smtp", "smtp://u:pw@mail:587\n"),
					"BILLING_MAIL_FROM":          "billing@example.com",
				}
			},
			get:  func(c *Config) any { return c.Mail.SMTPURL },
			want: "smtp://u:pw@mail:587",
		},
		{
			name: "webhook secrets newline separated",
			env: func(t *testing.T) map[string]string {
				return map[string]string{"BILLING_STRIPE_WEBHOOK_SECRETS_TEST_FILE": writeFile(t, "wh", "whsec_a_0123456789abcdef0123456789abcdef\nwhsec_b_0123456789abcdef0123456789abcdef\n\n")}
			},
			get:  func(c *Config) any { return c.Stripe.WebhookSecrets.Test },
			want: []string{"whsec_a_0123456789abcdef0123456789abcdef", "whsec_b_0123456789abcdef0123456789abcdef"},
		},
		{
			name: "api tokens comma separated",
			env: func(t *testing.T) map[string]string {
				return map[string]string{"BILLING_AUTH_API_TOKENS_FILE": writeFile(t, "tok", tokA+","+tokB+"\n"+tokA+"3\n")}
			},
			get:  func(c *Config) any { return c.Auth.APITokens },
			want: []string{tokA, tokB, tokA + "3"},
		},
		{
			name: "admin tokens",
			env: func(t *testing.T) map[string]string {
				return map[string]string{"BILLING_AUTH_ADMIN_TOKENS_FILE": writeFile(t, "adm", admTok+"\n")}
			},
			get:  func(c *Config) any { return c.Auth.AdminTokens },
			want: []string{admTok},
		},
		{
			name: "webhook live",
			env: func(t *testing.T) map[string]string {
				return map[string]string{
					"BILLING_STRIPE_WEBHOOK_SECRETS_LIVE_FILE": writeFile(t, "whl", "whsec_live1_0123456789abcdef0123456789abcdef"),
				}
			},
			get:  func(c *Config) any { return c.Stripe.WebhookSecrets.Live },
			want: []string{"whsec_live1_0123456789abcdef0123456789abcdef"},
		},
		{
			name: "env file beats yaml value",
			env: func(t *testing.T) map[string]string {
				return map[string]string{"BILLING_STRIPE_SECRET_KEY_FILE": writeFile(t, "sk", "sk_test_file")}
			},
			yaml: "stripe:\n  secret_key: sk_test_yaml\n",
			get:  func(c *Config) any { return c.Stripe.SecretKey },
			want: "sk_test_file",
		},
		{
			name: "env value beats yaml _file",
			env: func(t *testing.T) map[string]string {
				return map[string]string{"BILLING_STRIPE_SECRET_KEY": "sk_test_env"}
			},
			yaml: "stripe:\n  secret_key_file: /nonexistent/should-not-be-read\n",
			get:  func(c *Config) any { return c.Stripe.SecretKey },
			want: "sk_test_env",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clearEnv(t)
			setEnv(t, tt.env(t))
			path := ""
			if tt.yaml != "" {
				path = writeFile(t, "c.yaml", tt.yaml)
			}
			c, err := Load(path)
			if err != nil {
				t.Fatal(err)
			}
			if got := tt.get(c); !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got %q, want %q", got, tt.want)
			}
		})
	}

	t.Run("yaml _file keys", func(t *testing.T) {
		clearEnv(t)
		sk := writeFile(t, "sk", "sk_test_yamlfile\n")
		wh := writeFile(t, "wh", "whsec_y1_0123456789abcdef0123456789abcdef\nwhsec_y2_0123456789abcdef0123456789abcdef\n")
		path := writeFile(t, "c.yaml", "stripe:\n  secret_key_file: "+sk+"\n  webhook_secrets:\n    test_file: "+wh+"\n")
		c, err := Load(path)
		if err != nil {
			t.Fatal(err)
		}
		if c.Stripe.SecretKey != "sk_test_yamlfile" {
			t.Fatalf("secret key = %q", c.Stripe.SecretKey)
		}
		if !reflect.DeepEqual(c.Stripe.WebhookSecrets.Test, []string{"whsec_y1_0123456789abcdef0123456789abcdef", "whsec_y2_0123456789abcdef0123456789abcdef"}) {
			t.Fatalf("webhook test = %q", c.Stripe.WebhookSecrets.Test)
		}
	})
}

func TestLoadErrors(t *testing.T) {
	tests := []struct {
		name   string
		env    map[string]string
		yaml   string
		key    string
		secret string // must not appear in the error text
	}{
		{name: "unknown mode", env: map[string]string{"BILLING_STRIPE_MODE": "prod"}, key: "stripe.mode"},
		{name: "live key in test mode", env: map[string]string{"BILLING_STRIPE_SECRET_KEY": "sk_live_abc123"}, key: "stripe.secret_key", secret: "abc123"},
		{name: "test key in live mode", env: map[string]string{"BILLING_STRIPE_MODE": "live", "BILLING_DATABASE_URL": "postgres://db/billing", "BILLING_STRIPE_SECRET_KEY": "rk_test_abc123"}, key: "stripe.secret_key", secret: "abc123"},
		{name: "publishable key", env: map[string]string{"BILLING_STRIPE_SECRET_KEY": "pk_test_abc123"}, key: "stripe.secret_key", secret: "abc123"},
		{name: "key without mode", env: map[string]string{"BILLING_STRIPE_SECRET_KEY": "sk_abc123"}, key: "stripe.secret_key", secret: "abc123"},
		{name: "relative api url", env: map[string]string{"BILLING_STRIPE_API_URL": "api.stripe.com"}, key: "stripe.api_url"},
		{name: "ftp api url", env: map[string]string{"BILLING_STRIPE_API_URL": "ftp://api.stripe.com"}, key: "stripe.api_url"},
		{name: "test whsec prefix", env: map[string]string{"BILLING_STRIPE_WEBHOOK_SECRETS_TEST": "whsec_ok_0123456789abcdef0123456789abcdef,wh_bad999"}, key: "stripe.webhook_secrets.test", secret: "wh_bad999"},
		{name: "live whsec prefix", env: map[string]string{"BILLING_STRIPE_WEBHOOK_SECRETS_LIVE": "bad999"}, key: "stripe.webhook_secrets.live", secret: "bad999"},
		{name: "bare whsec_", env: map[string]string{"BILLING_STRIPE_WEBHOOK_SECRETS_LIVE": "whsec_"}, key: "stripe.webhook_secrets.live"},
		{name: "one-character whsec_", env: map[string]string{"BILLING_STRIPE_WEBHOOK_SECRETS_TEST": "whsec_x"}, key: "stripe.webhook_secrets.test", secret: "whsec_x"},
		{name: "31-character whsec_", env: map[string]string{"BILLING_STRIPE_WEBHOOK_SECRETS_LIVE": "whsec_" + strings.Repeat("z", 31)}, key: "stripe.webhook_secrets.live", secret: strings.Repeat("z", 31)},
		{name: "one secret in both modes", env: map[string]string{"BILLING_STRIPE_WEBHOOK_SECRETS_TEST": "whsec_t1_0123456789abcdef0123456789abcdef", "BILLING_STRIPE_WEBHOOK_SECRETS_LIVE": "whsec_l1_0123456789abcdef0123456789abcdef,whsec_t1_0123456789abcdef0123456789abcdef"}, key: "stripe.webhook_secrets.live", secret: "whsec_t1"},
		{name: "32 identical characters as a token", env: map[string]string{"BILLING_AUTH_API_TOKENS": strings.Repeat("a", 32)}, key: "auth.api_tokens", secret: strings.Repeat("a", 32)},
		{name: "a word repeated as a token", env: map[string]string{"BILLING_AUTH_ADMIN_TOKENS": strings.Repeat("letmein", 5)}, key: "auth.admin_tokens", secret: "letmein"},
		{name: "unknown yaml key", yaml: "stripe:\n  mod: live\n", key: "stripe.mod"},
		{name: "misspelt yaml block", yaml: "databse:\n  url: postgres://u:p@db/billing\n", key: "databse.url", secret: "u:p@db"},
		{name: "scalar where a block is expected", yaml: "database: postgres://u:p@db/billing\n", key: "database", secret: "u:p@db"},
		{name: "unknown top-level yaml key", yaml: "unknown_key: ignored\n", key: "unknown_key"},
		{name: "_file of a key that is not a secret", yaml: "stripe:\n  mode_file: /dev/null\n", key: "stripe.mode_file"},
		{name: "pool smaller than its shares", env: map[string]string{"BILLING_DATABASE_POOL_SIZE": "40", "BILLING_STRIPE_MAX_CONCURRENT_CALLS": "24"}, key: "database.pool_size"},
		{name: "pool one short of its shares", env: map[string]string{"BILLING_DATABASE_POOL_SIZE": "60"}, key: "database.pool_size"},
		{name: "body budget below one body", env: map[string]string{"BILLING_WEBHOOKS_BODY_BUDGET_MIB": "0"}, key: "webhooks.body_budget_mib"},
		{name: "body budget above a GiB", env: map[string]string{"BILLING_WEBHOOKS_BODY_BUDGET_MIB": "1025"}, key: "webhooks.body_budget_mib"},
		{name: "group commit of none", env: map[string]string{"BILLING_WEBHOOKS_GROUP_COMMIT": "0"}, key: "webhooks.group_commit"},
		{name: "group commit beyond the inline slots", env: map[string]string{"BILLING_WEBHOOKS_GROUP_COMMIT": "17"}, key: "webhooks.group_commit"},
		{name: "negative pool", env: map[string]string{"BILLING_DATABASE_POOL_SIZE": "-1"}, key: "database.pool_size"},
		{name: "unknown environment variable", env: map[string]string{"BILLING_STRIPE_MOD": "live"}, key: "BILLING_STRIPE_MOD"},
		{name: "_FILE of a key that is not a secret", env: map[string]string{"BILLING_STRIPE_MODE_FILE": "/dev/null"}, key: "BILLING_STRIPE_MODE_FILE"},
		{name: "misspelt database variable", env: map[string]string{"BILLING_DATABASE_UR": "postgres://u:hunter2@db/billing"}, key: "BILLING_DATABASE_UR", secret: "hunter2"},
		{name: "malformed tolerance", env: map[string]string{"BILLING_STRIPE_WEBHOOK_TOLERANCE": "5 minutes"}, key: "stripe.webhook_tolerance"},
		{name: "zero tolerance", env: map[string]string{"BILLING_STRIPE_WEBHOOK_TOLERANCE": "0s"}, key: "stripe.webhook_tolerance"},
		{name: "unitless tolerance in yaml", yaml: "stripe:\n  webhook_tolerance: 300\n", key: "stripe.webhook_tolerance"},
		{name: "negative tolerance", env: map[string]string{"BILLING_STRIPE_WEBHOOK_TOLERANCE": "-5m"}, key: "stripe.webhook_tolerance"},
		{name: "tolerance above an hour", env: map[string]string{"BILLING_STRIPE_WEBHOOK_TOLERANCE": "1h0m1s"}, key: "stripe.webhook_tolerance"},
		{name: "tolerance of a day", env: map[string]string{"BILLING_STRIPE_WEBHOOK_TOLERANCE": "24h"}, key: "stripe.webhook_tolerance"},
		{name: "http api url in live mode", env: map[string]string{"BILLING_STRIPE_MODE": "live", "BILLING_DATABASE_URL": "postgres://db/billing", "BILLING_STRIPE_API_URL": "http://api.stripe.com"}, key: "stripe.api_url"},
		{name: "live mode on the embedded database", env: map[string]string{"BILLING_STRIPE_MODE": "live", "BILLING_STRIPE_SECRET_KEY": "sk_live_abc123"}, key: "database.url", secret: "abc123"},
		{name: "one-character api token", env: map[string]string{"BILLING_AUTH_API_TOKENS": "x"}, key: "auth.api_tokens"},
		{name: "31-character admin token", env: map[string]string{"BILLING_AUTH_ADMIN_TOKENS": admTok[:31]}, key: "auth.admin_tokens", secret: admTok[:31]},
		{name: "short token after a good one", env: map[string]string{"BILLING_AUTH_API_TOKENS": tokA + ",short-secret-token"}, key: "auth.api_tokens", secret: "short-secret-token"},
		{name: "token in both lists", env: map[string]string{"BILLING_AUTH_API_TOKENS": tokA + "," + tokB, "BILLING_AUTH_ADMIN_TOKENS": admTok + "," + tokB}, key: "auth.admin_tokens", secret: tokB},
		{name: "relative return url", env: map[string]string{"BILLING_PORTAL_RETURN_URL": "/account"}, key: "portal.return_url"},
		{name: "relative checkout success url", env: map[string]string{"BILLING_CHECKOUT_SUCCESS_URL": "/welcome"}, key: "checkout.success_url"},
		{name: "checkout cancel url without host", env: map[string]string{"BILLING_CHECKOUT_SUCCESS_URL": "https://example.com/welcome", "BILLING_CHECKOUT_CANCEL_URL": "https://"}, key: "checkout.cancel_url"},
		{name: "max attempts zero", env: map[string]string{"BILLING_WORKER_MAX_ATTEMPTS": "0"}, key: "worker.max_attempts"},
		{name: "max attempts garbage", env: map[string]string{"BILLING_WORKER_MAX_ATTEMPTS": "three"}, key: "worker.max_attempts"},
		{name: "max attempts float in yaml", yaml: "worker:\n  max_attempts: 2.5\n", key: "worker.max_attempts"},
		{name: "retry delay garbage", env: map[string]string{"BILLING_WORKER_RETRY_DELAY": "soon"}, key: "worker.retry_delay"},
		{name: "retry delay negative", env: map[string]string{"BILLING_WORKER_RETRY_DELAY": "-1s"}, key: "worker.retry_delay"},
		{name: "concurrency zero", env: map[string]string{"BILLING_WORKER_CONCURRENCY": "0"}, key: "worker.concurrency"},
		{name: "concurrency above the pool", env: map[string]string{"BILLING_WORKER_CONCURRENCY": "33"}, key: "worker.concurrency"},
		{name: "concurrency garbage", env: map[string]string{"BILLING_WORKER_CONCURRENCY": "many"}, key: "worker.concurrency"},
		{name: "bool garbage", env: map[string]string{"BILLING_POLICY_PAST_DUE_ENTITLED": "maybe"}, key: "policy.past_due_entitled"},
		{name: "period grace zero", env: map[string]string{"BILLING_POLICY_PERIOD_GRACE": "0s"}, key: "policy.period_grace"},
		{name: "period grace negative", env: map[string]string{"BILLING_POLICY_PERIOD_GRACE": "-1h"}, key: "policy.period_grace"},
		{name: "period grace unitless", env: map[string]string{"BILLING_POLICY_PERIOD_GRACE": "7200"}, key: "policy.period_grace"},
		{name: "smtp bad scheme", env: map[string]string{"BILLING_MAIL_SMTP_URL": "http://u:hunter2@mail", "BILLING_MAIL_FROM": "a@b.c"}, key: "mail.smtp_url", secret: "hunter2"},
		{name: "smtp unparsable", env: map[string]string{"BILLING_MAIL_SMTP_URL": "smtp://u:hunter2@mail:port", "BILLING_MAIL_FROM": "a@b.c"}, key: "mail.smtp_url", secret: "hunter2"},
		{name: "mail from missing", env: map[string]string{"BILLING_MAIL_SMTP_URL": "smtp://u:hunter2@mail:587"}, key: "mail.from", secret: "hunter2"},
		{name: "mail from invalid", env: map[string]string{"BILLING_MAIL_FROM": "not an address"}, key: "mail.from"},
		{name: "log level", env: map[string]string{"BILLING_LOG_LEVEL": "verbose"}, key: "log.level"},
		{name: "log format", env: map[string]string{"BILLING_LOG_FORMAT": "xml"}, key: "log.format"},
		{name: "http addr without port", env: map[string]string{"BILLING_HTTP_ADDR": "8080"}, key: "http.addr"},
		{name: "debug addr on every interface", env: map[string]string{"BILLING_HTTP_DEBUG_ADDR": ":6060"}, key: "http.debug_addr"},
		{name: "debug addr on a public address", env: map[string]string{"BILLING_HTTP_DEBUG_ADDR": "10.0.0.5:6060"}, key: "http.debug_addr"},
		{name: "debug addr without port", env: map[string]string{"BILLING_HTTP_DEBUG_ADDR": "127.0.0.1"}, key: "http.debug_addr"},
		{name: "list where scalar expected", yaml: "stripe:\n  mode: [test]\n", key: "stripe.mode"},
		{
			name:   "value and _FILE both set",
			env:    map[string]string{"BILLING_STRIPE_SECRET_KEY": "sk_test_abc123", "BILLING_STRIPE_SECRET_KEY_FILE": "/dev/null"},
			key:    "stripe.secret_key",
			secret: "abc123",
		},
		{name: "_FILE missing", env: map[string]string{"BILLING_AUTH_API_TOKENS_FILE": "/nonexistent/tokens"}, key: "auth.api_tokens"},
		{name: "yaml value and _file both set", yaml: "database:\n  url: x\n  url_file: /dev/null\n", key: "database.url"},
		{name: "config file missing", env: map[string]string{"BILLING_CONFIG": "/nonexistent/billing.yaml"}, key: "config"},
		{name: "malformed yaml", yaml: "stripe:\n  mode: [unclosed\n  x: {\n", key: "config"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clearEnv(t)
			setEnv(t, tt.env)
			path := ""
			if tt.yaml != "" {
				path = writeFile(t, "c.yaml", tt.yaml)
			}
			c, err := Load(path)
			if c != nil {
				t.Errorf("Load returned a config alongside an error")
			}
			wantKeyErr(t, err, tt.key)
			if tt.secret != "" && strings.Contains(err.Error(), tt.secret) {
				t.Fatalf("error leaks secret %q: %v", tt.secret, err)
			}
		})
	}
}

func TestLoadAccepts(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		ok   func(*Config) bool
	}{
		{"rk_test_ in test mode", map[string]string{"BILLING_STRIPE_SECRET_KEY": "rk_test_x"}, func(c *Config) bool { return c.Stripe.SecretKey == "rk_test_x" }},
		{"named admin tokens", map[string]string{"BILLING_AUTH_ADMIN_TOKENS": "alice:" + admTok + ",bob:" + admTk2}, func(c *Config) bool {
			return len(c.Auth.AdminTokens) == 2 && c.Auth.AdminTokens[0] == "alice:"+admTok
		}},
		{"sk_test_ in test mode", map[string]string{"BILLING_STRIPE_SECRET_KEY": "sk_test_x"}, func(c *Config) bool { return c.Stripe.SecretKey == "sk_test_x" }},
		{"sk_live_ in live mode", map[string]string{"BILLING_STRIPE_MODE": "live", "BILLING_STRIPE_SECRET_KEY": "sk_live_x", "BILLING_DATABASE_URL": "postgres://db/billing"}, func(c *Config) bool { return c.Stripe.Mode == "live" }},
		{"rk_live_ with upper-case mode", map[string]string{"BILLING_STRIPE_MODE": "LIVE", "BILLING_STRIPE_SECRET_KEY": "rk_live_x", "BILLING_DATABASE_URL": "postgres://db/billing"}, func(c *Config) bool { return c.Stripe.Mode == "live" }},
		{"bool false", map[string]string{"BILLING_POLICY_PAST_DUE_ENTITLED": "false"}, func(c *Config) bool { return !c.Policy.PastDueEntitled }},
		{"paused collection not entitled", map[string]string{"BILLING_POLICY_PAUSED_COLLECTION_ENTITLED": "false"}, func(c *Config) bool { return !c.Policy.PausedCollectionEntitled }},
		{"reconcile off", map[string]string{"BILLING_RECONCILE_INTERVAL": "0"}, func(c *Config) bool { return c.Reconcile.Interval == 0 }},
		{"reconcile hourly", map[string]string{"BILLING_RECONCILE_INTERVAL": "1h"}, func(c *Config) bool { return c.Reconcile.Interval == time.Hour }},
		{"period grace of a day", map[string]string{"BILLING_POLICY_PERIOD_GRACE": "24h"}, func(c *Config) bool { return c.Policy.PeriodGrace == 24*time.Hour }},
		{"smtps with from", map[string]string{"BILLING_MAIL_SMTP_URL": "smtps://mail.example.com", "BILLING_MAIL_FROM": "Billing <b@example.com>"}, func(c *Config) bool { return c.Mail.From == "Billing <b@example.com>" }},
		{"test retry delay", map[string]string{"BILLING_WORKER_RETRY_DELAY": "10ms"}, func(c *Config) bool { return c.Worker.RetryDelay == 10*time.Millisecond }},
		{"stripe-mock api url", map[string]string{"BILLING_STRIPE_API_URL": "http://127.0.0.1:12111"}, func(c *Config) bool { return c.Stripe.APIURL == "http://127.0.0.1:12111" }},
		{"https api url in live mode", map[string]string{"BILLING_STRIPE_MODE": "live", "BILLING_DATABASE_URL": "postgres://db/billing", "BILLING_STRIPE_API_URL": "https://stripe-proxy.internal:8443"}, func(c *Config) bool { return c.Stripe.APIURL == "https://stripe-proxy.internal:8443" }},
		{"tolerance of an hour", map[string]string{"BILLING_STRIPE_WEBHOOK_TOLERANCE": "1h"}, func(c *Config) bool { return c.Stripe.WebhookTolerance == time.Hour }},
		// 16 Stripe calls + 16 inline applies + 8 + 5 workers + 8 background + 8 free.
		{"pool sized from the shares", nil, func(c *Config) bool { return c.Database.PoolSize == 0 && c.PoolSize() == 61 }},
		{"pool that holds its shares", map[string]string{"BILLING_DATABASE_POOL_SIZE": "61"}, func(c *Config) bool { return c.PoolSize() == 61 }},
		{"pool without the inline share", map[string]string{"BILLING_DATABASE_POOL_SIZE": "45", "BILLING_WEBHOOKS_APPLY_INLINE": "false"}, func(c *Config) bool { return c.PoolSize() == 45 }},
		{"largest shares", map[string]string{"BILLING_STRIPE_MAX_CONCURRENT_CALLS": "24", "BILLING_WORKER_CONCURRENCY": "32"}, func(c *Config) bool { return c.PoolSize() == 93 }},
		{"profiler on loopback", map[string]string{"BILLING_HTTP_DEBUG_ADDR": "127.0.0.1:6060"}, func(c *Config) bool { return c.HTTP.DebugAddr == "127.0.0.1:6060" }},
		// Taken as loopback by definition, never looked up.
		{"profiler on localhost", map[string]string{"BILLING_HTTP_DEBUG_ADDR": "localhost:6060"}, func(c *Config) bool { return c.HTTP.DebugAddr == "127.0.0.1:6060" }},
		{"profiler on LOCALHOST", map[string]string{"BILLING_HTTP_DEBUG_ADDR": "LOCALHOST:6060"}, func(c *Config) bool { return c.HTTP.DebugAddr == "127.0.0.1:6060" }},
		{"webhook secret of 32 characters", map[string]string{"BILLING_STRIPE_WEBHOOK_SECRETS_TEST": "whsec_" + strings.Repeat("a1", 16)}, func(c *Config) bool { return len(c.Stripe.WebhookSecrets.Test) == 1 }},
		{"token of 8 distinct characters", map[string]string{"BILLING_AUTH_API_TOKENS": strings.Repeat("abcdefgh", 4)}, func(c *Config) bool { return len(c.Auth.APITokens) == 1 }},
		{"empty unknown variable is unset", map[string]string{"BILLING_STRIPE_MOD": ""}, func(c *Config) bool { return c.Stripe.Mode == "test" }},
		{"every secret's _FILE variable is known", map[string]string{"BILLING_MAIL_SMTP_URL_FILE": "/dev/null", "BILLING_DATABASE_URL_FILE": "/dev/null"}, func(c *Config) bool { return c.Mail.SMTPURL == "" }},
		{"profiler on IPv6 loopback", map[string]string{"BILLING_HTTP_DEBUG_ADDR": "[::1]:6060"}, func(c *Config) bool { return c.HTTP.DebugAddr == "[::1]:6060" }},
		{"tokens of 32 characters", map[string]string{"BILLING_AUTH_API_TOKENS": tokA, "BILLING_AUTH_ADMIN_TOKENS": admTok}, func(c *Config) bool { return len(c.Auth.APITokens) == 1 && len(c.Auth.AdminTokens) == 1 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clearEnv(t)
			setEnv(t, tt.env)
			c, err := Load("")
			if err != nil {
				t.Fatal(err)
			}
			if !tt.ok(c) {
				t.Fatalf("unexpected config: %+v", c)
			}
		})
	}
}

func validConfig() *Config {
	c := &Config{}
	c.HTTP.Addr = ":8080"
	c.Stripe.Mode = "test"
	c.Stripe.APIURL = "https://api.stripe.com"
	c.Stripe.WebhookTolerance = 5 * time.Minute
	c.Stripe.MaxConcurrentCalls = 16
	c.Worker.MaxAttempts = 3
	c.Worker.RetryDelay = 30 * time.Second
	c.Worker.RescueAfter = time.Minute
	c.Worker.Concurrency = 8
	c.Webhooks.BodyBudgetMiB = 32
	c.Webhooks.GroupCommit = 16
	c.Policy.PeriodGrace = 2 * time.Hour
	c.Usage.ReportRate, c.Usage.ReviewAfter = 20, 20*time.Hour
	c.AppEvents.Timeout, c.AppEvents.Concurrency = 10*time.Second, 16
	c.Log.Level = "info"
	c.Log.Format = "json"
	return c
}

// TestValidate covers rules for Configs built in code (e.g. by other tests),
// which bypass Load's parsing and normalisation.
func TestValidate(t *testing.T) {
	t.Parallel()
	if err := validConfig().Validate(); err != nil {
		// Also guards against returning a typed-nil *Error.
		t.Fatalf("valid config rejected: %v", err)
	}
	tests := []struct {
		name   string
		mutate func(*Config)
		key    string
	}{
		{"mode not normalised", func(c *Config) { c.Stripe.Mode = "Test" }, "stripe.mode"},
		{"empty mode", func(c *Config) { c.Stripe.Mode = "" }, "stripe.mode"},
		{"live key", func(c *Config) { c.Stripe.SecretKey = "sk_live_x" }, "stripe.secret_key"},
		{"key with empty tail", func(c *Config) { c.Stripe.SecretKey = "sk_test_" }, "stripe.secret_key"},
		{"empty api url", func(c *Config) { c.Stripe.APIURL = "" }, "stripe.api_url"},
		{"empty api token", func(c *Config) { c.Auth.APITokens = []string{tokA, ""} }, "auth.api_tokens"},
		{"blank admin token", func(c *Config) { c.Auth.AdminTokens = []string{" "} }, "auth.admin_tokens"},
		{"zero tolerance", func(c *Config) { c.Stripe.WebhookTolerance = 0 }, "stripe.webhook_tolerance"},
		{"negative tolerance", func(c *Config) { c.Stripe.WebhookTolerance = -time.Second }, "stripe.webhook_tolerance"},
		{"tolerance above an hour", func(c *Config) { c.Stripe.WebhookTolerance = time.Hour + time.Nanosecond }, "stripe.webhook_tolerance"},
		{"short api token", func(c *Config) { c.Auth.APITokens = []string{"x"} }, "auth.api_tokens"},
		{"31 multi-byte characters", func(c *Config) { c.Auth.AdminTokens = []string{strings.Repeat("é", 31)} }, "auth.admin_tokens"},
		{"shared token", func(c *Config) { c.Auth.APITokens = []string{tokA}; c.Auth.AdminTokens = []string{tokA} }, "auth.admin_tokens"},
		{"named admin token that is short", func(c *Config) { c.Auth.AdminTokens = []string{"alice:" + tokA[:31]} }, "auth.admin_tokens"},
		{"named admin token shared with the app", func(c *Config) { c.Auth.APITokens = []string{tokA}; c.Auth.AdminTokens = []string{"alice:" + tokA} }, "auth.admin_tokens"},
		{"two admin tokens of one name", func(c *Config) { c.Auth.AdminTokens = []string{"alice:" + tokA, "alice:" + tokB} }, "auth.admin_tokens"},
		{"live over http", func(c *Config) {
			c.Stripe.Mode = "live"
			c.Database.URL = "postgres://db/billing"
			c.Stripe.APIURL = "http://localhost:12111"
		}, "stripe.api_url"},
		{"live without database", func(c *Config) { c.Stripe.Mode = "live" }, "database.url"},
		{"malformed database url", func(c *Config) { c.Database.URL = "postgres://%zz" }, "database.url"},
		{"zero retry delay", func(c *Config) { c.Worker.RetryDelay = 0 }, "worker.retry_delay"},
		{"rescue too soon", func(c *Config) { c.Worker.RescueAfter = time.Millisecond }, "worker.rescue_after"},
		{"retention too short", func(c *Config) { c.Webhooks.Retention = time.Hour }, "webhooks.retention"},
		{"reconcile interval too short", func(c *Config) { c.Reconcile.Interval = 30 * time.Second }, "reconcile.interval"},
		{"reconcile interval negative", func(c *Config) { c.Reconcile.Interval = -time.Hour }, "reconcile.interval"},
		{"usage report rate zero", func(c *Config) { c.Usage.ReportRate = 0 }, "usage.report_rate"},
		{"usage review past Stripe's window", func(c *Config) { c.Usage.ReviewAfter = 24 * time.Hour }, "usage.review_after"},
		{"usage review zero", func(c *Config) { c.Usage.ReviewAfter = 0 }, "usage.review_after"},
		{"no period grace", func(c *Config) { c.Policy.PeriodGrace = 0 }, "policy.period_grace"},
		{"no Stripe calls allowed", func(c *Config) { c.Stripe.MaxConcurrentCalls = 0 }, "stripe.max_concurrent_calls"},
		{"Stripe calls could take the pool", func(c *Config) { c.Stripe.MaxConcurrentCalls = 25 }, "stripe.max_concurrent_calls"},
		{"negative attempts", func(c *Config) { c.Worker.MaxAttempts = -1 }, "worker.max_attempts"},
		{"no workers", func(c *Config) { c.Worker.Concurrency = 0 }, "worker.concurrency"},
		{"smtp without host", func(c *Config) { c.Mail.SMTPURL = "smtp://"; c.Mail.From = "a@b.c" }, "mail.smtp_url"},
		{"empty addr", func(c *Config) { c.HTTP.Addr = "" }, "http.addr"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := validConfig()
			tt.mutate(c)
			wantKeyErr(t, c.Validate(), tt.key)
		})
	}
}

// TestDatabaseURL: what the driver cannot use, or a URL without a host, stops start-up with one
// line naming database.url and never the password; what connects today keeps working.
func TestDatabaseURL(t *testing.T) {
	bad := []struct{ name, url string }{
		{"bad escape", "postgres://%zz"},
		{"bad escape in the password", "postgres://u:hunter2%zz@db/billing"},
		{"port not a number", "postgres://u:hunter2@db:port/billing"},
		{"port out of range", "postgres://u:hunter2@db:99999/billing"},
		{"no host", "postgres://u:hunter2@/billing"},
		{"no authority", "postgresql:///billing"},
		{"port only", "postgres://u:hunter2@:5432/billing"},
		{"other scheme", "mysql://u:hunter2@db/billing"},
		{"http scheme", "http://u:hunter2@db/billing"},
		{"not a connection string", "hunter2 at db"},
		{"bad sslmode", "postgres://u:hunter2@db/billing?sslmode=sometimes"},
		{"bad keyword/value", "host=db password='hunter2"},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			clearEnv(t)
			t.Setenv("BILLING_DATABASE_URL", tt.url)
			c, err := Load("")
			if c != nil {
				t.Errorf("Load returned a config alongside an error")
			}
			wantKeyErr(t, err, "database.url")
			if strings.Contains(err.Error(), "hunter2") {
				t.Fatalf("error leaks the password: %v", err)
			}
		})
	}
	good := []string{
		"postgres://billing:pw@db:5432/billing?sslmode=require",
		"postgresql://billing@db/billing",
		"postgres://db",
		"postgres://u:p%40ss@[::1]:5432/billing",
		"postgres://db1:5432,db2:5433/billing?target_session_attrs=read-write",
		"postgres:///billing?host=/run/postgresql",
		"host=db port=5432 user=billing password='p w' dbname=billing sslmode=disable",
	}
	for _, u := range good {
		t.Run("accepts "+u, func(t *testing.T) {
			clearEnv(t)
			t.Setenv("BILLING_DATABASE_URL", u)
			c, err := Load("")
			if err != nil {
				t.Fatal(err)
			}
			if c.Database.URL != u {
				t.Fatalf("database.url = %q", c.Database.URL)
			}
		})
	}
}

// servingConfig is validConfig plus what serve needs.
func servingConfig() *Config {
	c := validConfig()
	c.Auth.APITokens = []string{tokA}
	c.Auth.AdminTokens = []string{admTok}
	c.Stripe.WebhookSecrets.Test = []string{"whsec_test_0123456789abcdef0123456789abcdef"}
	return c
}

// TestValidateServe: serve refuses to start without tokens or a webhook secret, while the other
// commands (Validate alone) accept such a configuration.
func TestValidateServe(t *testing.T) {
	t.Parallel()
	if err := servingConfig().ValidateServe(); err != nil {
		t.Fatalf("serving config rejected: %v", err)
	}
	liveOnly := servingConfig()
	liveOnly.Stripe.WebhookSecrets.Test = nil
	liveOnly.Stripe.WebhookSecrets.Live = []string{"whsec_live_0123456789abcdef0123456789abcdef"}
	if err := liveOnly.ValidateServe(); err != nil {
		t.Fatalf("a live secret alone rejected: %v", err)
	}
	if err := validConfig().Validate(); err != nil {
		t.Fatalf("migrate and trigger must not need tokens or secrets: %v", err)
	}
	tests := []struct {
		name   string
		mutate func(*Config)
		key    string
	}{
		{"no api tokens", func(c *Config) { c.Auth.APITokens = nil }, "auth.api_tokens"},
		{"no admin tokens", func(c *Config) { c.Auth.AdminTokens = nil }, "auth.admin_tokens"},
		{"no tokens at all", func(c *Config) { c.Auth.APITokens, c.Auth.AdminTokens = nil, nil }, "auth.api_tokens"},
		{"no webhook secret in test mode", func(c *Config) { c.Stripe.WebhookSecrets.Test = nil }, "stripe.webhook_secrets.test"},
		{"no webhook secret in live mode", func(c *Config) {
			c.Stripe.Mode = "live"
			c.Database.URL = "postgres://db/billing"
			c.Stripe.WebhookSecrets.Test = nil
		}, "stripe.webhook_secrets.live"},
		// Validate's rules still apply, and come first.
		{"bad mode without tokens", func(c *Config) { c.Stripe.Mode = "prod"; c.Auth.APITokens = nil }, "stripe.mode"},
		{"short token", func(c *Config) { c.Auth.APITokens = []string{"x"} }, "auth.api_tokens"},
		{"example api token", func(c *Config) {
			c.Auth.APITokens = []string{"REPLACE-ME-api-token-with-32-or-more-random-characters"}
		}, "auth.api_tokens"},
		{"example admin token", func(c *Config) {
			c.Auth.AdminTokens = []string{"REPLACE-ME-admin-token-with-32-or-more-random-characters"}
		}, "auth.admin_tokens"},
		{"example webhook secret", func(c *Config) {
			c.Stripe.WebhookSecrets.Test = []string{"whsec_REPLACE_ME_with_the_signing_secret_of_the_test_endpoint"}
		}, "stripe.webhook_secrets.test"},
		{"example secret key", func(c *Config) { c.Stripe.SecretKey = "sk_test_REPLACE_ME" }, "stripe.secret_key"},
		{"placeholder in lower case", func(c *Config) {
			c.Auth.AdminTokens = []string{"replace-me-admin-token-with-32-or-more-random-characters"}
		}, "auth.admin_tokens"},
		{"placeholder in mixed case", func(c *Config) {
			c.Stripe.WebhookSecrets.Test = []string{"whsec_Replace_Me_with_the_signing_secret_of_the_test_endpoint"}
		}, "stripe.webhook_secrets.test"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := servingConfig()
			tt.mutate(c)
			wantKeyErr(t, c.ValidateServe(), tt.key)
		})
	}
}

// TestTokenErrorsNameNoToken: a refused token is named by its position only.
func TestTokenErrorsNameNoToken(t *testing.T) {
	t.Parallel()
	for _, c := range []*Config{
		func() *Config { c := servingConfig(); c.Auth.AdminTokens = []string{admTok, tokA}; return c }(),
		func() *Config { c := servingConfig(); c.Auth.APITokens = []string{tokA, "short-secret"}; return c }(),
	} {
		err := c.ValidateServe()
		if err == nil {
			t.Fatal("config accepted")
		}
		if msg := err.Error(); strings.Contains(msg, tokA) || strings.Contains(msg, "short-secret") || !strings.Contains(msg, "entry 2") {
			t.Fatalf("want the entry's position and no token, got %q", msg)
		}
	}
}

func TestErrorFormat(t *testing.T) {
	t.Parallel()
	e := &Error{Key: "config", Msg: "yaml: line 2:\nbad thing"}
	if got, want := e.Error(), "config: yaml: line 2: bad thing"; got != want {
		t.Fatalf("Error() = %q, want %q", got, want)
	}
	e = &Error{Key: "stripe.mode", Msg: "must be test or live"}
	if got, want := e.Error(), "config: stripe.mode: must be test or live"; got != want {
		t.Fatalf("Error() = %q, want %q", got, want)
	}
}

// A missing file is named once, with no doubled prefix.
func TestMissingFileErrorHasOnePrefix(t *testing.T) {
	t.Parallel()
	_, err := Load("/nonexistent/billing.yaml")
	if err == nil {
		t.Fatal("Load of a missing file succeeded")
	}
	if got := err.Error(); !strings.HasPrefix(got, "config: reading /nonexistent/billing.yaml: ") || strings.Count(got, "config:") != 1 {
		t.Errorf("error %q", got)
	}
}

func TestWebhookSecrets(t *testing.T) {
	t.Parallel()
	c := validConfig()
	c.Stripe.WebhookSecrets.Test = []string{"whsec_t_0123456789abcdef0123456789abcdef"}
	c.Stripe.WebhookSecrets.Live = []string{"whsec_l1_0123456789abcdef0123456789abcdef", "whsec_l2_0123456789abcdef0123456789abcdef"}
	if got := c.WebhookSecrets(false); !reflect.DeepEqual(got, []string{"whsec_t_0123456789abcdef0123456789abcdef"}) {
		t.Fatalf("test secrets = %q", got)
	}
	got := c.WebhookSecrets(true)
	if !reflect.DeepEqual(got, []string{"whsec_l1_0123456789abcdef0123456789abcdef", "whsec_l2_0123456789abcdef0123456789abcdef"}) {
		t.Fatalf("live secrets = %q", got)
	}
	got[0] = "mutated"
	if c.Stripe.WebhookSecrets.Live[0] != "whsec_l1_0123456789abcdef0123456789abcdef" {
		t.Fatal("WebhookSecrets must return a copy")
	}
	if got := validConfig().WebhookSecrets(true); len(got) != 0 {
		t.Fatalf("empty config returned %q", got)
	}
}

func TestLogValueRedactsSecrets(t *testing.T) {
	t.Parallel()
	secrets := []string{
		"DBPASSWORD", "sk_test_SECRETKEY", "whsec_TESTSECRET_0123456789abcdef0123456789abcdef", "whsec_LIVESECRET_0123456789abcdef0123456789abcdef",
		"APITOKEN", "ADMINTOKEN", "SMTPPASSWORD", "URLPASSWORD", appSecret24[6:], appSecret32[6:],
	}
	c := validConfig()
	c.Database.URL = "postgres://billing:DBPASSWORD@db:5432/billing"
	c.Stripe.SecretKey = "sk_test_SECRETKEY"
	c.Stripe.APIURL = "https://user:URLPASSWORD@api.stripe.com"
	c.Stripe.WebhookSecrets.Test = []string{"whsec_TESTSECRET_0123456789abcdef0123456789abcdef"}
	c.Stripe.WebhookSecrets.Live = []string{"whsec_LIVESECRET_0123456789abcdef0123456789abcdef", "whsec_LIVESECRET2_0123456789abcdef0123456789abcdef"}
	c.Auth.APITokens = []string{"APITOKEN-0123456789abcdef0123456"}
	c.Auth.AdminTokens = []string{"ADMINTOKEN-0123456789abcdef01234"}
	c.Portal.ReturnURL = "https://example.com/account"
	c.Mail.SMTPURL = "smtp://user:SMTPPASSWORD@mail:587"
	c.Mail.From = "billing@example.com"
	c.AppEvents.URL = "https://app.example.com/events"
	c.AppEvents.Secrets = []string{appSecret24, appSecret32}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}

	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("config", "config", c)
	out := buf.String()
	for _, s := range secrets {
		if strings.Contains(out, s) {
			t.Errorf("log output contains secret %q: %s", s, out)
		}
	}

	var rec struct {
		Config struct {
			HTTP     struct{ Addr string }      `json:"http"`
			Database struct{ URL string }       `json:"database"`
			Stripe   map[string]json.RawMessage `json:"stripe"`
			Auth     map[string]int             `json:"auth"`
			Portal   struct {
				ReturnURL string `json:"return_url"`
			} `json:"portal"`
			Worker map[string]any    `json:"worker"`
			Mail   map[string]string `json:"mail"`
			Log    map[string]string `json:"log"`
		} `json:"config"`
	}
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
		t.Fatalf("bad JSON %q: %v", out, err)
	}
	cfg := rec.Config
	if cfg.HTTP.Addr != ":8080" || cfg.Database.URL != "set" || cfg.Portal.ReturnURL != "https://example.com/account" {
		t.Errorf("unexpected http/database/portal: %s", out)
	}
	if string(cfg.Stripe["secret_key"]) != `"set"` || string(cfg.Stripe["mode"]) != `"test"` ||
		string(cfg.Stripe["webhook_secrets"]) != `{"test":1,"live":2}` || string(cfg.Stripe["webhook_tolerance"]) != `"5m0s"` {
		t.Errorf("unexpected stripe group: %s", out)
	}
	if !strings.Contains(string(cfg.Stripe["api_url"]), "api.stripe.com") {
		t.Errorf("api_url host missing: %s", out)
	}
	if cfg.Auth["api_tokens"] != 1 || cfg.Auth["admin_tokens"] != 1 {
		t.Errorf("unexpected auth counts: %s", out)
	}
	if cfg.Worker["max_attempts"] != float64(3) || cfg.Worker["retry_delay"] != "30s" {
		t.Errorf("unexpected worker group: %s", out)
	}
	if cfg.Mail["smtp_url"] != "set" || cfg.Mail["from"] != "billing@example.com" || cfg.Log["level"] != "info" {
		t.Errorf("unexpected mail/log group: %s", out)
	}
	if !strings.Contains(out, `"app_events":{"url":"https://app.example.com/events","secrets":2,"timeout":"10s","concurrency":16}`) {
		t.Errorf("unexpected app_events group: %s", out)
	}

	// Unset secrets say so rather than vanishing.
	buf.Reset()
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("config", "config", validConfig())
	if !strings.Contains(buf.String(), `"secret_key":"unset"`) || !strings.Contains(buf.String(), `"smtp_url":"unset"`) {
		t.Errorf("unset secrets not reported: %s", buf.String())
	}
}

// TestLoadConcurrent checks Load shares no viper state (run with -race).
func TestLoadConcurrent(t *testing.T) {
	clearEnv(t)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 16 {
		mode, key := "test", "sk_test_x"
		if i%2 == 1 {
			mode, key = "live", "sk_live_x"
		}
		path := writeFile(t, "c.yaml", "database:\n  url: postgres://db/billing\nstripe:\n  mode: "+mode+"\n  secret_key: "+key+"\n")
		wg.Go(func() {
			c, err := Load(path)
			if err == nil && c.Stripe.Mode != mode {
				err = errors.New("got mode " + c.Stripe.Mode + ", want " + mode)
			}
			if err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// Secrets of app_events.secrets: appSecret24 is the Standard Webhooks example secret (24 bytes,
// the fewest accepted); appSecret32 holds 32 bytes and ends in padding.
const (
	appSecret24 = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	appSecret32 = "whsec_QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVphYmNkZWY="
)

// appSecretOf is a well-formed app events secret of n bytes.
func appSecretOf(n int) string {
	return "whsec_" + base64.StdEncoding.EncodeToString([]byte(strings.Repeat("k", n)))
}

// TestAppEventsDefaults: out of the box nothing is pushed and nothing is required.
func TestAppEventsDefaults(t *testing.T) {
	clearEnv(t)
	c, err := Load("")
	if err != nil {
		t.Fatal(err)
	}
	if c.AppEvents.URL != "" || c.AppEvents.Secrets != nil || c.AppEvents.Timeout != 10*time.Second || c.AppEvents.Concurrency != 16 {
		t.Fatalf("app events defaults: %+v", c.AppEvents)
	}
	if c.PushesAppEvents() {
		t.Fatal("pushes app events without app_events.url")
	}
	names := EnvNames()
	for _, n := range []string{"BILLING_APP_EVENTS_URL", "BILLING_APP_EVENTS_SECRETS", "BILLING_APP_EVENTS_TIMEOUT", "BILLING_APP_EVENTS_CONCURRENCY"} {
		if !slices.Contains(names, n) {
			t.Errorf("EnvNames lacks %s", n)
		}
	}
}

// TestAppEventsFromEnv: a url and two secrets (a rotation in progress, newest first) from the
// environment.
func TestAppEventsFromEnv(t *testing.T) {
	clearEnv(t)
	setEnv(t, map[string]string{
		"BILLING_APP_EVENTS_URL":         "https://app.example.com:8443/billing-events?token=x",
		"BILLING_APP_EVENTS_SECRETS":     appSecret32 + " , " + appSecret24,
		"BILLING_APP_EVENTS_TIMEOUT":     "3s",
		"BILLING_APP_EVENTS_CONCURRENCY": "4",
	})
	c, err := Load("")
	if err != nil {
		t.Fatal(err)
	}
	if c.AppEvents.URL != "https://app.example.com:8443/billing-events?token=x" || !reflect.DeepEqual(c.AppEvents.Secrets, []string{appSecret32, appSecret24}) ||
		c.AppEvents.Timeout != 3*time.Second || c.AppEvents.Concurrency != 4 {
		t.Fatalf("app events: %+v", c.AppEvents)
	}
	if !c.PushesAppEvents() {
		t.Fatal("app_events.url is set but PushesAppEvents is false")
	}
	// The app events queue's workers take their share of the pool: 61 by default, + 4.
	if got := c.PoolSize(); got != 65 {
		t.Fatalf("pool size = %d, want 65", got)
	}
}

// TestAppEventsSecretsFile: app_events.secrets is a secret, read from BILLING_APP_EVENTS_SECRETS_FILE
// or the YAML key secrets_file like the others, newline or comma separated.
func TestAppEventsSecretsFile(t *testing.T) {
	t.Run("environment", func(t *testing.T) {
		clearEnv(t)
		t.Setenv("BILLING_APP_EVENTS_URL", "http://localhost:9000/events")
		t.Setenv("BILLING_APP_EVENTS_SECRETS_FILE", writeFile(t, "app-secrets", appSecret24+"\n"+appSecret32+"\n\n"))
		c, err := Load("")
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(c.AppEvents.Secrets, []string{appSecret24, appSecret32}) {
			t.Fatalf("secrets = %q", c.AppEvents.Secrets)
		}
	})
	t.Run("yaml", func(t *testing.T) {
		clearEnv(t)
		f := writeFile(t, "app-secrets", appSecret32+","+appSecret24+"\n")
		c, err := Load(writeFile(t, "c.yaml", "app_events:\n  url: https://app.example.com/e\n  secrets_file: "+f+"\n"))
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(c.AppEvents.Secrets, []string{appSecret32, appSecret24}) {
			t.Fatalf("secrets = %q", c.AppEvents.Secrets)
		}
	})
	t.Run("value and file both set", func(t *testing.T) {
		clearEnv(t)
		t.Setenv("BILLING_APP_EVENTS_SECRETS", appSecret24)
		t.Setenv("BILLING_APP_EVENTS_SECRETS_FILE", writeFile(t, "app-secrets", appSecret32))
		_, err := Load("")
		wantKeyErr(t, err, "app_events.secrets")
		if strings.Contains(err.Error(), appSecret24[6:]) || strings.Contains(err.Error(), appSecret32[6:]) {
			t.Fatalf("error shows a secret: %v", err)
		}
	})
	t.Run("same secret twice in the file", func(t *testing.T) {
		clearEnv(t)
		t.Setenv("BILLING_APP_EVENTS_SECRETS_FILE", writeFile(t, "app-secrets", appSecret32+"\n"+appSecret32+"\n"))
		_, err := Load("")
		if ce := wantKeyErr(t, err, "app_events.secrets"); strings.Contains(ce.Error(), appSecret32[6:]) {
			t.Fatalf("error shows the secret: %v", ce)
		}
	})
	t.Run("file missing", func(t *testing.T) {
		clearEnv(t)
		t.Setenv("BILLING_APP_EVENTS_SECRETS_FILE", "/nonexistent/app-secrets")
		_, err := Load("")
		wantKeyErr(t, err, "app_events.secrets")
	})
}

// TestAppEventsAccepts: the bounds themselves, and secrets without a url (the feed fills,
// nothing is pushed).
func TestAppEventsAccepts(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		ok   func(*Config) bool
	}{
		{"secrets without a url", map[string]string{"BILLING_APP_EVENTS_SECRETS": appSecret24}, func(c *Config) bool {
			return len(c.AppEvents.Secrets) == 1 && !c.PushesAppEvents() && c.PoolSize() == 61
		}},
		{"http url", map[string]string{"BILLING_APP_EVENTS_URL": "http://app:3000/hooks/billing", "BILLING_APP_EVENTS_SECRETS": appSecret24}, func(c *Config) bool { return c.PushesAppEvents() }},
		{"IPv6 host", map[string]string{"BILLING_APP_EVENTS_URL": "https://[::1]:8443/e", "BILLING_APP_EVENTS_SECRETS": appSecret24}, func(c *Config) bool { return c.PushesAppEvents() }},
		{"24-byte secret", map[string]string{"BILLING_APP_EVENTS_SECRETS": appSecretOf(24)}, func(c *Config) bool { return len(c.AppEvents.Secrets) == 1 }},
		{"64-byte secret", map[string]string{"BILLING_APP_EVENTS_SECRETS": appSecretOf(64)}, func(c *Config) bool { return len(c.AppEvents.Secrets) == 1 }},
		{"timeout of 1s", map[string]string{"BILLING_APP_EVENTS_TIMEOUT": "1s"}, func(c *Config) bool { return c.AppEvents.Timeout == time.Second }},
		{"timeout of 60s", map[string]string{"BILLING_APP_EVENTS_TIMEOUT": "60s"}, func(c *Config) bool { return c.AppEvents.Timeout == time.Minute }},
		{"one worker", map[string]string{"BILLING_APP_EVENTS_CONCURRENCY": "1"}, func(c *Config) bool { return c.AppEvents.Concurrency == 1 }},
		{"256 workers", map[string]string{"BILLING_APP_EVENTS_CONCURRENCY": "256"}, func(c *Config) bool { return c.AppEvents.Concurrency == 256 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clearEnv(t)
			setEnv(t, tt.env)
			c, err := Load("")
			if err != nil {
				t.Fatal(err)
			}
			if !tt.ok(c) {
				t.Fatalf("unexpected app events: %+v", c.AppEvents)
			}
		})
	}
}

// TestAppEventsRefuses: what cannot be pushed or signed stops start-up with one line naming the
// key, and never shows a secret.
func TestAppEventsRefuses(t *testing.T) {
	const url = "https://app.example.com/e"
	tests := []struct {
		name string
		env  map[string]string
		yaml string
		key  string
		msg  string // the message must contain it
	}{
		{name: "ftp url", env: map[string]string{"BILLING_APP_EVENTS_URL": "ftp://app.example.com/e", "BILLING_APP_EVENTS_SECRETS": appSecret24}, key: "app_events.url", msg: "http:// or https://"},
		{name: "scheme only", env: map[string]string{"BILLING_APP_EVENTS_URL": "app.example.com/e", "BILLING_APP_EVENTS_SECRETS": appSecret24}, key: "app_events.url"},
		{name: "relative url", env: map[string]string{"BILLING_APP_EVENTS_URL": "/e", "BILLING_APP_EVENTS_SECRETS": appSecret24}, key: "app_events.url"},
		{name: "no host", env: map[string]string{"BILLING_APP_EVENTS_URL": "https:///e", "BILLING_APP_EVENTS_SECRETS": appSecret24}, key: "app_events.url", msg: "host"},
		{name: "port without host", env: map[string]string{"BILLING_APP_EVENTS_URL": "https://:8443/e", "BILLING_APP_EVENTS_SECRETS": appSecret24}, key: "app_events.url"},
		{name: "opaque", env: map[string]string{"BILLING_APP_EVENTS_URL": "https:app.example.com", "BILLING_APP_EVENTS_SECRETS": appSecret24}, key: "app_events.url"},
		{name: "unparsable", env: map[string]string{"BILLING_APP_EVENTS_URL": "https://app.example.com:port/e?token=hunter2", "BILLING_APP_EVENTS_SECRETS": appSecret24}, key: "app_events.url"},
		{name: "user info", env: map[string]string{"BILLING_APP_EVENTS_URL": "https://u:hunter2@app.example.com/e", "BILLING_APP_EVENTS_SECRETS": appSecret24}, key: "app_events.url", msg: "signature"},
		{name: "user without password", env: map[string]string{"BILLING_APP_EVENTS_URL": "https://hunter2@app.example.com/e", "BILLING_APP_EVENTS_SECRETS": appSecret24}, key: "app_events.url", msg: "signature"},
		{name: "fragment", env: map[string]string{"BILLING_APP_EVENTS_URL": url + "#x", "BILLING_APP_EVENTS_SECRETS": appSecret24}, key: "app_events.url", msg: "fragment"},
		{name: "empty fragment", env: map[string]string{"BILLING_APP_EVENTS_URL": url + "#", "BILLING_APP_EVENTS_SECRETS": appSecret24}, key: "app_events.url", msg: "fragment"},
		{name: "url without a secret", env: map[string]string{"BILLING_APP_EVENTS_URL": url}, key: "app_events.secrets", msg: "at least one secret to sign"},
		{name: "url in yaml without a secret", yaml: "app_events:\n  url: " + url + "\n  secrets: []\n", key: "app_events.secrets", msg: "at least one secret to sign"},
		{name: "not whsec_", env: map[string]string{"BILLING_APP_EVENTS_SECRETS": appSecret24[6:]}, key: "app_events.secrets", msg: "whsec_"},
		{name: "Stripe-style whsec_", env: map[string]string{"BILLING_APP_EVENTS_SECRETS": "whsec_t1_0123456789abcdef0123456789abcdef"}, key: "app_events.secrets", msg: "base64"},
		{name: "bare whsec_", env: map[string]string{"BILLING_APP_EVENTS_SECRETS": "whsec_"}, key: "app_events.secrets"},
		{name: "not base64", env: map[string]string{"BILLING_APP_EVENTS_SECRETS": "whsec_not*base64*at*all*here*0000"}, key: "app_events.secrets", msg: "base64"},
		{name: "url-safe alphabet", env: map[string]string{"BILLING_APP_EVENTS_SECRETS": "whsec_" + base64.URLEncoding.EncodeToString([]byte("\xfb\xff\xfe"+strings.Repeat("k", 29)))}, key: "app_events.secrets", msg: "base64"},
		{name: "padding missing", env: map[string]string{"BILLING_APP_EVENTS_SECRETS": strings.TrimRight(appSecret32, "=")}, key: "app_events.secrets", msg: "base64"},
		{name: "non-zero trailing bits", env: map[string]string{"BILLING_APP_EVENTS_SECRETS": "whsec_QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVphYmNkZWZ="}, key: "app_events.secrets", msg: "base64"},
		{name: "16 bytes", env: map[string]string{"BILLING_APP_EVENTS_SECRETS": "whsec_MDEyMzQ1Njc4OWFiY2RlZg=="}, key: "app_events.secrets", msg: "16 bytes"},
		{name: "23 bytes", env: map[string]string{"BILLING_APP_EVENTS_SECRETS": appSecretOf(23)}, key: "app_events.secrets", msg: "23 bytes"},
		{name: "65 bytes", env: map[string]string{"BILLING_APP_EVENTS_SECRETS": appSecretOf(65)}, key: "app_events.secrets", msg: "65 bytes"},
		{name: "bad secret after a good one", env: map[string]string{"BILLING_APP_EVENTS_URL": url, "BILLING_APP_EVENTS_SECRETS": appSecret24 + ",whsec_hunter2"}, key: "app_events.secrets", msg: "entry 2"},
		{name: "same secret twice", env: map[string]string{"BILLING_APP_EVENTS_URL": url, "BILLING_APP_EVENTS_SECRETS": appSecret24 + "," + appSecret32 + "," + appSecret24}, key: "app_events.secrets", msg: "entries 1 and 3"},
		{name: "same secret twice in yaml", yaml: "app_events:\n  secrets: [" + appSecret32 + ", " + appSecret32 + "]\n", key: "app_events.secrets", msg: "same secret"},
		{name: "timeout below 1s", env: map[string]string{"BILLING_APP_EVENTS_TIMEOUT": "999ms"}, key: "app_events.timeout"},
		{name: "timeout above 60s", env: map[string]string{"BILLING_APP_EVENTS_TIMEOUT": "1m0.001s"}, key: "app_events.timeout"},
		{name: "zero timeout", env: map[string]string{"BILLING_APP_EVENTS_TIMEOUT": "0"}, key: "app_events.timeout"},
		{name: "unitless timeout", env: map[string]string{"BILLING_APP_EVENTS_TIMEOUT": "10"}, key: "app_events.timeout"},
		{name: "no workers", env: map[string]string{"BILLING_APP_EVENTS_CONCURRENCY": "0"}, key: "app_events.concurrency"},
		{name: "negative workers", env: map[string]string{"BILLING_APP_EVENTS_CONCURRENCY": "-1"}, key: "app_events.concurrency"},
		{name: "257 workers", env: map[string]string{"BILLING_APP_EVENTS_CONCURRENCY": "257"}, key: "app_events.concurrency"},
		{name: "concurrency garbage", env: map[string]string{"BILLING_APP_EVENTS_CONCURRENCY": "many"}, key: "app_events.concurrency"},
		{name: "misspelt yaml key", yaml: "app_events:\n  secret: [" + appSecret24 + "]\n", key: "app_events.secret", msg: "did you mean app_events.secrets?"},
		{name: "misspelt variable", env: map[string]string{"BILLING_APP_EVENTS_SECRET": appSecret24}, key: "BILLING_APP_EVENTS_SECRET", msg: "BILLING_APP_EVENTS_SECRETS"},
		{name: "pool smaller than its shares with pushes", env: map[string]string{"BILLING_APP_EVENTS_URL": url, "BILLING_APP_EVENTS_SECRETS": appSecret24, "BILLING_DATABASE_POOL_SIZE": "61"}, key: "database.pool_size", msg: "app_events.concurrency"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clearEnv(t)
			setEnv(t, tt.env)
			path := ""
			if tt.yaml != "" {
				path = writeFile(t, "c.yaml", tt.yaml)
			}
			c, err := Load(path)
			if c != nil {
				t.Errorf("Load returned a config alongside an error")
			}
			ce := wantKeyErr(t, err, tt.key)
			if !strings.Contains(ce.Msg, tt.msg) {
				t.Errorf("message %q does not say %q", ce.Msg, tt.msg)
			}
			// No secret, nor the body of one, nor a password of the url.
			msg := err.Error()
			for _, s := range []string{appSecret24[6:], appSecret32[6:], "hunter2", "not*base64", "MDEyMzQ1Njc4OWFiY2RlZg", strings.TrimPrefix(tt.env["BILLING_APP_EVENTS_SECRETS"], "whsec_")} {
				if s != "" && strings.Contains(msg, s) {
					t.Errorf("the error shows a secret (%q): %v", s, msg)
				}
			}
		})
	}
}

// TestAppEventsValidate covers the rules for Configs built in code.
func TestAppEventsValidate(t *testing.T) {
	t.Parallel()
	pushing := func(c *Config) {
		c.AppEvents.URL, c.AppEvents.Secrets = "https://app.example.com/e", []string{appSecret24}
	}
	c := validConfig()
	pushing(c)
	if err := c.Validate(); err != nil {
		t.Fatalf("valid app events rejected: %v", err)
	}
	tests := []struct {
		name   string
		mutate func(*Config)
		key    string
	}{
		{"no secret", func(c *Config) { pushing(c); c.AppEvents.Secrets = nil }, "app_events.secrets"},
		{"empty secret", func(c *Config) { pushing(c); c.AppEvents.Secrets = []string{""} }, "app_events.secrets"},
		{"secret with a line break", func(c *Config) {
			pushing(c)
			c.AppEvents.Secrets = []string{appSecret24[:20] + "\n" + appSecret24[20:]}
		}, "app_events.secrets"},
		{"zero timeout", func(c *Config) { c.AppEvents.Timeout = 0 }, "app_events.timeout"},
		{"zero concurrency", func(c *Config) { c.AppEvents.Concurrency = 0 }, "app_events.concurrency"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := validConfig()
			tt.mutate(c)
			wantKeyErr(t, c.Validate(), tt.key)
		})
	}
}
