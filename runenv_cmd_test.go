package main

import (
	"os"
	"testing"

	"billing/config"
)

// The run file of the dev loop carries test-mode secrets only: a live deployment on the embedded
// cluster writes where it runs and nothing secret.
func TestDevRunEnvWritesSecretsOfTestModeOnly(t *testing.T) {
	cfg := &config.Config{}
	cfg.HTTP.Addr = ":8080"
	cfg.Stripe.APIURL = "http://127.0.0.1:12111"
	cfg.Stripe.SecretKey = "sk_test_123"
	cfg.Stripe.WebhookSecrets.Test = []string{"whsec_test"}
	cfg.Auth.APITokens = []string{"app_token"}
	cfg.Auth.AdminTokens = []string{"ops:admin_token"}

	cfg.Stripe.Mode = "test"
	e := devRunEnv(cfg, "postgres://db")
	if e.ServiceURL != "http://localhost:8080" || e.DatabaseURL != "postgres://db" || e.PID != os.Getpid() ||
		e.StripeKey != "sk_test_123" || e.WebhookSecret != "whsec_test" || e.APIToken != "app_token" || e.AdminToken != "admin_token" {
		t.Errorf("test mode: %+v", e)
	}

	cfg.Stripe.Mode = "live"
	cfg.Stripe.SecretKey = "sk_live_123"
	cfg.HTTP.Addr = "127.0.0.1:9000"
	e = devRunEnv(cfg, "postgres://db")
	if e.StripeKey != "" || e.WebhookSecret != "" || e.APIToken != "" || e.AdminToken != "" {
		t.Errorf("live mode wrote secrets: %+v", e)
	}
	if e.ServiceURL != "http://127.0.0.1:9000" {
		t.Errorf("live mode service URL %q", e.ServiceURL)
	}
}
