package entitlements

import (
	"fmt"
	"testing"

	"billing/billing"
	"billing/notices"
	"billing/webhooks"
)

// A payment lifts a hold only when it is for the held invoice or a newer one: a late payment of
// an older invoice (its event newer than the failure's) leaves the newer invoice's hold alone.
func TestLatePaymentOfAnOlderInvoiceKeepsTheHold(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.link(t, "u1", "cus_1", "u1@example.com")
	older := invObj{ID: "in_old", Customer: "cus_1", Subscription: "sub_1", Currency: "usd", AmountDue: 1000, AttemptCount: 1, Created: 100}
	newer := invObj{ID: "in_new", Customer: "cus_1", Subscription: "sub_1", Currency: "usd", AmountDue: 2000, AttemptCount: 1, Created: 200}
	e.mustHandle(t, created("c1", 1, s1), failed("f_new", 250, newer), succeeded("p_old", 300, older))

	if h, ok := e.holds(t)["sub_1"]; !ok || h.HoldReason != billing.HoldPaymentFailed || ptrInt(h.AmountDue) != "2000" {
		t.Fatalf("the older invoice's payment lifted the newer one's hold: %+v (listed %v)", h, ok)
	}
	if cv := e.customerView(t, "u1"); !cv.Entitlement.OnHold {
		t.Errorf("entitlement: %+v", cv.Entitlement)
	}
	// The held invoice's own payment lifts it, even when it is older than the stale one.
	e.mustHandle(t, succeeded("p_new", 299, newer))
	if h, ok := e.holds(t)["sub_1"]; ok {
		t.Errorf("hold still listed after its invoice was paid: %+v", h)
	}
	// And a newer invoice's payment lifts an older one's hold.
	e.mustHandle(t, failed("f_old2", 400, older), succeeded("p_newer", 500, invObj{ID: "in_3", Customer: "cus_1", Subscription: "sub_1", Created: 450}))
	if h, ok := e.holds(t)["sub_1"]; ok {
		t.Errorf("a newer invoice's payment did not lift the hold: %+v", h)
	}
}

// An older invoice failing while a newer one's hold is in force keeps the newer one as the
// invoice to pay: paying only the older one does not lift the hold.
func TestOlderInvoiceFailingDuringAHoldKeepsTheNewerInvoice(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	older := invObj{ID: "in_old", Customer: "cus_1", Subscription: "sub_1", AttemptCount: 2, Created: 100}
	newer := invObj{ID: "in_new", Customer: "cus_1", Subscription: "sub_1", AttemptCount: 1, Created: 200}
	e.mustHandle(t, created("c1", 1, s1), failed("f_new", 250, newer), failed("f_old", 260, older), succeeded("p_old", 270, older))
	if _, ok := e.holds(t)["sub_1"]; !ok {
		t.Fatal("paying the older invoice lifted the hold of the newer one")
	}
}

// trial_will_end about a trial that has already ended sends nothing, whether the event itself
// came after the end or was delivered after it.
func TestTrialWillEndAfterTheTrialEndedSendsNothing(t *testing.T) {
	t.Parallel()
	// trialSub's trial ends at +3 days.
	tests := []struct {
		name           string
		eventAt, nowAt int64
		want           int
	}{
		{"before the end", 86400, 86400, 1},
		{"event after the end", 3*86400 + 60, 3*86400 + 60, 0},
		{"event before the end, delivered after it", 86400, 4 * 86400, 0},
		{"event at the end", 3 * 86400, 3 * 86400, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.link(t, "u_t", "cus_t", "trial.user@example.com")
			e.mustHandle(t, created("c1", 1, trialSub))
			e.clock.Set(at(tc.nowAt))
			e.mustHandle(t, trialEv("evt_trial", tc.eventAt, trialSub))
			if rows, due := e.noticeCount(t, "evt_trial", notices.KindTrialWillEnd); rows != tc.want || due != tc.want {
				t.Errorf("notices %d, queued %d; want %d", rows, due, tc.want)
			}
		})
	}
}

