package billing

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"gorm.io/gorm"

	"billing/internal/apitest"
	"billing/internal/httpserver"
	"billing/internal/jobs"
	"billing/internal/mail"
	"billing/internal/mail/mailtest"
	"billing/internal/stripeevents"
	"billing/internal/testenv"
	"billing/notices"
	"billing/webhooks"
)

// The lifecycle through the real webhook path: signed deliveries to POST /webhooks/stripe,
// stored by the inbox, processed by its River worker (handler effects, notice jobs and the
// "processed" mark in one transaction), and notices sent by the notices' sender to an SMTP server.

const (
	pathSecret     = "whsec_billing_path_test"
	pathLiveSecret = "whsec_billing_path_live"
)

type webhookPath struct {
	t    *testing.T
	db   *gorm.DB
	svc  *Service
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
	svc := New(Deps{DB: db, Jobs: rc, Logger: logger})
	svc.Register(reg)

	e := httpserver.New(httpserver.Options{Logger: logger, Registry: prometheus.NewRegistry(), Ready: func(context.Context) error { return nil }})
	inbox.MountWebhook(e)
	svc.MountAPI(e.Group("/v1"))
	p.e, p.svc = e, svc

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
func (p *webhookPath) state(id string) *Subscription {
	p.t.Helper()
	st, err := p.svc.Subscription(context.Background(), id, false)
	if err != nil || st == nil {
		p.t.Fatalf("subscription %s: %v", id, err)
	}
	return st
}

func (p *webhookPath) holds() []HoldView {
	p.t.Helper()
	holds, err := p.svc.Holds(context.Background())
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

func TestLifecycleThroughTheWebhookInbox(t *testing.T) {
	t.Parallel()
	p := newWebhookPath(t)
	if err := p.db.Exec(`INSERT INTO customers (user_id, stripe_customer_id, email) VALUES ('u1', 'cus_w', 'u1@example.com')`).Error; err != nil {
		t.Fatal(err)
	}
	t0 := time.Now().UTC().Truncate(time.Second).Add(-time.Hour)
	sub := stripeevents.Subscription{ID: "sub_w", Customer: "cus_w", Status: StatusActive, PriceID: "price_w",
		CurrentPeriodStart: t0, CurrentPeriodEnd: t0.AddDate(0, 1, 0)}
	inv := stripeevents.Invoice{ID: "in_w", Customer: "cus_w", Subscription: "sub_w", Status: "open", AttemptCount: 1,
		AmountDue: 2000, Currency: "usd", HostedInvoiceURL: "https://invoice.stripe.com/i/in_w", NextPaymentAttempt: t0.AddDate(0, 0, 3)}

	// Created, then a failed payment; each delivered twice: stored once, applied once, one mail.
	created := stripeevents.SubscriptionEvent("evt_w1", EventSubscriptionCreated, t0, false, sub)
	failed := stripeevents.InvoiceEvent("evt_w2", EventInvoicePaymentFailed, t0.Add(10*time.Second), false, inv)
	for _, ev := range [][]byte{created, failed} {
		if got := p.deliver(ev); got != "received" {
			t.Fatalf("first delivery: %q", got)
		}
	}
	for _, ev := range [][]byte{created, failed} {
		if got := p.deliver(ev); got != "duplicate" {
			t.Fatalf("redelivery: %q", got)
		}
	}
	p.processed("evt_w1", "evt_w2")
	p.waitFor("delivered notices", `SELECT count(*) FROM notices WHERE delivery IS NOT NULL`, 1)
	if got := p.sentTo(); !slices.Equal(got, []string{"u1@example.com"}) {
		t.Errorf("notices mailed to %v, want one to u1@example.com", got)
	}
	holds := p.holds()
	if len(holds) != 1 || holds[0].SubscriptionID != "sub_w" || holds[0].HoldReason != HoldPaymentFailed ||
		ptrStr(holds[0].UserID) != "u1" || ptrInt(holds[0].AmountDue) != "2000" {
		t.Fatalf("holds: %+v", holds)
	}

	// Out of order and processed concurrently: a newer past_due and an older active snapshot.
	sub.Status = StatusPastDue
	newer := stripeevents.SubscriptionEvent("evt_w4", EventSubscriptionUpdated, t0.Add(40*time.Second), false, sub)
	sub.Status = StatusActive
	older := stripeevents.SubscriptionEvent("evt_w3", EventSubscriptionUpdated, t0.Add(30*time.Second), false, sub)
	p.deliver(newer)
	p.deliver(older)
	p.processed("evt_w3", "evt_w4")
	// The state only: what it grants is the entitlements package's (its own test of this path).
	st := p.state(sub.ID)
	if reason, _, held := st.Hold(); st.Status != StatusPastDue || !held || reason != HoldPaymentFailed {
		t.Errorf("after out-of-order updates: %s, hold %q", st.Status, reason)
	}

	// Paid, and back to active: no hold left, still one mail.
	inv.Status, inv.NextPaymentAttempt = "paid", time.Time{}
	sub.Status = StatusActive
	p.deliver(stripeevents.InvoiceEvent("evt_w5", EventInvoicePaymentSucceeded, t0.Add(50*time.Second), false, inv))
	p.deliver(stripeevents.SubscriptionEvent("evt_w6", EventSubscriptionUpdated, t0.Add(50*time.Second), false, sub))
	p.processed("evt_w5", "evt_w6")
	st = p.state(sub.ID)
	if reason, _, held := st.Hold(); st.Status != StatusActive || held {
		t.Errorf("after recovery: %s, hold %q", st.Status, reason)
	}
	if holds := p.holds(); len(holds) != 0 {
		t.Errorf("holds after recovery: %+v", holds)
	}
	if got := p.sentTo(); len(got) != 1 {
		t.Errorf("%d mails in all, want 1", len(got))
	}
}
