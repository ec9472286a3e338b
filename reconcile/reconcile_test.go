package reconcile

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"billing/billing"
	"billing/internal/stripeemu"
	"billing/internal/testenv"
	"billing/webhooks"
)

// Missed created, updated and deleted events, and a missed payment failure: the run finds each
// and repairs it through the event code, after which the local state equals Stripe's, the
// entitlement follows, no notice is sent, and a second run finds nothing.
func TestMissedEventsAreRepairedThroughTheEventCode(t *testing.T) {
	e := newEnv(t)
	start, end := period()
	customer := func(user string) string {
		c := e.acct.AddCustomer(stripeemu.CustomerSpec{Email: user + "@example.com", Metadata: map[string]string{"user_id": user}})
		e.linkUser(user, c)
		return c
	}

	// created missed: Stripe has it, the local state never heard of it.
	cA := customer("ua")
	a := e.acct.PutSubscription(stripeemu.SubscriptionSpec{Customer: cA, Status: "active", PriceID: "price_basic",
		CurrentPeriodStart: start, CurrentPeriodEnd: end, LatestInvoice: &stripeemu.InvoiceSpec{Status: "paid", AttemptCount: 1}})

	// updated missed: trialing locally; at Stripe active on another price, canceling at period end.
	cB := customer("ub")
	b := e.acct.PutSubscription(stripeemu.SubscriptionSpec{Customer: cB, Status: "trialing", PriceID: "price_basic",
		CurrentPeriodStart: start, CurrentPeriodEnd: end, TrialStart: start, TrialEnd: end})
	e.deliverSub(billing.EventSubscriptionCreated, b, ago(2*time.Hour))
	e.acct.PutSubscription(stripeemu.SubscriptionSpec{ID: b, Customer: cB, Status: "active", PriceID: "price_pro",
		CurrentPeriodStart: start, CurrentPeriodEnd: end, TrialStart: start, TrialEnd: end, CancelAtPeriodEnd: true, CancelAt: end})

	// deleted missed: active locally, canceled at Stripe.
	cC := customer("uc")
	c := e.acct.PutSubscription(stripeemu.SubscriptionSpec{Customer: cC, Status: "active", PriceID: "price_basic",
		CurrentPeriodStart: start, CurrentPeriodEnd: end})
	e.deliverSub(billing.EventSubscriptionCreated, c, ago(2*time.Hour))
	e.acct.UpdateSubscription(c, func(o map[string]any) {
		o["status"], o["canceled_at"], o["ended_at"] = "canceled", ago(30*time.Minute).Unix(), ago(30*time.Minute).Unix()
	})

	// payment failure missed: past_due at Stripe with an open, attempted invoice.
	cD := customer("ud")
	d := e.acct.PutSubscription(stripeemu.SubscriptionSpec{Customer: cD, Status: "active", PriceID: "price_basic",
		CurrentPeriodStart: start, CurrentPeriodEnd: end, LatestInvoice: &stripeemu.InvoiceSpec{Status: "paid", AttemptCount: 1}})
	e.deliverSub(billing.EventSubscriptionCreated, d, ago(2*time.Hour))
	e.acct.SetLatestInvoice(d, stripeemu.InvoiceSpec{Status: "open", AttemptCount: 1, AmountDue: 1500})
	e.acct.UpdateSubscription(d, func(o map[string]any) { o["status"] = "past_due" })

	if e.entitled("ua") || !e.entitled("uc") {
		t.Fatal("setup: ua should not be entitled yet and uc still should")
	}

	sum := e.run(false)
	wantSummary(t, sum, 4, 4, 4, 0, 0, ExitClean)
	for _, id := range []string{a, b, c, d} {
		e.equalToStripe(id)
	}
	for id, fields := range map[string][]string{
		a: {FieldMissingLocally},
		b: {FieldStatus, FieldPrice, FieldCancelAtPeriodEnd, FieldCancelAt},
		c: {FieldStatus, FieldCanceledAt, FieldEndedAt},
		d: {FieldStatus, FieldHold},
	} {
		got := e.driftOf(sum.RunID, id)
		if len(got) != len(fields) {
			t.Errorf("drift of %s = %v, want %v", id, got, fields)
		}
		for _, f := range fields {
			if repaired, ok := got[f]; !ok || !repaired {
				t.Errorf("drift of %s: %s recorded=%v repaired=%v", id, f, ok, repaired)
			}
		}
	}
	if !e.entitled("ua") || !e.entitled("ub") || e.entitled("uc") {
		t.Errorf("entitlement after repair: ua=%v ub=%v uc=%v, want true true false", e.entitled("ua"), e.entitled("ub"), e.entitled("uc"))
	}
	ent, err := e.ents.Entitlement(context.Background(), "ud")
	if err != nil || !ent.OnHold || ent.HoldReason == nil || *ent.HoldReason != billing.HoldPaymentFailed {
		t.Errorf("ud after repair: %+v, %v; want on hold for payment_failed", ent, err)
	}
	if n := e.count(`SELECT count(*) FROM notices`); n != 0 {
		t.Errorf("%d notices sent for what a reconcile found", n)
	}
	if got := metricValue(t, e.rec.metrics.drift.WithLabelValues(FieldStatus)); got != 3 {
		t.Errorf("billing_reconcile_drift_total{field=status} = %v, want 3", got)
	}

	again := e.run(false)
	wantSummary(t, again, 4, 0, 0, 0, 0, ExitClean)
	if got := metricValue(t, e.rec.metrics.objects); got != 8 {
		t.Errorf("billing_reconcile_objects_total = %v, want 8", got)
	}
	if got := metricValue(t, e.rec.metrics.lastSuccess); got < float64(time.Now().Add(-time.Minute).Unix()) {
		t.Errorf("billing_reconcile_last_success_timestamp_seconds = %v, want about now", got)
	}
	var run RunView
	if err := e.db.Raw(`SELECT * FROM reconcile_runs WHERE run_id = $1`, again.RunID).Scan(&run).Error; err != nil {
		t.Fatal(err)
	}
	if run.FinishedAt == nil || run.Objects != 4 || run.Drifted != 0 || run.Error != nil || run.Trigger != TriggerCommand {
		t.Errorf("recorded run = %+v", run)
	}
}