// on_hold and hold_reason of the entitlement are those of the subscription it reports.
func TestEntitlementHoldIsTheReportedSubscriptions(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.link(t, "u1", "cus_1", "")
	e.mustHandle(t,
		created("a1", 1, subObj{ID: "sub_a", Customer: "cus_1", Status: billing.StatusActive, Price: "price_a", PeriodEnd: 30 * 86400}),
		created("b1", 2, subObj{ID: "sub_b", Customer: "cus_1", Status: billing.StatusUnpaid, Price: "price_b", PeriodEnd: 30 * 86400}))
	ent := e.customerView(t, "u1").Entitlement
	if ptrStr(ent.SubscriptionID) != "sub_a" || !ent.Entitled || ent.OnHold || ent.HoldReason != nil {
		t.Errorf("entitlement mixes sub_a with sub_b's hold: %+v (reason %s)", ent, ptrStr(ent.HoldReason))
	}
	// The reported one's own hold shows.
	e.mustHandle(t, failed("fa", 10, invObj{ID: "in_a", Customer: "cus_1", Subscription: "sub_a", AttemptCount: 1}))
	ent = e.customerView(t, "u1").Entitlement
	if ptrStr(ent.SubscriptionID) != "sub_a" || !ent.OnHold || ptrStr(ent.HoldReason) != billing.HoldPaymentFailed {
		t.Errorf("entitlement: %+v (reason %s)", ent, ptrStr(ent.HoldReason))
	}
}

// status_since is the start of the current stint of the status, whatever the delivery order.
func TestStatusSinceWithEventsOutOfOrder(t *testing.T) {
	t.Parallel()
	pastDue := s1.With(billing.StatusPastDue)
	tests := []struct {
		name string
		evs  []eventSpec
		want int64
	}{
		{"older event of the same status moves it earlier",
			[]eventSpec{{"u20", 20, pastDue, ""}, {"u10", 10, pastDue, ""}}, 10},
		{"newer event of the same status does not move it later",
			[]eventSpec{{"u10", 10, pastDue, ""}, {"u20", 20, pastDue, ""}}, 10},
		{"an older event of an earlier stint does not",
			[]eventSpec{{"p20", 20, pastDue, ""}, {"a30", 30, s1, ""}, {"p40", 40, pastDue, ""}, {"p10", 10, pastDue, ""}}, 40},
		{"nor when the other status arrives late too",
			[]eventSpec{{"p40", 40, pastDue, ""}, {"a30", 30, s1, ""}, {"p10", 10, pastDue, ""}}, 40},
		{"an older event still of this stint does",
			[]eventSpec{{"a30", 30, s1, ""}, {"p50", 50, pastDue, ""}, {"p40", 40, pastDue, ""}, {"p35", 35, pastDue, ""}}, 35},
		{"the change named by previous_attributes bounds it",
			[]eventSpec{{"p40", 40, pastDue, "active"}, {"p30", 30, pastDue, ""}}, 40},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			for _, sp := range tc.evs {
				e.mustHandle(t, sp.event())
			}
			if got := e.sub(t, "sub_1"); ptrTime(got.StatusSince) != ptrTime(ptr(at(tc.want))) || got.Status != billing.StatusPastDue {
				t.Errorf("status %s since %s, want past_due since %s", got.Status, ptrTime(got.StatusSince), ptrTime(ptr(at(tc.want))))
			}
		})
	}
}

// eventSpec is a customer.subscription.updated event; prevStatus, when set, is its
// previous_attributes.status.
type eventSpec struct {
	id         string
	at         int64
	sub        subObj
	prevStatus string
}

func (sp eventSpec) event() webhooks.Event {
	ev := updated(sp.id, sp.at, sp.sub)
	if sp.prevStatus != "" {
		ev.PreviousAttributes = []byte(`{"status":"` + sp.prevStatus + `"}`)
	}
	return ev
}

