package ledger

import (
	"context"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/riverqueue/river"

	"billing/internal/apitest"
	"billing/internal/database"
	"billing/internal/jobs"
	"billing/internal/stripeemu"
)

// insertPendingCharge writes the row exactly as POST /v1/charges commits it before calling
// Stripe, aged by age: what a process killed between that commit and the call leaves behind.
func (v *env) insertPendingCharge(orderID, userID string, amount int64, age time.Duration) {
	v.t.Helper()
	req := chargeRequest{OrderID: orderID, UserID: userID, Amount: amount, Currency: "usd"}
	v.exec(`INSERT INTO charges (order_id, user_id, stripe_customer_id, amount, currency, description,
			request_hash, idempotency_key, livemode, state, created_at, updated_at)
		VALUES ($1, $2, $3, $4, $5, NULL, $6, $7, false, 'pending', $8, $8)`,
		orderID, userID, "cus_"+userID, amount, "usd", requestHash(req), ChargeKey(orderID), time.Now().UTC().Add(-age))
}

func (v *env) finishPending() FinishResult {
	v.t.Helper()
	res, err := v.svc.FinishPending(context.Background(), finishMinAge)
	if err != nil {
		v.t.Fatalf("finish pending: %v", err)
	}
	return res
}

// Killed between the ledger commit and the Stripe call, and nobody repeats the request: the
// ledger finishes the row itself, with the row's key, and makes exactly one PaymentIntent.
func TestLedgerFinishesAChargeLeftPendingByACrash(t *testing.T) {
	t.Parallel()
	v := newEnv(t)
	v.addCustomer("u1")
	v.insertPendingCharge("o1", "u1", 300, 5*time.Minute)
	v.insertPendingCharge("o_young", "u1", 300, 0) // its request may still be running

	if res := v.finishPending(); res.Charges != 1 || res.Finished != 1 {
		t.Fatalf("first run: %+v", res)
	}
	made := v.proxy.Objects(piPath)
	if v.proxy.Executed(http.MethodPost, piPath) != 1 || len(made) != 1 {
		t.Fatalf("Stripe made %d PaymentIntents: %v", len(made), made)
	}
	v.expectKeys(http.MethodPost, piPath, "charge-o1", 1)
	row := v.chargeRow("o1")
	if row.State != stateCompleted || deref(row.PaymentIntentID) != made[0]["id"] || row.PaymentMethodID == nil {
		t.Errorf("row %+v", row)
	}
	if young := v.chargeRow("o_young"); young.State != statePending || young.Attempts != 0 {
		t.Errorf("a row its request may still be finishing was taken: %+v", young)
	}

	// Run again, and the client's own late repeat: nothing more reaches Stripe.
	if res := v.finishPending(); res.Charges != 0 {
		t.Errorf("second run took %d charges", res.Charges)
	}
	rec := v.charge("o1", "u1", 300, "usd")
	expectStatus(t, rec, http.StatusOK)
	if decode(t, rec)["payment_intent_id"] != made[0]["id"] {
		t.Errorf("repeat answered %s", rec.Body)
	}
	if n := len(v.proxy.Filter(http.MethodPost, piPath)); n != 1 {
		t.Errorf("%d PaymentIntent creates in all, want 1", n)
	}
	v.expectStripeHeaders()
}

// Past Stripe's key window the job searches as the repeat path does: an earlier attempt's
// PaymentIntent is found, not made again; with none, it is made with the row's key.
func TestLedgerFinishesPendingChargesPastTheKeyWindow(t *testing.T) {
	t.Parallel()
	t.Run("charged before the crash", func(t *testing.T) {
		t.Parallel()
		v := newEnv(t)
		v.addCustomer("u1")
		for range 3 {
			v.proxy.InjectFault(http.MethodPost, piPath, stripeemu.FaultDropAfter, 1)
		}
		expectError(t, v.charge("o1", "u1", 300, "usd"), http.StatusServiceUnavailable, "stripe_unavailable")
		v.exec(`UPDATE charges SET created_at = now() - interval '25 hours'`)
		v.proxy.ForgetKeys()
		if res := v.finishPending(); res.Finished != 1 {
			t.Fatalf("run: %+v", res)
		}
		made := v.proxy.Objects(piPath)
		if v.proxy.Executed(http.MethodPost, piPath) != 1 || len(made) != 1 || deref(v.chargeRow("o1").PaymentIntentID) != made[0]["id"] {
			t.Errorf("Stripe made %v; row %+v", made, v.chargeRow("o1"))
		}
		if n := len(v.proxy.Filter(http.MethodGet, piPath+"/search")); n != 1 {
			t.Errorf("%d searches, want 1", n)
		}
	})
	t.Run("never charged", func(t *testing.T) {
		t.Parallel()
		v := newEnv(t)
		v.addCustomer("u1")
		v.insertPendingCharge("o1", "u1", 300, 48*time.Hour)
		if res := v.finishPending(); res.Finished != 1 {
			t.Fatalf("run: %+v", res)
		}
		if n := len(v.proxy.Filter(http.MethodGet, piPath+"/search")); n != 1 {
			t.Errorf("%d searches, want 1", n)
		}
		v.expectKeys(http.MethodPost, piPath, "charge-o1", 1)
	})
}

