package notices

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"gorm.io/gorm"

	"billing/internal/jobs"
	"billing/internal/mail"
	"billing/internal/mail/mailtest"
)

var errTestSMTP = errors.New("test: mail server down")

// The recipient is the linked customer's email, else the event's own address; the job carries
// what the mail will say.
func TestEnqueueRecipientAndArgs(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name          string
		linkEmail     *string // nil: customer not linked
		fallback      string
		wantRecipient string
	}{
		{"linked customer's email wins", ptr("user@example.com"), "billing@invoice.example", "user@example.com"},
		{"linked customer's email, trimmed", ptr(" user@example.com\t\n"), "", "user@example.com"},
		{"linked with blanks only falls back to the event's", ptr(" \t"), "billing@invoice.example", "billing@invoice.example"},
		{"linked without email falls back to the event's", ptr(""), "billing@invoice.example", "billing@invoice.example"},
		{"unlinked falls back to the event's", nil, " billing@invoice.example ", "billing@invoice.example"},
		{"no address at all", nil, "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			if tc.linkEmail != nil {
				e.link(t, "u1", "cus_1", *tc.linkEmail)
			}
			in := paymentNotice
			in.FallbackEmail = tc.fallback
			e.enqueue(t, in)
			e.enqueue(t, in) // the same event applied again
			if rows, jobs := e.counts(t, "evt_f", KindPaymentFailed); rows != 1 || jobs != 1 {
				t.Fatalf("notices %d, jobs %d; want 1 and 1", rows, jobs)
			}
			if _, recipient, sent := e.delivery(t, "evt_f"); recipient != tc.wantRecipient || sent {
				t.Errorf("recipient %q sent %v, want %q and not sent", recipient, sent, tc.wantRecipient)
			}
			a := e.jobArgs(t, "evt_f", KindPaymentFailed)
			var noticeID int64
			if err := e.db.Raw(`SELECT id FROM notices WHERE event_id = 'evt_f'`).Row().Scan(&noticeID); err != nil {
				t.Fatal(err)
			}
			if a.NoticeID != noticeID || a.SubscriptionID != "sub_1" || a.InvoiceID != "in_1" || a.AmountDue == nil || *a.AmountDue != 2000 ||
				a.Currency != "usd" || a.AttemptCount != 1 || a.HostedInvoiceURL != paymentNotice.HostedInvoiceURL ||
				a.NextPaymentAttempt == nil || !a.NextPaymentAttempt.Equal(at(86400)) {
				t.Errorf("job args: %+v", a)
			}
		})
	}
}

// River's unique options back up the notices table: even with the notices row gone, the same
// event does not get a second job.
func TestNoticeJobUniqueByEvent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	in := trialNotice
	in.EventID = "evt_u"
	e.enqueue(t, in)
	e.db.Exec(`DELETE FROM notices`)
	e.enqueue(t, in)
	if _, jobs := e.counts(t, "evt_u", KindTrialWillEnd); jobs != 1 {
		t.Errorf("%d jobs, want 1", jobs)
	}
}

func TestEnqueueWithoutInserterFails(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.enqueuer = NewEnqueuer(EnqueuerConfig{})
	err := e.db.Transaction(func(tx *gorm.DB) error { return e.enqueuer.Enqueue(context.Background(), tx, trialNotice) })
	if err == nil {
		t.Fatal("enqueued without a job inserter")
	}
	if rows, _ := e.counts(t, "evt_t", KindTrialWillEnd); rows != 0 {
		t.Errorf("%d notices rows left by a failed enqueue", rows)
	}
}

// ---- the worker ---------------------------------------------------------------------------

func TestNoticeWorkerLogsWithoutSMTP(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.link(t, "u1", "cus_1", "jane.doe@example.com")
	e.enqueue(t, paymentNotice)

	var logs syncBuffer
	w := NewWorker(e.db, mail.Config{}, slog.New(slog.NewTextHandler(&logs, nil)))
	w.send = func(context.Context, mail.Config, string, []byte) error {
		t.Error("sent over SMTP although mail is not configured")
		return nil
	}
	if err := e.work(t, w, "evt_f", KindPaymentFailed); err != nil {
		t.Fatal(err)
	}
	if d, _, sent := e.delivery(t, "evt_f"); d != "log" || !sent {
		t.Errorf("delivery %q sent %v", d, sent)
	}
	out := logs.String()
	if !strings.Contains(out, "j***@example.com") || strings.Contains(out, "jane.doe@example.com") ||
		!strings.Contains(out, "Your payment failed") || !strings.Contains(out, paymentNotice.HostedInvoiceURL) || !strings.Contains(out, "20.00 USD") {
		t.Errorf("log output: %s", out)
	}
}

