package entitlements

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"gorm.io/gorm"

	"billing/billing"
	"billing/internal/apitest"
	"billing/internal/httpserver"
	"billing/internal/jobs"
	"billing/internal/mail"
	"billing/internal/mail/mailtest"
	"billing/internal/testenv"
	"billing/notices"
	"billing/webhooks"
)

// The real webhook path (signed deliveries to POST /webhooks/stripe, the inbox and its worker),
// with billing and entitlements registered as main registers them: billing's webhookpath_test.go
// has the same helpers for its own state.

const (
	pathSecret     = "whsec_billing_path_test"
	pathLiveSecret = "whsec_billing_path_live"
)

type webhookPath struct {
	t    *testing.T
	db   *gorm.DB
	svc  *Service
	subs *billing.Service
	e    *echo.Echo
	smtp *mailtest.Server
}

func newWebhookPath(t *testing.T) *webhookPath {
	t.Helper()
	db := testenv.DB(t)
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.DiscardHandler)
	p := &webhookPath{t: t, db: db}

	reg := webhooks.NewRegistry()
	inbox := webhooks.New(webhooks.Config{
		DB: db, Logger: logger, Registry: reg, TestSecrets: []string{pathSecret}, LiveSecrets: []string{pathLiveSecret},
		Tolerance: 5 * time.Minute, MaxAttempts: 3, RetryDelay: time.Millisecond,
		Metrics: webhooks.NewMetrics(prometheus.NewRegistry()),
	})
	srv, pool := mailtest.NewServer(t, false, true)
	p.smtp = srv
	workers := river.NewWorkers()
	inbox.AddWorkers(workers)
	sender := notices.NewSender(notices.SenderConfig{DB: db, Logger: logger,
		Mail: mail.Config{SMTPURL: "smtp://" + srv.Addr(), From: "billing@example.com", RootCAs: pool}})
	rc, err := jobs.NewClient(sqlDB, jobs.ClientOptions{
		Workers:      workers,
		Queues:       map[string]int{river.QueueDefault: 4, webhooks.QueueWebhooks: 8},
		PollInterval: 10 * time.Millisecond,
		Logger:       logger,
		TestOnly:     true,
	})
	if err != nil {
		t.Fatalf("river client: %v", err)
	}
	inbox.SetJobs(rc)
	subs := billing.New(billing.Deps{DB: db, Jobs: rc, Logger: logger})
	subs.Register(reg)
	svc := New(Deps{DB: db, Billing: subs, Jobs: rc, Logger: logger, Policy: Policy{PastDueEntitled: true}})
	svc.Register(reg)

	e := httpserver.New(httpserver.Options{Logger: logger, Registry: prometheus.NewRegistry(), Ready: func(context.Context) error { return nil }})
	inbox.MountWebhook(e)
	subs.MountAPI(e.Group("/v1"))
	svc.MountAPI(e.Group("/v1"))
	p.e, p.svc, p.subs = e, svc, subs

	ctx, cancel := context.WithCancel(context.Background())
	if err := rc.Start(ctx); err != nil {
		t.Fatalf("start river: %v", err)
	}
	sent := make(chan struct{})
	go func() { defer close(sent); sender.Run(ctx) }()
	t.Cleanup(func() {
		stopCtx, stop := context.WithTimeout(context.Background(), 10*time.Second)
		defer stop()
		_ = rc.Stop(stopCtx)
		cancel()
		<-sent
	})
	return p
}

// deliver posts a signed event and returns the inbox's {"status"}.
func (p *webhookPath) deliver(payload []byte) string {
	p.t.Helper()
	rec := apitest.DeliverWebhook(p.t, p.e, pathSecret, payload)
	var b struct{ Status string }
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &b) != nil {
		p.t.Fatalf("delivery answered %d %s", rec.Code, rec.Body)
	}
	return b.Status
}

func (p *webhookPath) get(path string, out any) {
	p.t.Helper()
	rec := httptest.NewRecorder()
	p.e.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), out) != nil {
		p.t.Fatalf("GET %s: %d %s", path, rec.Code, rec.Body)
	}
}

// waitFor polls query (a count) until it is want.
func (p *webhookPath) waitFor(what, query string, want int, args ...any) {
	p.t.Helper()
	apitest.WaitForCount(p.t, p.db, what, query, want, args...)
}

func (p *webhookPath) processed(ids ...string) {
	p.t.Helper()
	apitest.WaitProcessed(p.t, p.db, ids...)
}

// state is a subscription of test mode as stored.
func (p *webhookPath) state(id string) *billing.Subscription {
	p.t.Helper()
	st, err := p.subs.Subscription(context.Background(), id, false)
	if err != nil || st == nil {
		p.t.Fatalf("subscription %s: %v", id, err)
	}
	return st
}

func (p *webhookPath) holds() []billing.HoldView {
	p.t.Helper()
	holds, err := p.subs.Holds(context.Background())
	if err != nil {
		p.t.Fatalf("holds: %v", err)
	}
	return holds
}

// sentTo lists the recipients of the mails the SMTP server received.
func (p *webhookPath) sentTo() []string {
	var to []string
	for _, m := range p.smtp.Received() {
		to = append(to, strings.TrimSuffix(strings.TrimPrefix(m.To, "TO:<"), ">"))
	}
	return to
}
