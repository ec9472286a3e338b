package billing

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	"billing/billing/billingtest"
	"billing/webhooks"
)

var s1 = subObj{ID: "sub_1", Customer: "cus_1", Status: StatusActive, Price: "price_pro", PeriodStart: 0, PeriodEnd: 30 * 86400}

// The state machine over billingtest's cases: each one's status and hold (the access each grants
// is entitlements' TestPolicyOverTheTransitions).
func TestSubscriptionTransitions(t *testing.T) {
	t.Parallel()
	for _, tc := range billingtest.Transitions() {
		t.Run(tc.Name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.mustHandle(t, tc.Events...)
			got := e.sub(t, "sub_1")
			if got.Status != tc.Status {
				t.Errorf("status = %q, want %q", got.Status, tc.Status)
			}
			reason, _, onHold := got.Hold()
			if reason != tc.Hold || onHold != (tc.Hold != "") {
				t.Errorf("hold = %q (%v), want %q", reason, onHold, tc.Hold)
			}
		})
	}
}

func TestSnapshotFields(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	s := subObj{ID: "sub_f", Customer: "cus_f", Status: StatusTrialing, Price: "price_basic",
		PeriodStart: 10, PeriodEnd: 1000, TrialStart: 10, TrialEnd: 1000, CancelAtPeriodEnd: true}
	e.mustHandle(t, created("e1", 10, s))
	got := e.sub(t, "sub_f")
	checks := []struct{ name, got, want string }{
		{"customer", got.StripeCustomerID, "cus_f"},
		{"price", ptrStr(got.PriceID), "price_basic"},
		{"period start", ptrTime(got.CurrentPeriodStart), at(10).Format(time.RFC3339)},
		{"period end", ptrTime(got.CurrentPeriodEnd), at(1000).Format(time.RFC3339)},
		{"trial start", ptrTime(got.TrialStart), at(10).Format(time.RFC3339)},
		{"trial end", ptrTime(got.TrialEnd), at(1000).Format(time.RFC3339)},
		{"cancel_at_period_end", fmt.Sprint(got.CancelAtPeriodEnd), "true"},
		{"canceled_at", ptrTime(got.CanceledAt), "<nil>"},
		{"status since", ptrTime(got.StatusSince), at(10).Format(time.RFC3339)},
		{"sub event", ptrStr(got.SubEventID), "e1"},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %s, want %s", c.name, c.got, c.want)
		}
	}

	// A later update with the same status keeps status_since; a cancellation sets canceled_at.
	s.Status = StatusActive
	e.mustHandle(t, updated("e2", 20, s))
	s.CanceledAt, s.EndedAt = 30, 30
	e.mustHandle(t, updated("e3", 25, s), deleted("e4", 30, s.With(StatusCanceled)))
	got = e.sub(t, "sub_f")
	if ptrTime(got.StatusSince) != at(30).Format(time.RFC3339) || ptrTime(got.CanceledAt) != at(30).Format(time.RFC3339) {
		t.Errorf("after cancel: status_since %s canceled_at %s, want both %s", ptrTime(got.StatusSince), ptrTime(got.CanceledAt), at(30).Format(time.RFC3339))
	}
	e.mustHandle(t, updated("e5", 40, s.With(StatusCanceled)))
	if got := e.sub(t, "sub_f"); ptrTime(got.StatusSince) != at(30).Format(time.RFC3339) {
		t.Errorf("status_since moved on a same-status update: %s", ptrTime(got.StatusSince))
	}
}