// A local subscription Stripe does not list is reported, never deleted.
func TestLocalSubscriptionMissingAtStripe(t *testing.T) {
	e := newEnv(t)
	start, end := period()
	cus := e.acct.AddCustomer(stripeemu.CustomerSpec{})
	gone := e.acct.PutSubscription(stripeemu.SubscriptionSpec{Customer: cus, Status: "active", PriceID: "price_a", CurrentPeriodStart: start, CurrentPeriodEnd: end})
	e.deliverSub(billing.EventSubscriptionCreated, gone, ago(time.Hour))
	e.acct.RemoveSubscription(gone)
	kept := e.acct.PutSubscription(stripeemu.SubscriptionSpec{Customer: cus, Status: "active", PriceID: "price_a", CurrentPeriodStart: start, CurrentPeriodEnd: end})
	e.deliverSub(billing.EventSubscriptionCreated, kept, ago(time.Hour))

	sum := e.run(false)
	wantSummary(t, sum, 1, 0, 0, 1, 0, ExitDrift)
	if l := e.local(gone); l == nil || l.Status != billing.StatusActive {
		t.Fatalf("missing subscription changed locally: %+v", l)
	}
	rows := e.drift(sum.RunID)
	if len(rows) != 1 || rows[0].SubscriptionID != gone || rows[0].Field != FieldMissingAtStripe || rows[0].Local != "active" || rows[0].Repaired {
		t.Fatalf("drift = %+v, want one unrepaired missing_at_stripe of %s", rows, gone)
	}
}

