package billing

import (
	"context"
	"testing"

	"gorm.io/gorm"
)

func (e *env) applySnapshot(t *testing.T, snap Snapshot) SnapshotOutcome {
	t.Helper()
	var out SnapshotOutcome
	err := e.db.Transaction(func(tx *gorm.DB) error {
		var err error
		out, err = e.svc.ApplySnapshot(context.Background(), tx, snap)
		return err
	})
	if err != nil {
		t.Fatalf("apply snapshot %s: %v", snap.Source, err)
	}
	return out
}

// A snapshot repairs a row that missed its events, and the ordering guard keeps the newer of a
// snapshot and an event, in both orders.
func TestSnapshotRepairsAndKeepsTheNewer(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.link(t, "u_s", "cus_s", "s@example.com")
	base := subObj{ID: "sub_s", Customer: "cus_s", Status: StatusActive, Price: "price_s", PeriodEnd: 30 * 86400}
	e.mustHandle(t, created("evt_1", 10, base))

	// The cancellation event was missed; Stripe says canceled at t=100.
	out := e.applySnapshot(t, Snapshot{Subscription: base.With(StatusCanceled).JSON(), FetchedAt: at(100), Source: "reconcile:1"})
	if !out.SubscriptionApplied || e.sub(t, "sub_s").Status != StatusCanceled {
		t.Fatalf("snapshot not applied: %+v, status %s", out, e.sub(t, "sub_s").Status)
	}
	// An older event arriving late does not undo the repair.
	if err := e.handle(t, updated("evt_old", 50, base.With(StatusPastDue))); err != nil {
		t.Fatal(err)
	}
	if got := e.sub(t, "sub_s").Status; got != StatusCanceled {
		t.Errorf("an event older than the fetch undid the repair: %s", got)
	}

	// The other order: an event newer than the fetch was applied first.
	e.mustHandle(t, created("evt_2", 10, subObj{ID: "sub_t", Customer: "cus_s", Status: StatusTrialing, Price: "p", TrialEnd: 86400}))
	e.mustHandle(t, updated("evt_new", 200, subObj{ID: "sub_t", Customer: "cus_s", Status: StatusActive, Price: "p", PeriodEnd: 86400 * 30}))
	out = e.applySnapshot(t, Snapshot{Subscription: subObj{ID: "sub_t", Customer: "cus_s", Status: StatusTrialing, Price: "p", TrialEnd: 86400}.JSON(),
		FetchedAt: at(150), Source: "reconcile:2"})
	if out.SubscriptionApplied || e.sub(t, "sub_t").Status != StatusActive {
		t.Errorf("a snapshot older than an applied event undid it: %+v, status %s", out, e.sub(t, "sub_t").Status)
	}
	// In the same second, the event wins.
	e.mustHandle(t, updated("evt_same", 300, subObj{ID: "sub_t", Customer: "cus_s", Status: StatusPastDue, Price: "p"}))
	if out := e.applySnapshot(t, Snapshot{Subscription: subObj{ID: "sub_t", Customer: "cus_s", Status: StatusActive, Price: "p"}.JSON(),
		FetchedAt: at(300).Add(400_000_000), Source: "reconcile:3"}); out.SubscriptionApplied {
		t.Errorf("a snapshot won a tie within one second: %+v", out)
	}
}

// What a snapshot reveals sends no mail, and its open, attempted latest invoice is a hold.
func TestSnapshotHoldsWithoutNotices(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.link(t, "u_h", "cus_h", "h@example.com")
	sub := subObj{ID: "sub_h", Customer: "cus_h", Status: StatusPastDue, Price: "p", PeriodEnd: 86400}
	inv := []byte(`{"id":"in_h","object":"invoice","customer":"cus_h","subscription":"sub_h","status":"open","attempt_count":2,"amount_due":500,"currency":"usd","hosted_invoice_url":"https://invoice.example/in_h","next_payment_attempt":null}`)
	out := e.applySnapshot(t, Snapshot{Subscription: sub.JSON(), LatestInvoice: inv, FetchedAt: at(100), Source: "reconcile:h"})
	if !out.SubscriptionApplied || !out.InvoiceApplied {
		t.Fatalf("outcome %+v", out)
	}
	if reason, _, ok := e.sub(t, "sub_h").Hold(); !ok || reason != HoldPaymentFailed {
		t.Errorf("hold %q %v, want %s", reason, ok, HoldPaymentFailed)
	}
	if rows, due := e.totalNotices(t); rows != 0 || due != 0 {
		t.Errorf("a snapshot sent notices: %d rows, %d queued", rows, due)
	}
	// Paid later: the hold lifts.
	paid := []byte(`{"id":"in_h","object":"invoice","customer":"cus_h","subscription":"sub_h","status":"paid","attempt_count":3,"amount_due":500,"currency":"usd"}`)
	e.applySnapshot(t, Snapshot{Subscription: sub.With(StatusActive).JSON(), LatestInvoice: paid, FetchedAt: at(200), Source: "reconcile:h2"})
	if _, _, ok := e.sub(t, "sub_h").Hold(); ok {
		t.Errorf("hold still in force after a paid snapshot")
	}
	if got, err := e.svc.Subscription(context.Background(), "sub_h", false); err != nil || got == nil || got.Status != StatusActive || ptrStr(got.UserID) != "u_h" {
		t.Errorf("Subscription() = %+v, %v", got, err)
	}
}