func TestOutOfOrder(t *testing.T) {
	t.Parallel()
	inv := invObj{ID: "in_1", Customer: "cus_1", Subscription: "sub_1", Currency: "usd", AmountDue: 2000, AttemptCount: 1}
	tests := []struct {
		name       string
		events     []webhooks.Event
		wantStatus string
		wantEvent  string // sub_event_id expected to be the last applied
		wantHold   string
	}{
		{"older updated after newer is ignored",
			[]webhooks.Event{updated("e2", 20, s1.With(StatusPastDue)), updated("e1", 10, s1)}, StatusPastDue, "e2", HoldPastDue},
		{"older created after newer updated is ignored",
			[]webhooks.Event{updated("e2", 20, s1), created("e1", 10, s1.With(StatusIncomplete))}, StatusActive, "e2", ""},
		{"older updated after deleted stays canceled",
			[]webhooks.Event{deleted("e3", 30, s1.With(StatusCanceled)), updated("e2", 20, s1)}, StatusCanceled, "e3", ""},
		{"newer non-terminal snapshot never revives a canceled one",
			[]webhooks.Event{deleted("e3", 30, s1.With(StatusCanceled)), updated("e4", 40, s1)}, StatusCanceled, "e3", ""},
		{"newer snapshot never revives incomplete_expired",
			[]webhooks.Event{updated("e3", 30, s1.With(StatusIncompleteExpired)), updated("e4", 40, s1.With(StatusIncomplete))}, StatusIncompleteExpired, "e3", ""},
		{"a newer terminal snapshot applies over a terminal one",
			[]webhooks.Event{updated("e3", 30, s1.With(StatusCanceled)), deleted("e4", 40, s1.With(StatusCanceled))}, StatusCanceled, "e4", ""},
		{"older payment_failed after newer payment_succeeded keeps no hold",
			[]webhooks.Event{created("e1", 1, s1), succeeded("p1", 20, inv), failed("f1", 10, inv)}, StatusActive, "e1", ""},
		{"older payment_succeeded after newer payment_failed keeps the hold",
			[]webhooks.Event{created("e1", 1, s1), failed("f2", 20, inv), succeeded("p1", 10, inv)}, StatusActive, "e1", HoldPaymentFailed},
		{"tie: incomplete created and active updated in one second, active wins (in order)",
			[]webhooks.Event{created("evt_b", 5, s1.With(StatusIncomplete)), updated("evt_a", 5, s1)}, StatusActive, "evt_a", ""},
		{"tie: incomplete created and active updated in one second, active wins (reversed)",
			[]webhooks.Event{updated("evt_a", 5, s1), created("evt_b", 5, s1.With(StatusIncomplete))}, StatusActive, "evt_a", ""},
		{"tie: active then past_due in one second, past_due wins (reversed)",
			[]webhooks.Event{updated("evt_z", 5, s1.With(StatusPastDue)), updated("evt_a", 5, s1)}, StatusPastDue, "evt_z", HoldPastDue},
		{"tie: updated and deleted in one second, deleted wins",
			[]webhooks.Event{deleted("evt_a", 5, s1.With(StatusCanceled)), updated("evt_z", 5, s1.With(StatusCanceled))}, StatusCanceled, "evt_a", ""},
		{"tie: same status and type, the greater event id wins (in order)",
			[]webhooks.Event{updated("evt_A", 5, s1), updated("evt_B", 5, s1.With(StatusActive))}, StatusActive, "evt_B", ""},
		{"tie: same status and type, the greater event id wins (reversed)",
			[]webhooks.Event{updated("evt_B", 5, s1), updated("evt_A", 5, s1)}, StatusActive, "evt_B", ""},
		{"tie: payment_failed and payment_succeeded in one second, success wins (failed last)",
			[]webhooks.Event{created("e1", 1, s1), succeeded("p1", 5, inv), failed("f1", 5, inv)}, StatusActive, "e1", ""},
		{"tie: payment_failed and payment_succeeded in one second, success wins (succeeded last)",
			[]webhooks.Event{created("e1", 1, s1), failed("f1", 5, inv), succeeded("p1", 5, inv)}, StatusActive, "e1", ""},
		{"replaying an applied event changes nothing",
			[]webhooks.Event{updated("e1", 10, s1), updated("e2", 20, s1.With(StatusPastDue)), updated("e1", 10, s1)}, StatusPastDue, "e2", HoldPastDue},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.mustHandle(t, tc.events...)
			got := e.sub(t, "sub_1")
			if got.Status != tc.wantStatus || ptrStr(got.SubEventID) != tc.wantEvent {
				t.Errorf("status %q from %s, want %q from %s", got.Status, ptrStr(got.SubEventID), tc.wantStatus, tc.wantEvent)
			}
			if reason, _, _ := got.Hold(); reason != tc.wantHold {
				t.Errorf("hold = %q, want %q", reason, tc.wantHold)
			}
		})
	}
}