// An event newer than the page arrives while the page is on its way: the page is older than the
// local row, so the run reads the subscription again instead of calling the row wrong, finds it
// right, and leaves it as the newer event made it.
func TestEventAppliedWhileThePageIsOnItsWay(t *testing.T) {
	e := newEnv(t)
	start, end := period()
	cus := e.acct.AddCustomer(stripeemu.CustomerSpec{})
	e.linkUser("u1", cus)
	id := e.acct.PutSubscription(stripeemu.SubscriptionSpec{Customer: cus, Status: "trialing", PriceID: "price_a",
		CurrentPeriodStart: start, CurrentPeriodEnd: end, TrialStart: start, TrialEnd: end})
	e.deliverSub(billing.EventSubscriptionCreated, id, ago(2*time.Hour))
	e.acct.UpdateSubscription(id, func(o map[string]any) { o["status"] = "active" }) // missed

	computed, release := e.acct.HoldNextPage()
	done := make(chan Summary, 1)
	go func() {
		sum, err := e.rec.Run(context.Background(), RunOptions{})
		if err != nil {
			t.Error(err)
		}
		done <- sum
	}()
	waitFor(t, computed, "the page to be read")
	// Stripe moves on after answering the page, and says so.
	e.acct.UpdateSubscription(id, func(o map[string]any) { o["status"] = "past_due" })
	e.deliverSub(billing.EventSubscriptionUpdated, id, time.Now().UTC().Truncate(time.Second))
	release()
	sum := <-done

	if l := e.local(id); l.Status != billing.StatusPastDue {
		t.Fatalf("status after the race = %s, want past_due (the newer event)", l.Status)
	}
	wantSummary(t, sum, 1, 0, 0, 0, 0, ExitClean)
	if n := len(e.proxy.Filter(http.MethodGet, "/v1/subscriptions/"+id)); n != 1 {
		t.Errorf("subscription read again %d times, want 1", n)
	}
	e.equalToStripe(id)
}

// The events the local state missed arrive after the run repaired it: they are older than
// Stripe's answer, and change nothing.
func TestOlderEventsAfterTheRepairChangeNothing(t *testing.T) {
	e := newEnv(t)
	start, end := period()
	cus := e.acct.AddCustomer(stripeemu.CustomerSpec{})
	id := e.acct.PutSubscription(stripeemu.SubscriptionSpec{Customer: cus, Status: "trialing", PriceID: "price_a",
		CurrentPeriodStart: start, CurrentPeriodEnd: end, TrialStart: start, TrialEnd: end})
	created := e.acct.Subscription(id)
	e.deliver(billing.EventSubscriptionCreated, created, ago(3*time.Hour))
	e.acct.UpdateSubscription(id, func(o map[string]any) { o["status"] = "past_due" })
	pastDue := e.acct.Subscription(id)
	e.acct.UpdateSubscription(id, func(o map[string]any) { o["status"] = "active" })
	active := e.acct.Subscription(id)

	sum := e.run(false)
	wantSummary(t, sum, 1, 1, 1, 0, 0, ExitClean)

	e.deliver(billing.EventSubscriptionUpdated, pastDue, ago(2*time.Hour))
	e.deliver(billing.EventSubscriptionUpdated, active, ago(time.Hour))
	e.deliver(billing.EventSubscriptionCreated, created, ago(3*time.Hour))
	if l := e.local(id); l.Status != billing.StatusActive {
		t.Fatalf("status after late events = %s, want active", l.Status)
	}
	e.equalToStripe(id)
	wantSummary(t, e.run(false), 1, 0, 0, 0, 0, ExitClean)
}

