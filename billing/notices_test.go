package billing

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"billing/webhooks"
)

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
	if rows, jobs := e.noticeCount(t, "evt_trial", NoticeTrialWillEnd); rows != 1 || jobs != 1 {
		t.Fatalf("notices %d, jobs %d; want 1 and 1", rows, jobs)
	}
	if rows, jobs := e.totalNotices(t); rows != 1 || jobs != 1 {
		t.Errorf("total notices %d, jobs %d", rows, jobs)
	}
	args := e.jobArgs(t, "evt_trial", NoticeTrialWillEnd)
	if args.SubscriptionID != "sub_t" || ptrTime(args.TrialEnd) != "2024-06-04T00:00:00Z" || args.NoticeID == 0 {
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
	if rows, jobs := e.totalNotices(t); rows != 2 || jobs != 2 {
		t.Errorf("after a second event: notices %d, jobs %d", rows, jobs)
	}
}

func TestTrialWillEndSkippedWhenNoLongerTrialing(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		before []webhooks.Event
	}{
		{"canceled meanwhile", []webhooks.Event{deleted("d1", 50, trialSub.with(StatusCanceled))}},
		{"converted to active by a newer event", []webhooks.Event{updated("u1", 50, trialSub.with(StatusActive))}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.link(t, "u_t", "cus_t", "trial.user@example.com")
			e.mustHandle(t, tc.before...)
			e.mustHandle(t, trialEv("evt_trial", 10, trialSub))
			if rows, jobs := e.totalNotices(t); rows != 0 || jobs != 0 {
				t.Errorf("notices %d, jobs %d; want none", rows, jobs)
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
			if rows, jobs := e.noticeCount(t, "evt_f1", NoticePaymentFailed); rows != 1 || jobs != 1 {
				t.Fatalf("notices %d, jobs %d; want 1 and 1", rows, jobs)
			}
			var recipient string
			e.db.Raw(`SELECT recipient FROM notices WHERE event_id = 'evt_f1'`).Scan(&recipient)
			if recipient != tc.wantRecipient {
				t.Errorf("recipient %q, want %q", recipient, tc.wantRecipient)
			}
			args := e.jobArgs(t, "evt_f1", NoticePaymentFailed)
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
	if rows, jobs := e.totalNotices(t); rows != 0 || jobs != 0 {
		t.Errorf("stale failure: notices %d, jobs %d", rows, jobs)
	}
	// Two real retries: one notice each.
	e.mustHandle(t, failed("f2", 300, inv), failed("f3", 400, inv))
	if rows, jobs := e.totalNotices(t); rows != 2 || jobs != 2 {
		t.Errorf("two failures: notices %d, jobs %d", rows, jobs)
	}
	// A canceled subscription's invoice failing: no mail.
	e.mustHandle(t, deleted("d1", 500, s1.with(StatusCanceled)), failed("f4", 600, inv))
	if rows, _ := e.totalNotices(t); rows != 2 {
		t.Errorf("failure on a canceled subscription sent a notice (%d rows)", rows)
	}
}

// River's unique options back up the notices table: even with the notices row gone, the same
// event does not get a second job.
func TestNoticeJobUniqueByEvent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ev := trialEv("evt_u", 10, trialSub)
	e.mustHandle(t, ev)
	e.db.Exec(`DELETE FROM notices`)
	e.mustHandle(t, ev)
	if _, jobs := e.noticeCount(t, "evt_u", NoticeTrialWillEnd); jobs != 1 {
		t.Errorf("%d jobs, want 1", jobs)
	}
}

// ---- the worker ---------------------------------------------------------------------------

func ptr[T any](v T) *T { return &v }

func (e *env) jobArgs(t *testing.T, eventID, kind string) NoticeArgs {
	t.Helper()
	var raw []string
	e.db.Raw(`SELECT args::text FROM river_job WHERE kind = ? AND args->>'event_id' = ? AND args->>'kind' = ?`,
		NoticeJobKind, eventID, kind).Scan(&raw)
	if len(raw) != 1 {
		t.Fatalf("%d jobs for %s/%s", len(raw), eventID, kind)
	}
	var a NoticeArgs
	if err := json.Unmarshal([]byte(raw[0]), &a); err != nil {
		t.Fatal(err)
	}
	return a
}

func (e *env) work(t *testing.T, w *NoticeWorker, eventID, kind string) error {
	t.Helper()
	args := e.jobArgs(t, eventID, kind)
	return w.Work(context.Background(), &river.Job[NoticeArgs]{JobRow: &rivertype.JobRow{}, Args: args})
}

func (e *env) delivery(t *testing.T, eventID string) (delivery, recipient string, sent bool) {
	t.Helper()
	var rows []struct {
		Delivery  *string
		Recipient string
		Sent      bool
	}
	e.db.Raw(`SELECT delivery, recipient, sent_at IS NOT NULL AS sent FROM notices WHERE event_id = ?`, eventID).Scan(&rows)
	if len(rows) != 1 {
		t.Fatalf("%d notices for %s", len(rows), eventID)
	}
	return deref(rows[0].Delivery), rows[0].Recipient, rows[0].Sent
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestNoticeWorkerLogsWithoutSMTP(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.link(t, "u1", "cus_1", "jane.doe@example.com")
	inv := invObj{ID: "in_1", Customer: "cus_1", Subscription: "sub_1", Currency: "usd", AmountDue: 2000, AttemptCount: 1,
		URL: "https://invoice.stripe.com/i/in_1"}
	e.mustHandle(t, created("c1", 1, s1), failed("evt_f", 100, inv))

	var logs syncBuffer
	w := NewNoticeWorker(e.db, MailConfig{}, slog.New(slog.NewTextHandler(&logs, nil)))
	w.send = func(context.Context, MailConfig, string, []byte) error {
		t.Error("sent over SMTP although mail is not configured")
		return nil
	}
	if err := e.work(t, w, "evt_f", NoticePaymentFailed); err != nil {
		t.Fatal(err)
	}
	if d, _, sent := e.delivery(t, "evt_f"); d != "log" || !sent {
		t.Errorf("delivery %q sent %v", d, sent)
	}
	out := logs.String()
	if !strings.Contains(out, "j***@example.com") || strings.Contains(out, "jane.doe@example.com") ||
		!strings.Contains(out, "Your payment failed") || !strings.Contains(out, inv.URL) || !strings.Contains(out, "20.00 USD") {
		t.Errorf("log output: %s", out)
	}
}

func TestNoticeWorkerRecipients(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.mustHandle(t, trialEv("evt_t", 10, trialSub))

	var sent []string
	w := NewNoticeWorker(e.db, MailConfig{SMTPURL: "smtp://127.0.0.1:1", From: "Billing <billing@example.com>"}, nil)
	w.send = func(_ context.Context, _ MailConfig, to string, msg []byte) error {
		sent = append(sent, to)
		return nil
	}
	// Not linked when the event came: no recipient in the row, but the customer is linked now.
	e.link(t, "u_t", "cus_t", "later@example.com")
	if err := e.work(t, w, "evt_t", NoticeTrialWillEnd); err != nil {
		t.Fatal(err)
	}
	if d, r, ok := e.delivery(t, "evt_t"); d != "smtp" || r != "later@example.com" || !ok {
		t.Errorf("delivery %q to %q sent %v", d, r, ok)
	}
	// The job running again (a retry after a lost completion) does not send twice.
	if err := e.work(t, w, "evt_t", NoticeTrialWillEnd); err != nil {
		t.Fatal(err)
	}
	if len(sent) != 1 || sent[0] != "later@example.com" {
		t.Errorf("sent to %v", sent)
	}

	// Nobody to write to: completed without sending.
	e2 := newEnv(t)
	e2.mustHandle(t, trialEv("evt_t", 10, trialSub))
	w2 := NewNoticeWorker(e2.db, MailConfig{SMTPURL: "smtp://127.0.0.1:1", From: "billing@example.com"}, nil)
	w2.send = w.send
	if err := e2.work(t, w2, "evt_t", NoticeTrialWillEnd); err != nil {
		t.Fatal(err)
	}
	if d, _, ok := e2.delivery(t, "evt_t"); d != "no_recipient" || ok || len(sent) != 1 {
		t.Errorf("no recipient: delivery %q sent %v, mails %v", d, ok, sent)
	}

	// An address that is not one: completed without sending.
	e3 := newEnv(t)
	e3.link(t, "u_t", "cus_t", "not an address")
	e3.mustHandle(t, trialEv("evt_t", 10, trialSub))
	w3 := NewNoticeWorker(e3.db, MailConfig{SMTPURL: "smtp://127.0.0.1:1", From: "billing@example.com"}, nil)
	w3.send = w.send
	if err := e3.work(t, w3, "evt_t", NoticeTrialWillEnd); err != nil {
		t.Fatal(err)
	}
	if d, _, ok := e3.delivery(t, "evt_t"); d != "invalid_recipient" || ok || len(sent) != 1 {
		t.Errorf("invalid recipient: delivery %q sent %v, mails %v", d, ok, sent)
	}
}

func TestNoticeWorkerRetriesOnSendFailure(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.link(t, "u_t", "cus_t", "user@example.com")
	e.mustHandle(t, trialEv("evt_t", 10, trialSub))
	w := NewNoticeWorker(e.db, MailConfig{SMTPURL: "smtp://127.0.0.1:1", From: "billing@example.com"}, nil)
	w.send = func(context.Context, MailConfig, string, []byte) error { return errTestSMTP }
	if err := e.work(t, w, "evt_t", NoticeTrialWillEnd); err == nil {
		t.Fatal("a send failure was not returned (River would not retry)")
	}
	if d, _, ok := e.delivery(t, "evt_t"); d != "" || ok {
		t.Errorf("failed send marked delivered: %q %v", d, ok)
	}
}

func TestRenderNotices(t *testing.T) {
	t.Parallel()
	p := mustParsePages()
	te := at(3 * 86400)
	n, err := p.renderNotice(NoticeArgs{NoticeKind: NoticeTrialWillEnd, SubscriptionID: "sub_1", TrialEnd: &te})
	if err != nil {
		t.Fatal(err)
	}
	if n.Subject != "Your trial ends on June 4, 2024" || !strings.Contains(n.Text, "June 4, 2024") || !strings.Contains(n.HTML, "June 4, 2024") {
		t.Errorf("trial notice: %+v", n)
	}
	n, err = p.renderNotice(NoticeArgs{NoticeKind: NoticeTrialWillEnd, SubscriptionID: "sub_1"})
	if err != nil || n.Subject != "Your trial ends soon" {
		t.Errorf("trial notice without date: %q %v", n.Subject, err)
	}

	amount := int64(4999)
	url := `https://invoice.stripe.com/i/x?a=1&b="2"`
	n, err = p.renderNotice(NoticeArgs{NoticeKind: NoticePaymentFailed, SubscriptionID: "sub_1", AmountDue: &amount,
		Currency: "eur", HostedInvoiceURL: url})
	if err != nil {
		t.Fatal(err)
	}
	if n.Subject != "Your payment failed — update your card" || !strings.Contains(n.Text, url) || !strings.Contains(n.Text, "49.99 EUR") ||
		!strings.Contains(n.HTML, `href="https://invoice.stripe.com/i/x?a=1&amp;b=%222%22"`) || !strings.Contains(n.Text, "No further automatic attempt") {
		t.Errorf("payment notice:\n%s\n%s\n%s", n.Subject, n.Text, n.HTML)
	}
	// A link that is not http(s) is dropped, not rendered.
	n, _ = p.renderNotice(NoticeArgs{NoticeKind: NoticePaymentFailed, HostedInvoiceURL: "javascript:alert(1)"})
	if strings.Contains(n.Text, "javascript") || strings.Contains(n.HTML, "javascript") {
		t.Errorf("unsafe link rendered: %s %s", n.Text, n.HTML)
	}
	if _, err := p.renderNotice(NoticeArgs{NoticeKind: "nope"}); err == nil {
		t.Error("unknown kind rendered")
	}
}

// River runs a job again when it looks stuck (worker.rescue_after), possibly while the first run
// is still talking to the mail server: the second run waits for the first and sends nothing.
func TestNoticeWorkerConcurrentRunsSendOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.link(t, "u_t", "cus_t", "user@example.com")
	e.mustHandle(t, trialEv("evt_t", 10, trialSub))

	var mu sync.Mutex
	sends := 0
	firstSending, release := make(chan struct{}), make(chan struct{})
	w := NewNoticeWorker(e.db, MailConfig{SMTPURL: "smtp://127.0.0.1:1", From: "billing@example.com"}, nil)
	w.send = func(context.Context, MailConfig, string, []byte) error {
		mu.Lock()
		sends++
		n := sends
		mu.Unlock()
		if n == 1 {
			close(firstSending)
			<-release
		}
		return nil
	}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return sends
	}
	args := e.jobArgs(t, "evt_t", NoticeTrialWillEnd)
	errs := make(chan error, 2)
	run := func() {
		errs <- w.Work(context.Background(), &river.Job[NoticeArgs]{JobRow: &rivertype.JobRow{}, Args: args})
	}
	go run()
	<-firstSending
	go run()
	// The second run either queues on the notice's row lock or (without it) sends a second mail.
	deadline := time.Now().Add(30 * time.Second)
	for count() < 2 && e.lockWaiters(t) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the second run neither waits nor sends")
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if n := count(); n != 1 {
		t.Errorf("%d mails sent, want 1", n)
	}
	if d, _, ok := e.delivery(t, "evt_t"); d != "smtp" || !ok {
		t.Errorf("delivery %q sent %v", d, ok)
	}
}

// lockWaiters counts the backends of this test's database that wait on a lock.
func (e *env) lockWaiters(t *testing.T) int {
	t.Helper()
	var n int
	if err := e.db.Raw(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).
		Scan(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n
}