// The same-second tie between two events of equal rank is decided by event id byte order, not by
// the database's collation ("evt_B" < "evt_a" in bytes, the other way round in most locales).
func TestTieUsesByteOrder(t *testing.T) {
	t.Parallel()
	for _, order := range [][]string{{"evt_B", "evt_a"}, {"evt_a", "evt_B"}} {
		e := newEnv(t)
		// Give the column a linguistic collation (as a database created with a locale would), so
		// that only an explicit byte-order comparison passes.
		var icu int64
		e.db.Raw(`SELECT count(*) FROM pg_collation WHERE collname = 'und-x-icu'`).Scan(&icu)
		if icu == 1 {
			if err := e.db.Exec(`ALTER TABLE subscriptions ALTER COLUMN sub_event_id TYPE text COLLATE "und-x-icu"`).Error; err != nil {
				t.Fatal(err)
			}
		} else {
			t.Log("no ICU collation: the database's own collation decides what this test proves")
		}
		s := s1
		for _, id := range order {
			s.Price = "price_" + id
			e.mustHandle(t, updated(id, 5, s))
		}
		if got := e.sub(t, "sub_1"); ptrStr(got.SubEventID) != "evt_a" || ptrStr(got.PriceID) != "price_evt_a" {
			t.Errorf("order %v: applied %s (price %s), want evt_a", order, ptrStr(got.SubEventID), ptrStr(got.PriceID))
		}
	}
}

func TestPaymentHoldLifecycle(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	inv := invObj{ID: "in_1", Customer: "cus_1", Subscription: "sub_1", Currency: "eur", AmountDue: 1500,
		AttemptCount: 1, NextAttempt: 3 * 86400, URL: "https://invoice.stripe.com/i/in_1"}
	e.mustHandle(t, created("e1", 1, s1), failed("f1", 100, inv))
	got := e.sub(t, "sub_1")
	reason, since, ok := got.Hold()
	if !ok || reason != HoldPaymentFailed || ptrTime(since) != at(100).Format(time.RFC3339) {
		t.Fatalf("after first failure: hold %q since %s (%v)", reason, ptrTime(since), ok)
	}
	if ptrInt(got.AttemptCount) != "1" || ptrInt(got.AmountDue) != "1500" || ptrStr(got.Currency) != "eur" ||
		ptrStr(got.HostedInvoiceURL) != inv.URL || ptrTime(got.NextPaymentAttempt) != at(3*86400).Format(time.RFC3339) {
		t.Errorf("invoice fields: attempts %s amount %s %s url %s next %s", ptrInt(got.AttemptCount), ptrInt(got.AmountDue),
			ptrStr(got.Currency), ptrStr(got.HostedInvoiceURL), ptrTime(got.NextPaymentAttempt))
	}
	if got.Status != StatusActive {
		t.Errorf("an invoice event changed the status to %q", got.Status)
	}

	// A retry fails again: the hold keeps its start, the details move on.
	inv.AttemptCount, inv.NextAttempt = 2, 6*86400
	e.mustHandle(t, failed("f2", 3*86400, inv))
	got = e.sub(t, "sub_1")
	if _, since, _ := got.Hold(); ptrTime(since) != at(100).Format(time.RFC3339) || ptrInt(got.AttemptCount) != "2" {
		t.Errorf("after retry: since %s attempts %s", ptrTime(since), ptrInt(got.AttemptCount))
	}

	// Paid: the hold is lifted.
	inv.NextAttempt = 0
	e.mustHandle(t, succeeded("p1", 4*86400, inv))
	got = e.sub(t, "sub_1")
	if _, _, ok := got.Hold(); ok || got.PaymentHold || got.PaymentHoldSince != nil || got.NextPaymentAttempt != nil {
		t.Errorf("after payment: hold %v payment_hold %v since %s next %s", ok, got.PaymentHold, ptrTime(got.PaymentHoldSince), ptrTime(got.NextPaymentAttempt))
	}

	// A later failure starts a new hold.
	inv.ID, inv.AttemptCount = "in_2", 1
	e.mustHandle(t, failed("f3", 30*86400, inv))
	if _, since, ok := e.sub(t, "sub_1").Hold(); !ok || ptrTime(since) != at(30*86400).Format(time.RFC3339) {
		t.Errorf("second hold since %s (%v), want %s", ptrTime(since), ok, at(30*86400).Format(time.RFC3339))
	}
}