// A subscription that never started (Checkout abandoned: its first invoice failed, status
// incomplete or incomplete_expired) is no hold and gets no "payment failed" mail; a renewal
// that fails is both.
func TestFailedFirstInvoiceOfASubscriptionThatNeverStarted(t *testing.T) {
	t.Parallel()
	for _, status := range []string{billing.StatusIncomplete, billing.StatusIncompleteExpired} {
		t.Run(status, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.link(t, "u1", "cus_1", "u1@example.com")
			first := invObj{ID: "in_first", Customer: "cus_1", Subscription: "sub_1", AttemptCount: 1, AmountDue: 900,
				Currency: "usd", BillingReason: "subscription_create", Created: 1}
			// The failure may come before the subscription's own event (a placeholder row) or after.
			e.mustHandle(t, failed("f1", 2, first), created("c1", 1, s1.With(billing.StatusIncomplete)), failed("f2", 3, first))
			if status == billing.StatusIncompleteExpired {
				e.mustHandle(t, updated("x1", 86400, s1.With(billing.StatusIncompleteExpired)))
			}
			if rows, due := e.totalNotices(t); rows != 0 || due != 0 {
				t.Errorf("notices %d, queued %d; want none", rows, due)
			}
			if h, ok := e.holds(t)["sub_1"]; ok {
				t.Errorf("listed as a hold: %+v", h)
			}
			if ent := e.customerView(t, "u1").Entitlement; ent.OnHold || ent.Entitled {
				t.Errorf("entitlement: %+v", ent)
			}
		})
	}
	t.Run("a failed renewal is a hold", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		e.link(t, "u1", "cus_1", "u1@example.com")
		e.mustHandle(t, created("c1", 1, s1), failed("f1", 2, invObj{ID: "in_2", Customer: "cus_1", Subscription: "sub_1",
			AttemptCount: 1, BillingReason: "subscription_cycle", Created: 2}))
		if rows, _ := e.totalNotices(t); rows != 1 {
			t.Errorf("%d notices, want 1", rows)
		}
		if _, ok := e.holds(t)["sub_1"]; !ok {
			t.Error("not listed as a hold")
		}
	})
}

// The hold follows the newest invoice whatever the delivery order: every order of the same
// invoice events ends in the same hold. The failing order before the fix: the older invoice's
// late payment applied first made the newer invoice's (earlier) failure look stale, and the hold
// was lost.
func TestHoldIsTheSameInEveryDeliveryOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	scenarios := []struct {
		name     string
		events   func(sub, cus string) []webhooks.Event
		wantHold bool
	}{
		{"the newer invoice fails, the older one is paid late", func(sub, cus string) []webhooks.Event {
			older := invObj{ID: "in_o_" + sub, Customer: cus, Subscription: sub, AttemptCount: 2, AmountDue: 1000, Created: 100}
			newer := invObj{ID: "in_n_" + sub, Customer: cus, Subscription: sub, AttemptCount: 1, AmountDue: 2000, Created: 200}
			return []webhooks.Event{failed("f_o_"+sub, 150, older), failed("f_n_"+sub, 250, newer), succeeded("p_o_"+sub, 300, older)}
		}, true},
		{"then the newer invoice is paid as well", func(sub, cus string) []webhooks.Event {
			older := invObj{ID: "in_o_" + sub, Customer: cus, Subscription: sub, AttemptCount: 2, Created: 100}
			newer := invObj{ID: "in_n_" + sub, Customer: cus, Subscription: sub, AttemptCount: 1, Created: 200}
			return []webhooks.Event{failed("f_o_"+sub, 150, older), failed("f_n_"+sub, 250, newer), succeeded("p_o_"+sub, 300, older),
				succeeded("p_n_"+sub, 350, newer)}
		}, false},
	}
	n := 0
	for _, sc := range scenarios {
		evs := sc.events("x", "y")
		for _, perm := range permutations(len(evs)) {
			n++
			sub, cus := fmt.Sprintf("sub_perm_%d", n), fmt.Sprintf("cus_perm_%d", n)
			s := s1
			s.ID, s.Customer = sub, cus
			e.mustHandle(t, created("c_"+sub, 1, s))
			evs := sc.events(sub, cus)
			ordered := make([]webhooks.Event, len(evs))
			for i, k := range perm {
				ordered[i] = evs[k]
			}
			e.mustHandle(t, ordered...)
			h, held := e.holds(t)[sub]
			if held != sc.wantHold {
				t.Errorf("%s, delivered in order %v: hold %t (%+v), want %t", sc.name, perm, held, h, sc.wantHold)
			} else if held && ptrInt(h.AmountDue) != "2000" {
				t.Errorf("%s, delivered in order %v: the hold is about %s due, want the newer invoice's 2000", sc.name, perm, ptrInt(h.AmountDue))
			}
		}
	}
}

// permutations lists every order of 0..n-1.
func permutations(n int) [][]int {
	if n == 0 {
		return [][]int{{}}
	}
	var out [][]int
	for _, p := range permutations(n - 1) {
		for i := 0; i <= len(p); i++ {
			q := append(append(append([]int{}, p[:i]...), n-1), p[i:]...)
			out = append(out, q)
		}
	}
	return out
}
