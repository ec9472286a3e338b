package entitlements

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverdatabasesql"

	"billing/appevents"
	"billing/billing"
	"billing/internal/stripeclient"
	"billing/internal/stripeevents"
	"billing/internal/testenv"
	"billing/webhooks"
)

// BenchmarkInlineEventStatements delivers the lifecycle mix (created, payment_failed,
// payment_succeeded, updated, deleted of a new subscription and invoice per round) through POST
// /webhooks/stripe with events applied in their receive transaction, and reports the statements
// each event costs PostgreSQL (BEGIN and COMMIT included: round trips, the cost that wall time on
// a shared machine hides), one delivery at a time (no batch of group commit forms). Quick: -benchtime 20x (20 rounds of 5 events).
func BenchmarkInlineEventStatements(b *testing.B) {
	db, st := testenv.CountedDB(b)
	sqlDB, err := db.DB()
	if err != nil {
		b.Fatal(err)
	}
	logger := slog.New(slog.DiscardHandler)
	rc, err := river.NewClient(riverdatabasesql.New(sqlDB), &river.Config{Logger: logger})
	if err != nil {
		b.Fatal(err)
	}
	reg := webhooks.NewRegistry()
	inbox := webhooks.New(webhooks.Config{DB: db, Logger: logger, Registry: reg, TestSecrets: []string{pathSecret},
		Tolerance: 5 * time.Minute, MaxAttempts: 3, RetryDelay: time.Millisecond, ApplyInline: true,
		Metrics: webhooks.NewMetrics(prometheus.NewRegistry())})
	inbox.SetJobs(rc)
	// A Stripe client (never called here) as the service has one: events that set a renewal queue
	// its re-read, as in production.
	unused := stripeclient.New("http://127.0.0.1:9", "sk_test_unused", logger).Subscriptions
	// The app is told, as in production: each round's customer is a linked user's.
	subs := billing.New(billing.Deps{DB: db, Jobs: rc, Logger: logger, Reread: billing.RereadDeps{Stripe: unused}})
	ents := New(Deps{DB: db, Billing: subs, Jobs: rc, Logger: logger, Policy: Policy{PastDueEntitled: true},
		AppEvents: appevents.NewTeller(nil)})
	subs.SetTeller(ents)
	subs.Register(reg)
	ents.Register(reg)
	if err := db.Exec(`INSERT INTO customers (user_id, stripe_customer_id, email, livemode)
		SELECT 'user_st' || g, 'cus_st' || g, 'st' || g || '@example.com', false FROM generate_series(0, ` + fmt.Sprint(b.N) + `) g`).Error; err != nil {
		b.Fatal(err)
	}
	e := echo.New()
	inbox.MountWebhook(e)
	types := []string{billing.EventSubscriptionCreated, billing.EventInvoicePaymentFailed, billing.EventInvoicePaymentSucceeded,
		billing.EventSubscriptionUpdated, billing.EventSubscriptionDeleted}
	var statements, events int64
	created := time.Now().Add(-time.Hour)
	b.ResetTimer()
	cpu0 := processCPU(b)
	for n := range b.N {
		for k, typ := range types {
			body, err := stripeevents.SampleWith(typ, stripeevents.SampleOptions{Suffix: fmt.Sprintf("st%d", n),
				EventID: fmt.Sprintf("evt_st%d_%d", n, k), Now: created.Add(time.Duration(k) * time.Second)})
			if err != nil {
				b.Fatal(err)
			}
			req := httptest.NewRequest(http.MethodPost, "/webhooks/stripe", strings.NewReader(string(body)))
			req.Header.Set("Stripe-Signature", stripeevents.SignatureHeader(body, pathSecret, time.Now()))
			rec := httptest.NewRecorder()
			before := st.Count()
			e.ServeHTTP(rec, req)
			statements += st.Count() - before
			events++
			if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"received"`) {
				b.Fatalf("%s answered %d %s", typ, rec.Code, rec.Body)
			}
		}
	}
	cpu := processCPU(b) - cpu0
	b.ReportMetric(float64(statements)/float64(events), "statements/event")
	// The Go side of an event (signature, parsing, handler, driver), without PostgreSQL's: less
	// noisy than the service's CPU under load, and the part a round trip less saves. It includes
	// the loop's own building and signing of each payload, the same in every build compared.
	b.ReportMetric(float64(cpu.Microseconds())/float64(events), "cpu-µs/event")
}