func TestColumnGroupsAreIndependent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	inv := invObj{ID: "in_1", Customer: "cus_1", Subscription: "sub_1", Currency: "usd", AmountDue: 900, AttemptCount: 1}
	// The invoice event is newer than every subscription event, and the subscription events
	// arrive after it: neither group may undo the other.
	e.mustHandle(t, failed("f1", 50, inv), created("e1", 10, s1), updated("e2", 20, s1.With(StatusPastDue)))
	got := e.sub(t, "sub_1")
	if got.Status != StatusPastDue || ptrStr(got.SubEventID) != "e2" {
		t.Errorf("status %q from %s, want past_due from e2", got.Status, ptrStr(got.SubEventID))
	}
	if !got.PaymentHold || ptrInt(got.AmountDue) != "900" || ptrTime(got.PaymentHoldSince) != at(50).Format(time.RFC3339) {
		t.Errorf("hold columns lost: hold %v amount %s since %s", got.PaymentHold, ptrInt(got.AmountDue), ptrTime(got.PaymentHoldSince))
	}
	if reason, _, _ := got.Hold(); reason != HoldPaymentFailed {
		t.Errorf("hold reason %q", reason)
	}
}

func TestInvoiceBeforeSubscriptionMakesPlaceholder(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	inv := invObj{ID: "in_1", Customer: "cus_1", Subscription: "sub_1", Currency: "usd", AmountDue: 900, AttemptCount: 1}
	e.mustHandle(t, failed("f1", 50, inv))
	got := e.sub(t, "sub_1")
	if got.Status != StatusIncomplete || got.SubEventCreated != nil || got.StripeCustomerID != "cus_1" || !got.PaymentHold {
		t.Fatalf("placeholder: status %q sub_event_created %s customer %s hold %v", got.Status, ptrTime(got.SubEventCreated), got.StripeCustomerID, got.PaymentHold)
	}
	// Any subscription event overwrites the placeholder's snapshot, even one older than the invoice.
	e.mustHandle(t, created("e1", 10, s1.With(StatusIncomplete)))
	e.mustHandle(t, updated("e2", 11, s1))
	got = e.sub(t, "sub_1")
	if got.Status != StatusActive || ptrStr(got.PriceID) != "price_pro" || !got.PaymentHold {
		t.Errorf("after subscription events: status %q price %s hold %v", got.Status, ptrStr(got.PriceID), got.PaymentHold)
	}
}

func TestOneOffInvoiceIsAcknowledged(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.link(t, "u1", "cus_1", "u1@example.com")
	inv := invObj{ID: "in_x", Customer: "cus_1", Currency: "usd", AmountDue: 500, AttemptCount: 1, Email: "u1@example.com"}
	e.mustHandle(t, failed("f1", 5, inv), succeeded("p1", 6, inv))
	if n := e.countSubs(t); n != 0 {
		t.Errorf("one-off invoice created %d subscription rows", n)
	}
	if rows, due := e.totalNotices(t); rows != 0 || due != 0 {
		t.Errorf("one-off invoice sent notices: %d rows, %d queued", rows, due)
	}
}

