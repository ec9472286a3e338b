package entitlements

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"billing/billing"
	"billing/webhooks"
)

// logged handles events in order, as the worker does, and logs each in webhook_events as
// processed (processed_at in handling order), so that the timeline has the log it reads.
func (e *env) logged(t *testing.T, evs ...webhooks.Event) {
	t.Helper()
	for _, ev := range evs {
		e.mustHandle(t, ev)
		if err := e.db.Exec(`
			INSERT INTO webhook_events (event_id, source, type, livemode, status, payload, attempts, event_created, processed_at)
			VALUES ($1, 'stripe', $2, $3, 'processed', jsonb_build_object('id', $1::text, 'data', jsonb_build_object('object', $4::jsonb)), 1, $5, clock_timestamp())`,
			ev.ID, ev.Type, ev.Livemode, string(ev.Object), ev.Created).Error; err != nil {
			t.Fatalf("log %s: %v", ev.ID, err)
		}
	}
}

func (e *env) timeline(t *testing.T, id string) (*SubscriptionState, map[string]billing.TimelineEntry, []webhooks.LoggedEvent) {
	t.Helper()
	st, err := e.svc.SubscriptionState(context.Background(), id)
	if err != nil || st == nil {
		t.Fatalf("state of %s: %v %v", id, st, err)
	}
	inbox := webhooks.New(webhooks.Config{DB: e.db, Logger: slog.New(slog.DiscardHandler)})
	evs, err := inbox.EventsNaming(context.Background(), id, 100)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]billing.TimelineEntry{}
	for _, en := range billing.ExplainTimeline(&st.SubscriptionState, evs) {
		out[en.Event.EventID] = en
	}
	return st, out, evs
}

func TestTimelineSaysWhichEventSetTheStateAndWhichWereSkipped(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.link(t, "u1", "cus_1", "u1@example.com")
	inv := invObj{ID: "in_1", Customer: "cus_1", Subscription: "sub_1", Currency: "usd", AmountDue: 2500, AttemptCount: 1,
		URL: "https://invoice.stripe.com/i/in_1"}
	e.logged(t,
		created("c1", 1, s1),
		updated("u2", 20, s1.With(billing.StatusPastDue)),
		// Delivered late: older than past_due, so the guard skips it.
		updated("u1", 10, s1.With(billing.StatusActive)),
		failed("f1", 15, inv),
		failed("f0", 5, inv), // older than f1
	)
	// One event still waiting, one dead-lettered: neither is applied.
	if err := e.db.Exec(`INSERT INTO webhook_events (event_id, source, type, livemode, status, payload, event_created) VALUES
		('w1', 'stripe', $1, false, 'received', jsonb_build_object('data', jsonb_build_object('object', $2::jsonb)), $3),
		('d1', 'stripe', $1, false, 'failed', jsonb_build_object('data', jsonb_build_object('object', $2::jsonb)), $3)`,
		billing.EventSubscriptionUpdated, string(s1.With(billing.StatusCanceled).JSON()), at(30)).Error; err != nil {
		t.Fatal(err)
	}

	st, tl, evs := e.timeline(t, "sub_1")
	if ptrStr(st.UserID) != "u1" || st.Status != billing.StatusPastDue || ptrStr(st.SubEventID) != "u2" || ptrStr(st.InvEventID) != "f1" ||
		st.HoldReason != billing.HoldPaymentFailed || !st.Entitled || !strings.HasPrefix(st.Reason, "Entitled: the last payment failed") {
		t.Fatalf("state %+v", st)
	}
	want := map[string]string{
		"c1": billing.OutcomeSuperseded, "u2": billing.OutcomeCurrent, "u1": billing.OutcomeSkippedOlder,
		"f1": billing.OutcomeCurrent, "f0": billing.OutcomeSkippedOlder, "w1": billing.OutcomeWaiting, "d1": billing.OutcomeFailed,
	}
	for id, outcome := range want {
		if got := tl[id]; got.Outcome != outcome || got.Words == "" {
			t.Errorf("%s: %s %q, want %s", id, got.Outcome, got.Words, outcome)
		}
	}
	if tl["u1"].Group != "subscription" || tl["f0"].Group != "payment" || tl["u2"].Status != billing.StatusPastDue {
		t.Errorf("groups/status: %+v %+v", tl["u1"], tl["f0"])
	}
	if !strings.Contains(tl["u1"].Words, "ordering guard") || !strings.Contains(tl["u2"].Words, "current subscription state") {
		t.Errorf("words: %q / %q", tl["u1"].Words, tl["u2"].Words)
	}
	if src := billing.StateSource(st.SubEventID, evs); src != "" {
		t.Errorf("state source %q, want the log's own event", src)
	}

	// Once canceled, a newer non-terminal snapshot is skipped as such.
	e.logged(t, deleted("x1", 40, s1.With(billing.StatusCanceled)), updated("late", 50, s1.With(billing.StatusActive)))
	st, tl, _ = e.timeline(t, "sub_1")
	if tl["x1"].Outcome != billing.OutcomeCurrent || tl["late"].Outcome != billing.OutcomeSkippedTerminal || tl["u2"].Outcome != billing.OutcomeSuperseded {
		t.Errorf("after cancel: x1 %s, late %s, u2 %s", tl["x1"].Outcome, tl["late"].Outcome, tl["u2"].Outcome)
	}
	if st.Entitled || !strings.Contains(st.Reason, "canceled is final") {
		t.Errorf("canceled: entitled %v, %q", st.Entitled, st.Reason)
	}

	// A state set by a read from Stripe is named as such.
	other := "reconcile:run1"
	if src := billing.StateSource(&other, evs); src != other {
		t.Errorf("state source %q", src)
	}
}

