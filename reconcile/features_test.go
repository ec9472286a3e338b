package reconcile

import (
	"context"
	"slices"
	"testing"
	"time"

	"billing/billing"
	"billing/internal/stripeemu"
)

// A missed seat change and a missed summary: the run finds both, repairs them, the entitlement
// answers Stripe's seats and features, and a second run finds nothing.
func TestMissedQuantityAndFeaturesAreRepaired(t *testing.T) {
	e := newEnv(t)
	start, end := period()
	c := e.acct.AddCustomer(stripeemu.CustomerSpec{Email: "seats@example.com", Metadata: map[string]string{"user_id": "useats"}})
	e.linkUser("useats", c)
	id := e.acct.PutSubscription(stripeemu.SubscriptionSpec{Customer: c, Status: "active", PriceID: "price_team",
		Quantity: 3, CurrentPeriodStart: start, CurrentPeriodEnd: end})
	e.deliverSub(billing.EventSubscriptionCreated, id, ago(2*time.Hour))
	// Stripe: 8 seats now, and features the service never heard of (more than a page).
	e.acct.UpdateSubscription(id, func(o map[string]any) {
		items := o["items"].(map[string]any)
		items["data"].([]any)[0].(map[string]any)["quantity"] = 8
	})
	e.acct.SetEntitlementPageSize(2)
	e.acct.SetActiveEntitlements(c, "sso", "audit_log", "api")

	ent, err := e.ents.Entitlement(context.Background(), "useats")
	if err != nil || ent.Quantity == nil || *ent.Quantity != 3 || len(ent.Features) != 0 {
		t.Fatalf("setup: %+v %v", ent, err)
	}

	dry := e.run(true)
	wantSummary(t, dry, 1, 1, 0, 0, 0, ExitDrift)
	if got := e.driftOf(dry.RunID, id); len(got) != 2 || !has(got, FieldQuantity) || !has(got, FieldFeatures) {
		t.Fatalf("dry run drift %v, want quantity and features", got)
	}
	if ent, _ := e.ents.Entitlement(context.Background(), "useats"); *ent.Quantity != 3 || len(ent.Features) != 0 {
		t.Fatalf("a dry run repaired: %+v", ent)
	}

	sum := e.run(false)
	wantSummary(t, sum, 1, 1, 1, 0, 0, ExitClean)
	got := e.driftOf(sum.RunID, id)
	if !got[FieldQuantity] || !got[FieldFeatures] || len(got) != 2 {
		t.Fatalf("drift %v, want quantity and features repaired", got)
	}
	ent, err = e.ents.Entitlement(context.Background(), "useats")
	if err != nil || ent.Quantity == nil || *ent.Quantity != 8 || !slices.Equal(ent.Features, []string{"api", "audit_log", "sso"}) {
		t.Fatalf("after the repair: %+v %v", ent, err)
	}
	for _, r := range e.drift(sum.RunID) {
		if r.Field == FieldFeatures && (r.Local != "" || r.Stripe != "api,audit_log,sso") {
			t.Errorf("features drift row %+v", r)
		}
	}
	e.equalToStripe(id)
	wantSummary(t, e.run(false), 1, 0, 0, 0, 0, ExitClean)
}

// Features that Stripe no longer grants are removed; an ended subscription's customer is not read.
func TestFeaturesRemovedAtStripeAreRemoved(t *testing.T) {
	e := newEnv(t)
	start, end := period()
	c := e.acct.AddCustomer(stripeemu.CustomerSpec{Email: "f@example.com"})
	id := e.acct.PutSubscription(stripeemu.SubscriptionSpec{Customer: c, Status: "active", PriceID: "price_team",
		CurrentPeriodStart: start, CurrentPeriodEnd: end})
	e.deliverSub(billing.EventSubscriptionCreated, id, ago(2*time.Hour))
	e.acct.SetActiveEntitlements(c, "kept", "dropped")
	wantSummary(t, e.run(false), 1, 1, 1, 0, 0, ExitClean)
	e.acct.SetActiveEntitlements(c, "kept")
	wantSummary(t, e.run(false), 1, 1, 1, 0, 0, ExitClean)
	f, err := e.ents.CustomerFeatures(context.Background(), c, false)
	if err != nil || !slices.Equal(f.LookupKeys, []string{"kept"}) {
		t.Fatalf("features %+v %v", f, err)
	}

	ended := e.acct.AddCustomer(stripeemu.CustomerSpec{Email: "ended@example.com"})
	e.acct.PutSubscription(stripeemu.SubscriptionSpec{Customer: ended, Status: "canceled", PriceID: "price_team",
		CurrentPeriodStart: start, CurrentPeriodEnd: end, CanceledAt: start, EndedAt: start})
	before := e.acct.Stats().EntitlementPages
	e.run(false)
	if n := e.acct.Stats().EntitlementPages - before; n != 1 {
		t.Errorf("%d pages of active entitlements read, want 1 (the active customer's only)", n)
	}
}

func has(m map[string]bool, k string) bool { _, ok := m[k]; return ok }