func TestMalformedEventsArePermanent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.mustHandle(t, created("e0", 1, s1))
	tests := []struct {
		name string
		ev   webhooks.Event
	}{
		{"subscription object not an object", event("m1", EventSubscriptionUpdated, 2, []byte(`"sub_1"`))},
		{"subscription object null", event("m2", EventSubscriptionUpdated, 2, []byte(`null`))},
		{"subscription without id", event("m3", EventSubscriptionUpdated, 2, []byte(`{"customer":"cus_1","status":"active"}`))},
		{"subscription without customer", event("m4", EventSubscriptionCreated, 2, []byte(`{"id":"sub_2","status":"active"}`))},
		{"subscription without status", event("m5", EventSubscriptionCreated, 2, []byte(`{"id":"sub_2","customer":"cus_1"}`))},
		{"timestamp of the wrong type", event("m6", EventSubscriptionCreated, 2, []byte(`{"id":"sub_2","customer":"cus_1","status":"active","trial_end":{"x":1}}`))},
		{"subscription of another customer", updated("m7", 3, subObj{ID: "sub_1", Customer: "cus_other", Status: StatusActive})},
		{"invoice without id", event("m8", EventInvoicePaymentFailed, 2, []byte(`{"customer":"cus_1","subscription":"sub_1"}`))},
		{"invoice without customer", event("m9", EventInvoicePaymentFailed, 2, []byte(`{"id":"in_9","subscription":"sub_1"}`))},
		{"invoice naming another customer's subscription", failed("m10", 3, invObj{ID: "in_10", Customer: "cus_other", Subscription: "sub_1"})},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := e.handle(t, tc.ev)
			if err == nil || !webhooks.IsPermanent(err) {
				t.Fatalf("err = %v, want a permanent error", err)
			}
		})
	}
	if got := e.sub(t, "sub_1"); got.Status != StatusActive || got.StripeCustomerID != "cus_1" || got.PaymentHold {
		t.Errorf("a malformed event changed sub_1: %+v", got)
	}
	if n := e.countSubs(t); n != 1 {
		t.Errorf("%d subscription rows, want 1", n)
	}
}

func TestCustomersAreIsolated(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a := subObj{ID: "sub_a", Customer: "cus_a", Status: StatusActive, Price: "price_a", PeriodEnd: 1000}
	b := subObj{ID: "sub_b", Customer: "cus_b", Status: StatusActive, Price: "price_b", PeriodEnd: 1000}
	e.mustHandle(t, created("a1", 1, a))
	before := *e.sub(t, "sub_a")

	invB := invObj{ID: "in_b", Customer: "cus_b", Subscription: "sub_b", Currency: "usd", AmountDue: 100, AttemptCount: 1}
	e.mustHandle(t,
		created("b1", 2, b), updated("b2", 3, b.With(StatusPastDue)), failed("bf", 3, invB),
		updated("b3", 4, b.With(StatusUnpaid)), deleted("b4", 5, b.With(StatusCanceled)),
		subEv("b5", EventSubscriptionTrialWillEnd, 6, b.With(StatusTrialing)))

	after := *e.sub(t, "sub_a")
	if fmt.Sprintf("%+v", deref2(before)) != fmt.Sprintf("%+v", deref2(after)) {
		t.Errorf("customer b's events changed sub_a:\nbefore %+v\nafter  %+v", deref2(before), deref2(after))
	}
	if got := e.sub(t, "sub_b"); got.Status != StatusCanceled {
		t.Errorf("sub_b status %q", got.Status)
	}
	var aNotices int64
	e.db.Raw(`SELECT count(*) FROM notices WHERE stripe_customer_id = 'cus_a'`).Scan(&aNotices)
	if aNotices != 0 {
		t.Errorf("%d notices for customer a", aNotices)
	}
}

// deref2 flattens a Subscription's pointers so two snapshots compare by value.
func deref2(s Subscription) string {
	return fmt.Sprintf("%s %s %v %s %s %s %s %v %s %s %s %v %s %s %s",
		s.SubscriptionID, s.StripeCustomerID, s.Livemode, s.Status, ptrStr(s.PriceID),
		ptrTime(s.CurrentPeriodStart), ptrTime(s.CurrentPeriodEnd), s.CancelAtPeriodEnd,
		ptrTime(s.CanceledAt), ptrTime(s.StatusSince), ptrStr(s.SubEventID), s.PaymentHold,
		ptrInt(s.AttemptCount), ptrInt(s.AmountDue), ptrTime(s.InvEventCreated))
}

