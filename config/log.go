package config

import (
	"log/slog"
	"net/url"
)

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