func TestEntitlementReasonFollowsThePolicy(t *testing.T) {
	t.Parallel()
	now := at(100 * 86400)
	ts := func(d int64) *time.Time { v := at(d * 86400); return &v }
	created := at(1)
	for _, tc := range []struct {
		name   string
		policy Policy
		sub    billing.Subscription
		want   string
	}{
		{"active", Policy{}, billing.Subscription{Status: billing.StatusActive, CurrentPeriodEnd: ts(120), SubEventCreated: &created}, "Entitled: the subscription is active."},
		{"trialing", Policy{}, billing.Subscription{Status: billing.StatusTrialing, TrialEnd: ts(110), SubEventCreated: &created}, "Entitled: the subscription is trialing"},
		{"cancel at period end, still running", Policy{}, billing.Subscription{Status: billing.StatusActive, CancelAtPeriodEnd: true, CurrentPeriodEnd: ts(120)},
			"Entitled: the subscription is active; it is set to cancel at the end of the period"},
		{"cancel at period end, over", Policy{}, billing.Subscription{Status: billing.StatusActive, CancelAtPeriodEnd: true, CurrentPeriodEnd: ts(90)},
			"Not entitled: it was set to cancel at the end of its period"},
		{"past_due kept", Policy{PastDueEntitled: true}, billing.Subscription{Status: billing.StatusPastDue}, "Entitled: the last payment failed"},
		{"past_due refused", Policy{}, billing.Subscription{Status: billing.StatusPastDue}, "Not entitled: the last payment failed and Stripe is retrying it (past_due), and policy.past_due_entitled is off."},
		{"unpaid", Policy{PastDueEntitled: true}, billing.Subscription{Status: billing.StatusUnpaid}, "Not entitled: Stripe stopped retrying"},
		{"placeholder", Policy{}, billing.Subscription{Status: billing.StatusIncomplete}, "Not entitled: no subscription event has arrived yet"},
		{"incomplete", Policy{}, billing.Subscription{Status: billing.StatusIncomplete, SubEventCreated: &created}, "Not entitled: the first payment has not succeeded yet"},
		{"expired", Policy{}, billing.Subscription{Status: billing.StatusIncompleteExpired}, "Not entitled: the first payment never succeeded"},
		{"paused", Policy{}, billing.Subscription{Status: billing.StatusPaused}, "Not entitled: the subscription is paused"},
		{"unknown", Policy{}, billing.Subscription{Status: "frozen"}, `Not entitled: the status "frozen" is unknown`},
	} {
		got := tc.policy.EntitlementReason(&tc.sub, now)
		if !strings.HasPrefix(got, tc.want) {
			t.Errorf("%s: %q, want it to start with %q", tc.name, got, tc.want)
		}
		// The words never contradict the policy.
		if strings.HasPrefix(got, "Entitled") != tc.policy.Entitled(&tc.sub, now) {
			t.Errorf("%s: %q disagrees with Entitled", tc.name, got)
		}
	}
}

func TestFindSubscriptionsNoticesAndInvoices(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.link(t, "u1", "cus_1", "u1@example.com")
	inv := invObj{ID: "in_1", Customer: "cus_1", Subscription: "sub_1", Currency: "usd", AmountDue: 2500, AttemptCount: 1}
	e.mustHandle(t, created("c1", 1, s1), created("c2", 2, subObj{ID: "sub_2", Customer: "cus_2", Status: billing.StatusActive}),
		failed("f1", 10, inv))
	ctx := context.Background()
	for q, want := range map[string]string{"sub_1": "sub_1", "cus_1": "sub_1", "u1": "sub_1", "cus_2": "sub_2", "nobody": ""} {
		refs, err := e.subs.FindSubscriptions(ctx, q, 10)
		if err != nil {
			t.Fatal(err)
		}
		got := ""
		if len(refs) == 1 {
			got = refs[0].SubscriptionID
		}
		if got != want || len(refs) > 1 {
			t.Errorf("find %s: %+v, want %s", q, refs, want)
		}
	}
	if refs, _ := e.subs.FindSubscriptions(ctx, "u1", 10); len(refs) != 1 || ptrStr(refs[0].UserID) != "u1" {
		t.Errorf("user of the found subscription: %+v", refs)
	}
	notices, err := e.subs.SubscriptionNotices(ctx, "sub_1", false, 10)
	if err != nil || len(notices) != 1 || notices[0].EventID != "f1" || notices[0].Kind == "" || notices[0].Recipient != "u1@example.com" {
		t.Errorf("notices %+v %v", notices, err)
	}
	if n, err := e.subs.SubscriptionNotices(ctx, "sub_1", true, 10); err != nil || len(n) != 0 {
		t.Errorf("live notices of a test subscription: %+v %v", n, err)
	}
	// Invoices stored from the events (when the handlers store them) and one stored before.
	if err := e.db.Exec(`INSERT INTO invoices (invoice_id, livemode, stripe_customer_id, subscription_id, status, amount_due, currency, created)
		VALUES ('in_0', false, 'cus_1', 'sub_1', 'paid', 2500, 'usd', $1)`, at(-86400)).Error; err != nil {
		t.Fatal(err)
	}
	invs, err := e.subs.SubscriptionInvoices(ctx, "sub_1", false, 10)
	if err != nil || len(invs) == 0 || invs[len(invs)-1].InvoiceID != "in_0" || ptrStr(invs[len(invs)-1].Status) != "paid" {
		t.Errorf("invoices %+v %v", invs, err)
	}
	if invs, _ := e.subs.SubscriptionInvoices(ctx, "sub_2", false, 10); len(invs) != 0 {
		t.Errorf("invoices of sub_2: %+v", invs)
	}
}