// Events of one subscription processed concurrently in separate transactions: whatever the
// interleaving, the row lock serialises them and no update is lost.
func TestConcurrentEventsLoseNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const rounds = 20
	for r := range rounds {
		subID := fmt.Sprintf("sub_c%d", r)
		s := subObj{ID: subID, Customer: "cus_c", Status: StatusActive, Price: "price_c"}
		inv := invObj{ID: "in_" + subID, Customer: "cus_c", Subscription: subID, Currency: "usd", AmountDue: 700, AttemptCount: 1}
		evs := []webhooks.Event{
			created("c1_"+subID, 1, s),
			updated("c2_"+subID, 2, s.With(StatusPastDue)),
			failed("f_"+subID, 2, inv),
			updated("c3_"+subID, 3, s.With(StatusUnpaid)),
		}
		var wg sync.WaitGroup
		errs := make([]error, len(evs))
		start := make(chan struct{})
		for i, ev := range evs {
			wg.Go(func() {
				<-start
				errs[i] = e.handleRetrySerialization(ev)
			})
		}
		close(start)
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("round %d: %v", r, err)
		}
		got := e.sub(t, subID)
		if got.Status != StatusUnpaid || ptrStr(got.SubEventID) != "c3_"+subID || !got.PaymentHold || ptrInt(got.AmountDue) != "700" {
			t.Fatalf("round %d: status %q from %s, hold %v amount %s", r, got.Status, ptrStr(got.SubEventID), got.PaymentHold, ptrInt(got.AmountDue))
		}
	}
}

// handleRetrySerialization runs an event like the worker does, without a *testing.T (goroutines).
func (e *env) handleRetrySerialization(ev webhooks.Event) error {
	h, ok := e.reg.Lookup(ev.Type)
	if !ok {
		return fmt.Errorf("no handler for %s", ev.Type)
	}
	return e.db.Transaction(func(tx *gorm.DB) error { return h.HandleEvent(context.Background(), tx, ev) })
}

func TestCustomerSubscriptionStatus(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.mustHandle(t, created("e1", 1, s1), deleted("e2", 2, s1.With(StatusCanceled)))
	tests := []struct {
		customer, sub string
		livemode      bool
		status        string
		found         bool
	}{
		{"cus_1", "sub_1", false, StatusCanceled, true},
		{"cus_1", "sub_1", true, "", false}, // the other mode never sees it
		{"cus_2", "sub_1", false, "", false},
		{"cus_1", "sub_nope", false, "", false},
	}
	for _, tc := range tests {
		status, found, err := e.svc.CustomerSubscriptionStatus(context.Background(), tc.customer, tc.livemode, tc.sub)
		if err != nil || status != tc.status || found != tc.found {
			t.Errorf("(%s, %s) = %q %v %v, want %q %v", tc.customer, tc.sub, status, found, err, tc.status, tc.found)
		}
	}
}

func TestRegisterHandlesBillingsTypes(t *testing.T) {
	t.Parallel()
	reg := webhooks.NewRegistry()
	svc := &Service{}
	svc.Register(reg)
	want := []string{EventSubscriptionCreated, EventSubscriptionDeleted, EventSubscriptionTrialWillEnd,
		EventSubscriptionUpdated, EventInvoicePaymentFailed, EventInvoicePaymentSucceeded,
		EventSubscriptionPaused, EventSubscriptionResumed, EventInvoicePaid, EventInvoicePaymentActionRequired,
		EventInvoiceVoided, EventInvoiceFinalized, EventInvoiceUpdated, EventInvoiceMarkedUncollectible}
	got := reg.Types()
	if fmt.Sprint(got) != fmt.Sprint(sortedCopy(want)) {
		t.Errorf("types = %v, want %v", got, sortedCopy(want))
	}
}
