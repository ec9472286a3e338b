package entitlements

import (
	"context"
	"testing"

	"gorm.io/gorm"

	"billing/billing"
	"billing/billing/billingtest"
	"billing/notices"
	"billing/webhooks"
)

// The fixtures and reads of billing's tests that this package's tests share: they drive billing
// through its exported API and check what entitlements answers from the state it leaves.

var s1 = subObj{ID: "sub_1", Customer: "cus_1", Status: billing.StatusActive, Price: "price_pro", PeriodStart: 0, PeriodEnd: 30 * 86400}

var trialSub = subObj{ID: "sub_t", Customer: "cus_t", Status: billing.StatusTrialing, Price: "price_pro", TrialStart: 1, TrialEnd: 3 * 86400, PeriodEnd: 3 * 86400}

func trialEv(id string, t int64, s subObj) webhooks.Event {
	return subEv(id, billing.EventSubscriptionTrialWillEnd, t, s)
}

func ptr[T any](v T) *T { return &v }

func (e *env) holds(t *testing.T) map[string]billing.HoldView {
	t.Helper()
	list, err := e.subs.Holds(context.Background())
	if err != nil {
		t.Fatalf("holds: %v", err)
	}
	out := map[string]billing.HoldView{}
	for _, h := range list {
		out[h.SubscriptionID] = h
	}
	return out
}

// noticeContent is what the one notice of an event and kind will say.
func (e *env) noticeContent(t *testing.T, eventID, kind string) notices.Args {
	t.Helper()
	return billingtest.NoticeContent(t, e.db, eventID, kind)
}

func (e *env) applySnapshot(t *testing.T, snap billing.Snapshot) billing.SnapshotOutcome {
	t.Helper()
	var out billing.SnapshotOutcome
	err := e.db.Transaction(func(tx *gorm.DB) error {
		var err error
		out, err = e.subs.ApplySnapshot(context.Background(), tx, snap)
		return err
	})
	if err != nil {
		t.Fatalf("apply snapshot %s: %v", snap.Source, err)
	}
	return out
}
