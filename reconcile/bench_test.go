package reconcile

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"billing/billing"
	"billing/entitlements"
	"billing/internal/stripeemu"
	"billing/internal/testenv"
)

// BenchmarkBackfill reconciles an empty database against an account of 1,000 subscriptions
// (10 pages; active, paid, a customer naming a user per 100), with billing wired as `billing
// reconcile` wires it (a renewal re-read queued per subscription). The double answers at once, so
// objects/s is the run's own pace: it must stay well above Stripe's page ceiling (100 objects a
// page, test/bench_test.go's BenchmarkReconcile measures against it), and statements/object counts
// the round trips to PostgreSQL, which decide that pace. Quick enough for -benchtime 3x.
func BenchmarkBackfill(b *testing.B) {
	const objects = 10 * pageSize
	db, st := testenv.CountedDB(b)
	e := newEnvOn(b, db)
	subs := billing.New(billing.Deps{DB: db, Jobs: e.jobs, Logger: slog.New(slog.DiscardHandler),
		Reread: billing.RereadDeps{Stripe: e.rec.stripe.Subscriptions, Livemode: false}})
	ents := entitlements.New(entitlements.Deps{DB: db, Billing: subs, Jobs: e.jobs, Logger: slog.New(slog.DiscardHandler),
		Policy: entitlements.Policy{PastDueEntitled: true}})
	subs.SetTeller(ents)
	e.rec.SetBilling(subs, ents)
	start, end := period()
	var customer string
	for i := range objects {
		if i%100 == 0 {
			customer = e.acct.AddCustomer(stripeemu.CustomerSpec{Email: fmt.Sprintf("u%d@example.com", i),
				Metadata: map[string]string{"user_id": fmt.Sprintf("user_%d", i)}})
		}
		e.acct.PutSubscription(stripeemu.SubscriptionSpec{Customer: customer, Status: "active", PriceID: "price_bench",
			CurrentPeriodStart: start, CurrentPeriodEnd: end,
			LatestInvoice: &stripeemu.InvoiceSpec{Status: "paid", AttemptCount: 1, AmountDue: 2000}})
	}
	var statements int64
	var elapsed time.Duration
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		if err := db.Exec(`TRUNCATE subscriptions, customers, invoices, reconcile_drift, reconcile_runs, river_job`).Error; err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		n, t0 := st.Count(), time.Now()
		sum, err := e.rec.Run(context.Background(), RunOptions{})
		if err != nil || sum.Err != nil || sum.Objects != objects || sum.Repaired != objects {
			b.Fatalf("backfill: %s (err %v, %v), want %d objects all repaired", sum.Line(), err, sum.Err, objects)
		}
		elapsed += time.Since(t0)
		statements += st.Count() - n
	}
	b.ReportMetric(float64(b.N*objects)/elapsed.Seconds(), "objects/s")
	b.ReportMetric(float64(statements)/float64(b.N*objects), "statements/object")
}