// Stripe unreachable: the row stays pending with the attempt recorded, and the next run
// finishes it under the same key.
func TestLedgerFinisherRetriesAfterAnOutage(t *testing.T) {
	t.Parallel()
	v := newEnv(t)
	v.addCustomer("u1")
	v.insertPendingCharge("o1", "u1", 300, 5*time.Minute)
	for range 3 {
		v.proxy.InjectFault(http.MethodPost, piPath, stripeemu.Fault500, 1)
	}
	if res := v.finishPending(); res.Charges != 1 || res.Finished != 0 {
		t.Fatalf("run during the outage: %+v", res)
	}
	if row := v.chargeRow("o1"); row.State != statePending || row.Attempts != 1 {
		t.Fatalf("row after the outage: %+v", row)
	}
	if res := v.finishPending(); res.Finished != 1 {
		t.Fatalf("run after the outage: %+v", res)
	}
	if v.proxy.Executed(http.MethodPost, piPath) != 1 {
		t.Errorf("%d PaymentIntents made", v.proxy.Executed(http.MethodPost, piPath))
	}
	v.expectKeys(http.MethodPost, piPath, "charge-o1", 4)
}

// A refund left pending is finished the same way; rows of the other mode are never touched.
func TestLedgerFinishesPendingRefundsAndOnlyItsMode(t *testing.T) {
	t.Parallel()
	v := newEnv(t)
	v.addCustomer("u1")
	v.mustCharge("o1", "u1", 1000)
	v.exec(`INSERT INTO refunds (order_id, refund_id, amount, request_hash, idempotency_key, livemode, state, created_at)
		VALUES ('o1', 'r1', 400, $1, $2, false, 'pending', now() - interval '5 minutes')`,
		requestHash(refundRequest{OrderID: "o1", RefundID: "r1", Amount: ptr(int64(400))}), RefundKey("o1", "r1"))
	v.exec(`INSERT INTO charges (order_id, user_id, stripe_customer_id, amount, currency, request_hash, idempotency_key, livemode, state, created_at)
		VALUES ('o_live', 'u1', 'cus_u1', 10, 'usd', 'h', 'charge-o_live', true, 'pending', now() - interval '1 hour')`)
	if res := v.finishPending(); res.Refunds != 1 || res.Charges != 0 || res.Finished != 1 {
		t.Fatalf("run: %+v", res)
	}
	v.expectKeys(http.MethodPost, "/v1/refunds", "refund-o1-r1", 1)
	if row := v.refundRow("o1", "r1"); row.State != stateCompleted || row.StripeRefundID == nil {
		t.Errorf("refund %+v", row)
	}
	if row := v.chargeRow("o_live"); row.State != statePending || row.Attempts != 0 {
		t.Errorf("the other mode's row was touched: %+v", row)
	}
}

func ptr[T any](v T) *T { return &v }

// Through River: the periodic job (run at start by the elected leader) finishes the row.
func TestLedgerFinisherRunsAsAPeriodicJob(t *testing.T) {
	t.Parallel()
	v := newEnv(t)
	v.addCustomer("u1")
	v.insertPendingCharge("o1", "u1", 300, 5*time.Minute)
	workers := river.NewWorkers()
	v.svc.AddWorkers(workers)
	client, err := jobs.NewClient(database.SQL(v.db), jobs.ClientOptions{
		Workers: workers, Queues: map[string]int{river.QueueDefault: 1}, PeriodicJobs: v.svc.PeriodicJobs(),
		Logger: apitest.Logger(t, slog.LevelWarn), TestOnly: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	completed, cancelSub := client.Subscribe(river.EventKindJobCompleted)
	defer cancelSub()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := client.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = client.Stop(context.Background()) }()
	select {
	case ev := <-completed:
		if ev.Job.Kind != (FinishPendingArgs{}).Kind() {
			t.Fatalf("completed %s", ev.Job.Kind)
		}
	case <-ctx.Done():
		t.Fatal("the periodic job did not run")
	}
	if row := v.chargeRow("o1"); row.State != stateCompleted {
		t.Errorf("row %+v", row)
	}
	v.expectKeys(http.MethodPost, piPath, "charge-o1", 1)
}