func TestNoticeWorkerRecipients(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.enqueue(t, trialNotice)

	var sent []string
	w := NewWorker(e.db, mail.Config{SMTPURL: "smtp://127.0.0.1:1", From: "Billing <billing@example.com>"}, nil)
	w.send = func(_ context.Context, _ mail.Config, to string, msg []byte) error {
		sent = append(sent, to)
		return nil
	}
	// Not linked when the event came: no recipient in the row, but the customer is linked now.
	e.link(t, "u_t", "cus_t", "later@example.com")
	if err := e.work(t, w, "evt_t", KindTrialWillEnd); err != nil {
		t.Fatal(err)
	}
	if d, r, ok := e.delivery(t, "evt_t"); d != "smtp" || r != "later@example.com" || !ok {
		t.Errorf("delivery %q to %q sent %v", d, r, ok)
	}
	// The job running again (a retry after a lost completion) does not send twice.
	if err := e.work(t, w, "evt_t", KindTrialWillEnd); err != nil {
		t.Fatal(err)
	}
	if len(sent) != 1 || sent[0] != "later@example.com" {
		t.Errorf("sent to %v", sent)
	}

	// Nobody to write to: completed without sending.
	e2 := newEnv(t)
	e2.enqueue(t, trialNotice)
	w2 := NewWorker(e2.db, mail.Config{SMTPURL: "smtp://127.0.0.1:1", From: "billing@example.com"}, nil)
	w2.send = w.send
	if err := e2.work(t, w2, "evt_t", KindTrialWillEnd); err != nil {
		t.Fatal(err)
	}
	if d, _, ok := e2.delivery(t, "evt_t"); d != "no_recipient" || ok || len(sent) != 1 {
		t.Errorf("no recipient: delivery %q sent %v, mails %v", d, ok, sent)
	}

	// An address that is not one: completed without sending.
	e3 := newEnv(t)
	e3.link(t, "u_t", "cus_t", "not an address")
	e3.enqueue(t, trialNotice)
	w3 := NewWorker(e3.db, mail.Config{SMTPURL: "smtp://127.0.0.1:1", From: "billing@example.com"}, nil)
	w3.send = w.send
	if err := e3.work(t, w3, "evt_t", KindTrialWillEnd); err != nil {
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
	e.enqueue(t, trialNotice)
	w := NewWorker(e.db, mail.Config{SMTPURL: "smtp://127.0.0.1:1", From: "billing@example.com"}, nil)
	w.send = func(context.Context, mail.Config, string, []byte) error { return errTestSMTP }
	if err := e.work(t, w, "evt_t", KindTrialWillEnd); err == nil {
		t.Fatal("a send failure was not returned (River would not retry)")
	}
	if d, _, ok := e.delivery(t, "evt_t"); d != "" || ok {
		t.Errorf("failed send marked delivered: %q %v", d, ok)
	}
}

func TestRenderNotices(t *testing.T) {
	t.Parallel()
	p := mustParseTemplates()
	te := at(3 * 86400)
	n, err := p.render(Args{NoticeKind: KindTrialWillEnd, SubscriptionID: "sub_1", TrialEnd: &te})
	if err != nil {
		t.Fatal(err)
	}
	if n.Subject != "Your trial ends on June 4, 2024" || !strings.Contains(n.Text, "June 4, 2024") || !strings.Contains(n.HTML, "June 4, 2024") {
		t.Errorf("trial notice: %+v", n)
	}
	n, err = p.render(Args{NoticeKind: KindTrialWillEnd, SubscriptionID: "sub_1"})
	if err != nil || n.Subject != "Your trial ends soon" {
		t.Errorf("trial notice without date: %q %v", n.Subject, err)
	}

	amount := int64(4999)
	url := `https://invoice.stripe.com/i/x?a=1&b="2"`
	n, err = p.render(Args{NoticeKind: KindPaymentFailed, SubscriptionID: "sub_1", AmountDue: &amount,
		Currency: "eur", HostedInvoiceURL: url})
	if err != nil {
		t.Fatal(err)
	}
	if n.Subject != "Your payment failed — update your card" || !strings.Contains(n.Text, url) || !strings.Contains(n.Text, "49.99 EUR") ||
		!strings.Contains(n.HTML, `href="https://invoice.stripe.com/i/x?a=1&amp;b=%222%22"`) || !strings.Contains(n.Text, "No further automatic attempt") {
		t.Errorf("payment notice:\n%s\n%s\n%s", n.Subject, n.Text, n.HTML)
	}
	// A link that is not http(s) is dropped, not rendered.
	n, _ = p.render(Args{NoticeKind: KindPaymentFailed, HostedInvoiceURL: "javascript:alert(1)"})
	if strings.Contains(n.Text, "javascript") || strings.Contains(n.HTML, "javascript") {
		t.Errorf("unsafe link rendered: %s %s", n.Text, n.HTML)
	}
	if _, err := p.render(Args{NoticeKind: "nope"}); err == nil {
		t.Error("unknown kind rendered")
	}
}

// River runs a job again when it looks stuck (worker.rescue_after), possibly while the first run
// is still talking to the mail server: the second run waits for the first and sends nothing.
func TestNoticeWorkerConcurrentRunsSendOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.link(t, "u_t", "cus_t", "user@example.com")
	e.enqueue(t, trialNotice)

	var mu sync.Mutex
	sends := 0
	firstSending, release := make(chan struct{}), make(chan struct{})
	w := NewWorker(e.db, mail.Config{SMTPURL: "smtp://127.0.0.1:1", From: "billing@example.com"}, nil)
	w.send = func(context.Context, mail.Config, string, []byte) error {
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
	args := e.jobArgs(t, "evt_t", KindTrialWillEnd)
	errs := make(chan error, 2)
	run := func() {
		errs <- w.Work(context.Background(), &river.Job[Args]{JobRow: &rivertype.JobRow{}, Args: args})
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

// The worker end to end over SMTP: render, build, send, mark.
func TestNoticeWorkerSendsOverSMTP(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.link(t, "u1", "cus_1", "jane@example.com")
	e.enqueue(t, paymentNotice)

	srv, pool := mailtest.NewServer(t, false, true)
	w := NewWorker(e.db, mail.Config{SMTPURL: "smtp://" + srv.Addr(), From: "billing@example.com", RootCAs: pool}, nil)
	if err := e.work(t, w, "evt_f", KindPaymentFailed); err != nil {
		t.Fatal(err)
	}
	got := srv.Received()
	if len(got) != 1 {
		t.Fatalf("%d mails", len(got))
	}
	if !got[0].TLS || got[0].To != "TO:<jane@example.com>" {
		t.Errorf("envelope to %q tls %v", got[0].To, got[0].TLS)
	}
	_, text, html := mailtest.Parse(t, got[0].Data)
	if !strings.Contains(text, paymentNotice.HostedInvoiceURL) || !strings.Contains(text, "20.00 USD") || !strings.Contains(text, "June 2, 2024") ||
		!strings.Contains(html, `href="https://invoice.stripe.com/i/in_1"`) {
		t.Errorf("mail bodies:\n%s\n%s", text, html)
	}
	if d, r, ok := e.delivery(t, "evt_f"); d != "smtp" || r != "jane@example.com" || !ok {
		t.Errorf("delivery %q to %q sent %v", d, r, ok)
	}
}

// The job Enqueue writes in its one statement (the notice's id merged into the args in SQL) is
// the row River's InsertTx writes for the same Args, column by column, and each sees the
// other's as a duplicate.
func TestEnqueuedJobIsTheRowRiverWouldInsert(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	row := func() string {
		t.Helper()
		// scheduled_at is the insert's now() for an available job: not compared.
		var cols []string
		if err := e.db.Raw(`SELECT CAST(to_jsonb(j) - 'id' - 'created_at' - 'scheduled_at' AS text) FROM river_job j
			WHERE kind = 'billing_notice' AND args->>'event_id' = 'evt_f'`).Scan(&cols).Error; err != nil || len(cols) != 1 {
			t.Fatalf("jobs: %v, %v; want one", cols, err)
		}
		return cols[0]
	}
	byRiver := func(a Args) (skipped bool) {
		t.Helper()
		if err := e.db.Transaction(func(tx *gorm.DB) error {
			sqlTx, err := jobs.SQLTx(tx)
			if err != nil {
				return err
			}
			res, err := e.enqueuer.jobs.InsertTx(context.Background(), sqlTx, a, nil)
			if err == nil {
				skipped = res.UniqueSkippedAsDuplicate
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return skipped
	}

	e.enqueue(t, paymentNotice)
	ours := row()
	a := e.jobArgs(t, "evt_f", KindPaymentFailed)
	if !byRiver(a) {
		t.Error("River did not see the enqueued job as a duplicate")
	}
	if err := e.db.Exec(`DELETE FROM river_job`).Error; err != nil {
		t.Fatal(err)
	}
	if byRiver(a) {
		t.Fatal("River skipped its insert on an empty table")
	}
	if river := row(); !jsonEqual(t, ours, river) {
		t.Errorf("Enqueue's job:\nours  %s\nRiver %s", ours, river)
	}
}

// jsonEqual reports whether two JSON texts hold the same value.
func jsonEqual(t *testing.T, a, b string) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal([]byte(a), &x); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(b), &y); err != nil {
		t.Fatal(err)
	}
	return reflect.DeepEqual(x, y)
}