// A dry run records what differs and changes no subscription and no customer; the run after it
// repairs the same drift.
func TestDryRunReportsAndChangesNothing(t *testing.T) {
	e := newEnv(t)
	start, end := period()
	cA := e.acct.AddCustomer(stripeemu.CustomerSpec{Email: "ua@example.com", Metadata: map[string]string{"user_id": "ua"}})
	a := e.acct.PutSubscription(stripeemu.SubscriptionSpec{Customer: cA, Status: "active", PriceID: "price_a", CurrentPeriodStart: start, CurrentPeriodEnd: end})
	cB := e.acct.AddCustomer(stripeemu.CustomerSpec{})
	e.linkUser("ub", cB)
	b := e.acct.PutSubscription(stripeemu.SubscriptionSpec{Customer: cB, Status: "active", PriceID: "price_a", CurrentPeriodStart: start, CurrentPeriodEnd: end})
	e.deliverSub(billing.EventSubscriptionCreated, b, ago(time.Hour))
	e.acct.UpdateSubscription(b, func(o map[string]any) { o["status"] = "unpaid" })

	subsBefore, custBefore := e.count(`SELECT count(*) FROM subscriptions`), e.count(`SELECT count(*) FROM customers`)
	sum := e.run(true)
	wantSummary(t, sum, 2, 2, 0, 0, 0, ExitDrift)
	if !sum.DryRun {
		t.Error("summary does not say dry run")
	}
	if e.local(a) != nil || e.local(b).Status != billing.StatusActive {
		t.Fatal("a dry run changed a subscription")
	}
	if s, c := e.count(`SELECT count(*) FROM subscriptions`), e.count(`SELECT count(*) FROM customers`); s != subsBefore || c != custBefore {
		t.Fatalf("a dry run changed rows: subscriptions %d→%d, customers %d→%d", subsBefore, s, custBefore, c)
	}
	rows := e.drift(sum.RunID)
	fields := map[string]bool{}
	for _, r := range rows {
		if r.Repaired {
			t.Errorf("dry run marked %s of %s repaired", r.Field, r.SubscriptionID)
		}
		fields[r.SubscriptionID+"/"+r.Field] = true
	}
	for _, want := range []string{a + "/" + FieldMissingLocally, a + "/" + FieldCustomerLink, b + "/" + FieldStatus} {
		if !fields[want] {
			t.Errorf("dry run did not record %s (got %v)", want, fields)
		}
	}

	wantSummary(t, e.run(false), 2, 2, 2, 0, 0, ExitClean)
	if !e.entitled("ua") || e.entitled("ub") {
		t.Error("after the real run: ua should be entitled (linked, active) and ub not (unpaid)")
	}
}

