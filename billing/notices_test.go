package billing

import (
	"testing"

	"billing/billing/billingtest"
	"billing/notices"
	"billing/webhooks"
)

// The notices billing's handlers call for. How a notice is then rendered and sent is the
// notices package's, and tested there.

func trialEv(id string, t int64, s subObj) webhooks.Event {
	return subEv(id, EventSubscriptionTrialWillEnd, t, s)
}

var trialSub = subObj{ID: "sub_t", Customer: "cus_t", Status: StatusTrialing, Price: "price_pro", TrialStart: 1, TrialEnd: 3 * 86400, PeriodEnd: 3 * 86400}

func TestTrialWillEndNoticeOncePerEvent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.link(t, "u_t", "cus_t", "trial.user@example.com")
	ev := trialEv("evt_trial", 10, trialSub)
	e.mustHandle(t, created("c1", 1, trialSub), ev)
	// Redelivered and replayed: still one notice and one job.
	e.mustHandle(t, ev, ev)
	if rows, due := e.noticeCount(t, "evt_trial", notices.KindTrialWillEnd); rows != 1 || due != 1 {
		t.Fatalf("notices %d, queued %d; want 1 and 1", rows, due)
	}
	if rows, due := e.totalNotices(t); rows != 1 || due != 1 {
		t.Errorf("total notices %d, queued %d", rows, due)
	}
	args := e.noticeContent(t, "evt_trial", notices.KindTrialWillEnd)
	if args.SubscriptionID != "sub_t" || ptrTime(args.TrialEnd) != "2024-06-04T00:00:00Z" {
		t.Errorf("job args: %+v", args)
	}
	var recipient string
	e.db.Raw(`SELECT recipient FROM notices WHERE event_id = 'evt_trial'`).Scan(&recipient)
	if recipient != "trial.user@example.com" {
		t.Errorf("recipient %q", recipient)
	}
	if got := e.sub(t, "sub_t"); ptrTime(got.TrialWillEndAt) != "2024-06-01T00:00:10Z" {
		t.Errorf("trial_will_end_at = %s", ptrTime(got.TrialWillEndAt))
	}

	// A second trial_will_end event (the trial was extended) is a second notice.
	ext := trialSub
	ext.TrialEnd = 10 * 86400
	e.mustHandle(t, trialEv("evt_trial2", 20, ext))
	if rows, due := e.totalNotices(t); rows != 2 || due != 2 {
		t.Errorf("after a second event: notices %d, queued %d", rows, due)
	}
}

func TestTrialWillEndSkippedWhenNoLongerTrialing(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		before []webhooks.Event
	}{
		{"canceled meanwhile", []webhooks.Event{deleted("d1", 50, trialSub.With(StatusCanceled))}},
		{"converted to active by a newer event", []webhooks.Event{updated("u1", 50, trialSub.With(StatusActive))}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.link(t, "u_t", "cus_t", "trial.user@example.com")
			e.mustHandle(t, tc.before...)
			e.mustHandle(t, trialEv("evt_trial", 10, trialSub))
			if rows, due := e.totalNotices(t); rows != 0 || due != 0 {
				t.Errorf("notices %d, queued %d; want none", rows, due)
			}
			if got := e.sub(t, "sub_t"); got.TrialWillEndAt == nil {
				t.Error("trial_will_end not recorded")
			}
		})
	}
}

func TestPaymentFailedNotice(t *testing.T) {
	t.Parallel()
	inv := invObj{ID: "in_1", Customer: "cus_1", Subscription: "sub_1", Currency: "usd", AmountDue: 2000,
		AttemptCount: 1, NextAttempt: 86400, URL: "https://invoice.stripe.com/i/in_1", Email: "billing@invoice.example"}
	tests := []struct {
		name          string
		linkEmail     *string // nil: customer not linked
		invoiceEmail  string
		wantRecipient string
	}{
		{"linked customer's email wins", ptr("user@example.com"), "billing@invoice.example", "user@example.com"},
		{"linked without email falls back to the invoice", ptr(""), "billing@invoice.example", "billing@invoice.example"},
		{"unlinked falls back to the invoice", nil, "billing@invoice.example", "billing@invoice.example"},
		{"no address at all", nil, "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			if tc.linkEmail != nil {
				e.link(t, "u1", "cus_1", *tc.linkEmail)
			}
			in := inv
			in.Email = tc.invoiceEmail
			ev := failed("evt_f1", 100, in)
			e.mustHandle(t, created("c1", 1, s1), ev, ev)
			if rows, due := e.noticeCount(t, "evt_f1", notices.KindPaymentFailed); rows != 1 || due != 1 {
				t.Fatalf("notices %d, queued %d; want 1 and 1", rows, due)
			}
			var recipient string
			e.db.Raw(`SELECT recipient FROM notices WHERE event_id = 'evt_f1'`).Scan(&recipient)
			if recipient != tc.wantRecipient {
				t.Errorf("recipient %q, want %q", recipient, tc.wantRecipient)
			}
			args := e.noticeContent(t, "evt_f1", notices.KindPaymentFailed)
			if args.HostedInvoiceURL != inv.URL || ptrInt(args.AmountDue) != "2000" || args.Currency != "usd" ||
				args.AttemptCount != 1 || ptrTime(args.NextPaymentAttempt) != "2024-06-02T00:00:00Z" || args.InvoiceID != "in_1" {
				t.Errorf("job args: %+v", args)
			}
		})
	}
}

func TestPaymentFailedNoticeOnlyWhenNewest(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.link(t, "u1", "cus_1", "user@example.com")
	inv := invObj{ID: "in_1", Customer: "cus_1", Subscription: "sub_1", Currency: "usd", AmountDue: 2000, AttemptCount: 1}
	// Paid at 200; the failure of 100 arrives late: no "your payment failed" mail.
	e.mustHandle(t, created("c1", 1, s1), succeeded("p1", 200, inv), failed("f_old", 100, inv))
	if rows, due := e.totalNotices(t); rows != 0 || due != 0 {
		t.Errorf("stale failure: notices %d, queued %d", rows, due)
	}
	// Two real retries: one notice each.
	e.mustHandle(t, failed("f2", 300, inv), failed("f3", 400, inv))
	if rows, due := e.totalNotices(t); rows != 2 || due != 2 {
		t.Errorf("two failures: notices %d, queued %d", rows, due)
	}
	// A canceled subscription's invoice failing: no mail.
	e.mustHandle(t, deleted("d1", 500, s1.With(StatusCanceled)), failed("f4", 600, inv))
	if rows, _ := e.totalNotices(t); rows != 2 {
		t.Errorf("failure on a canceled subscription sent a notice (%d rows)", rows)
	}
}

func ptr[T any](v T) *T { return &v }

// noticeContent is what the one notice of an event and kind will say.
func (e *env) noticeContent(t *testing.T, eventID, kind string) notices.Args {
	t.Helper()
	return billingtest.NoticeContent(t, e.db, eventID, kind)
}