// On an empty database the run imports the account and links customers to users by
// metadata.user_id; a link to another customer is reported, never overwritten.
func TestEmptyDatabaseBackfill(t *testing.T) {
	e := newEnv(t)
	start, end := period()
	c1 := e.acct.AddCustomer(stripeemu.CustomerSpec{Email: "one@example.com", Name: "One", Metadata: map[string]string{"user_id": "u1"}})
	c2 := e.acct.AddCustomer(stripeemu.CustomerSpec{Email: "two@example.com", Metadata: map[string]string{"user_id": "u2"}})
	c3 := e.acct.AddCustomer(stripeemu.CustomerSpec{Email: "nobody@example.com"})
	c4 := e.acct.AddCustomer(stripeemu.CustomerSpec{Metadata: map[string]string{"user_id": "not a user id!"}})
	c5 := e.acct.AddCustomer(stripeemu.CustomerSpec{Metadata: map[string]string{"user_id": "u5"}})
	e.linkUser("u5", "cus_elsewhere")
	spec := func(c, status string) stripeemu.SubscriptionSpec {
		return stripeemu.SubscriptionSpec{Customer: c, Status: status, PriceID: "price_a", CurrentPeriodStart: start, CurrentPeriodEnd: end,
			LatestInvoice: &stripeemu.InvoiceSpec{Status: "paid", AttemptCount: 1}}
	}
	old := e.acct.PutSubscription(stripeemu.SubscriptionSpec{Customer: c1, Status: "canceled", PriceID: "price_old",
		CanceledAt: ago(48 * time.Hour), EndedAt: ago(48 * time.Hour)})
	s1 := e.acct.PutSubscription(spec(c1, "active"))
	s2 := e.acct.PutSubscription(spec(c2, "trialing"))
	s3 := e.acct.PutSubscription(spec(c3, "active"))
	s4 := e.acct.PutSubscription(spec(c4, "active"))
	s5 := e.acct.PutSubscription(spec(c5, "active"))

	sum := e.run(false)
	wantSummary(t, sum, 6, 6, 4, 0, 0, ExitDrift)
	for _, id := range []string{old, s1, s2, s3, s4, s5} {
		e.equalToStripe(id)
	}
	var links []struct {
		UserID           string `gorm:"column:user_id"`
		StripeCustomerID string `gorm:"column:stripe_customer_id"`
		Email            string `gorm:"column:email"`
		Name             string `gorm:"column:name"`
		Livemode         bool   `gorm:"column:livemode"`
	}
	if err := e.db.Raw(`SELECT user_id, stripe_customer_id, email, name, livemode FROM customers ORDER BY user_id`).Scan(&links).Error; err != nil {
		t.Fatal(err)
	}
	want := "u1 " + c1 + " one@example.com One false|u2 " + c2 + " two@example.com  false|u5 cus_elsewhere u5@example.com  false"
	var got []string
	for _, l := range links {
		got = append(got, strings.Join([]string{l.UserID, l.StripeCustomerID, l.Email, l.Name, map[bool]string{true: "true", false: "false"}[l.Livemode]}, " "))
	}
	if strings.Join(got, "|") != want {
		t.Fatalf("customers =\n%s\nwant\n%s", strings.Join(got, "|"), want)
	}
	if !e.entitled("u1") || !e.entitled("u2") {
		t.Error("backfilled users are not entitled")
	}
	for id, wantRepaired := range map[string]bool{s4: false, s5: false, s1: true} {
		if r, ok := e.driftOf(sum.RunID, id)[FieldCustomerLink]; !ok || r != wantRepaired {
			t.Errorf("customer_link drift of %s: recorded=%v repaired=%v, want repaired=%v", id, ok, r, wantRepaired)
		}
	}
	// The unlinkable ones stay reported; nothing else differs any more.
	wantSummary(t, e.run(false), 6, 2, 0, 0, 0, ExitDrift)
}

// A run of test mode neither reads nor changes the live-mode state, even where a test customer
// names a user linked in live mode: that user's test-mode link is made in the test world.
func TestCustomersOfTheOtherModeAreNotTouched(t *testing.T) {
	e := newEnv(t)
	start, end := period()
	e.linkUserMode("u9", "cus_live9", true)
	liveSub, _ := json.Marshal(map[string]any{"id": "sub_live1", "object": "subscription", "customer": "cus_live9", "status": "active",
		"livemode": true, "current_period_start": start.Unix(), "current_period_end": end.Unix(),
		"items": map[string]any{"data": []any{map[string]any{"price": map[string]any{"id": "price_live"}}}}})
	h, _ := e.reg.Lookup(billing.EventSubscriptionCreated)
	if err := e.db.Transaction(func(tx *gorm.DB) error {
		return h.HandleEvent(context.Background(), tx, webhooks.Event{ID: newEventID(), Type: billing.EventSubscriptionCreated,
			Livemode: true, Created: ago(time.Hour), Object: liveSub})
	}); err != nil {
		t.Fatal(err)
	}

	cT := e.acct.AddCustomer(stripeemu.CustomerSpec{Metadata: map[string]string{"user_id": "u9"}})
	sT := e.acct.PutSubscription(stripeemu.SubscriptionSpec{Customer: cT, Status: "active", PriceID: "price_a", CurrentPeriodStart: start, CurrentPeriodEnd: end})

	sum := e.run(false)
	wantSummary(t, sum, 1, 1, 1, 0, 0, ExitClean)
	if l := e.localIn("sub_live1", true); l == nil || !l.Livemode || l.Status != billing.StatusActive {
		t.Fatalf("live subscription changed: %+v", l)
	}
	if l := e.local(sT); l == nil || l.Livemode {
		t.Fatalf("test subscription not imported in test mode: %+v", l)
	}
	if n := e.count(`SELECT count(*) FROM customers WHERE user_id = 'u9' AND stripe_customer_id = 'cus_live9' AND livemode`); n != 1 {
		t.Fatal("the live link of u9 changed")
	}
	if n := e.count(`SELECT count(*) FROM customers WHERE user_id = 'u9' AND NOT livemode AND stripe_customer_id = '` + cT + `'`); n != 1 {
		t.Fatalf("u9 has %d test-mode links to %s, want 1", n, cT)
	}
	drift := e.driftOf(sum.RunID, sT)
	if r, ok := drift[FieldCustomerLink]; !ok || !r {
		t.Errorf("drift of %s = %v, want a repaired customer_link", sT, drift)
	}
	if len(e.driftOf(sum.RunID, "sub_live1")) != 0 {
		t.Error("the live subscription was reported")
	}
}

func waitFor(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// A run reads and writes a page at a time: comparing costs a few statements per page, whatever
// the number of subscriptions on it (each used to read its row, and its customer's link, alone).
func TestComparingCostsStatementsPerPageNotPerSubscription(t *testing.T) {
	db, st := testenv.CountedDB(t)
	e := newEnvOn(t, db)
	start, end := period()
	const objects = 250 // three pages
	var customer string
	for i := range objects {
		if i%10 == 0 {
			customer = e.acct.AddCustomer(stripeemu.CustomerSpec{Metadata: map[string]string{"user_id": fmt.Sprintf("u%d", i)}})
		}
		e.acct.PutSubscription(stripeemu.SubscriptionSpec{Customer: customer, Status: "active", PriceID: "price_a",
			CurrentPeriodStart: start, CurrentPeriodEnd: end, LatestInvoice: &stripeemu.InvoiceSpec{Status: "paid", AttemptCount: 1}})
	}
	// Per page: the local rows, the links, the listed ids, and the drift rows with the counts in
	// one transaction. Per run: the lock, the run's record, the temporary table, the ids missing
	// at Stripe, the outcome. Per customer: the local read of its features, which reconcile
	// compares one customer at a time (not yet a page at a time).
	const pages, perPage, perRun, customers, perCustomer = 3, 8, 12, objects / 10, 1
	limit := int64(pages*perPage + perRun + customers*perCustomer)
	for _, c := range []struct {
		what    string
		dry     bool
		drifted int
	}{
		{"a dry run on the empty database", true, objects},
		{"a run after the backfill", false, 0},
	} {
		if !c.dry {
			if sum := e.run(false); sum.Repaired != objects {
				t.Fatalf("backfill: %s, want %d repaired", sum.Line(), objects)
			}
			if n := e.count(`SELECT count(*) FROM customers WHERE livemode = false`); n != objects/10 {
				t.Fatalf("backfill: %d customers linked, want %d", n, objects/10)
			}
		}
		before := st.Count()
		sum := e.run(c.dry)
		n := st.Count() - before
		if sum.Objects != objects || sum.Drifted != c.drifted || sum.Err != nil {
			t.Fatalf("%s: %s (%v), want %d objects and %d drifted", c.what, sum.Line(), sum.Err, objects, c.drifted)
		}
		if n > limit {
			t.Errorf("%s: %d statements for %d subscriptions on %d pages, want at most %d", c.what, n, objects, pages, limit)
		}
		t.Logf("%s: %d statements for %d subscriptions", c.what, n, objects)
	}
}
