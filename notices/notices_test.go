package notices

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"billing/internal/mail"
	"billing/internal/mail/mailtest"
)

var errTestSMTP = errors.New("test: mail server down")

// The recipient is the linked customer's email, else the event's own address; the row carries
// what the mail will say and is due at once.
func TestEnqueueRecipientAndContent(t *testing.T) {
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
			if n := e.count(t, "evt_f", KindPaymentFailed); n != 1 {
				t.Fatalf("%d notices, want 1", n)
			}
			if _, recipient, sent := e.delivery(t, "evt_f"); recipient != tc.wantRecipient || sent {
				t.Errorf("recipient %q sent %v, want %q and not sent", recipient, sent, tc.wantRecipient)
			}
			if q := e.queued(t, "evt_f"); q.NextAttemptAt == nil || !q.NextAttemptAt.Equal(at(0)) || q.Attempts != 0 {
				t.Errorf("queue: %+v, want due at %v with no attempt", q, at(0))
			}
			a := e.content(t, "evt_f", KindPaymentFailed)
			if a.EventID != "evt_f" || a.NoticeKind != KindPaymentFailed || a.SubscriptionID != "sub_1" || a.InvoiceID != "in_1" ||
				a.AmountDue == nil || *a.AmountDue != 2000 || a.Currency != "usd" || a.AttemptCount != 1 ||
				a.HostedInvoiceURL != paymentNotice.HostedInvoiceURL || a.NextPaymentAttempt == nil || !a.NextPaymentAttempt.Equal(at(86400)) {
				t.Errorf("content: %+v", a)
			}
		})
	}
}

// ---- the sender ---------------------------------------------------------------------------

func TestSenderLogsWithoutSMTP(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.link(t, "u1", "cus_1", "jane.doe@example.com")
	e.enqueue(t, paymentNotice)

	var logs syncBuffer
	s := e.sender(slog.New(slog.NewTextHandler(&logs, nil)), nil)
	s.send = func(context.Context, mail.Config, string, []byte) error {
		t.Error("sent over SMTP although mail is not configured")
		return nil
	}
	if n := e.sendDue(t, s); n != 1 {
		t.Fatalf("took %d notices, want 1", n)
	}
	if d, _, sent := e.delivery(t, "evt_f"); d != "log" || !sent {
		t.Errorf("delivery %q sent %v", d, sent)
	}
	if q := e.queued(t, "evt_f"); q.NextAttemptAt != nil || q.Attempts != 1 || q.LastError != nil {
		t.Errorf("still queued: %+v", q)
	}
	out := logs.String()
	if !strings.Contains(out, "j***@example.com") || strings.Contains(out, "jane.doe@example.com") ||
		!strings.Contains(out, "Your payment failed") || !strings.Contains(out, paymentNotice.HostedInvoiceURL) || !strings.Contains(out, "20.00 USD") {
		t.Errorf("log output: %s", out)
	}
}

func TestSenderRecipients(t *testing.T) {
	t.Parallel()
	var sent []string
	send := func(_ context.Context, _ mail.Config, to string, msg []byte) error {
		sent = append(sent, to)
		return nil
	}
	e := newEnv(t)
	e.enqueue(t, trialNotice)
	s := e.sender(nil, send)
	// Not linked when the event came: no recipient in the row, but the customer is linked now.
	e.link(t, "u_t", "cus_t", "later@example.com")
	e.sendDue(t, s)
	if d, r, ok := e.delivery(t, "evt_t"); d != "smtp" || r != "later@example.com" || !ok {
		t.Errorf("delivery %q to %q sent %v", d, r, ok)
	}
	// Sent notices leave the queue: the next pass takes nothing and sends nothing.
	if n := e.sendDue(t, s); n != 0 || len(sent) != 1 || sent[0] != "later@example.com" {
		t.Errorf("second pass took %d; sent to %v", n, sent)
	}

	// Nobody to write to: handled without sending.
	e2 := newEnv(t)
	e2.enqueue(t, trialNotice)
	e2.sendDue(t, e2.sender(nil, send))
	if d, _, ok := e2.delivery(t, "evt_t"); d != "no_recipient" || ok || len(sent) != 1 {
		t.Errorf("no recipient: delivery %q sent %v, mails %v", d, ok, sent)
	}

	// An address that is not one: handled without sending.
	e3 := newEnv(t)
	e3.link(t, "u_t", "cus_t", "not an address")
	e3.enqueue(t, trialNotice)
	e3.sendDue(t, e3.sender(nil, send))
	if d, _, ok := e3.delivery(t, "evt_t"); d != "invalid_recipient" || ok || len(sent) != 1 {
		t.Errorf("invalid recipient: delivery %q sent %v, mails %v", d, ok, sent)
	}
}

// A failed send is due again after its backoff, not before, and then sent.
func TestSenderRetriesOnSendFailure(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.link(t, "u_t", "cus_t", "user@example.com")
	e.enqueue(t, trialNotice)
	fail := true
	sends := 0
	s := e.sender(nil, func(context.Context, mail.Config, string, []byte) error {
		sends++
		if fail {
			return errTestSMTP
		}
		return nil
	})
	e.sendDue(t, s)
	if d, _, ok := e.delivery(t, "evt_t"); d != "" || ok {
		t.Errorf("failed send marked delivered: %q %v", d, ok)
	}
	q := e.queued(t, "evt_t")
	if q.Attempts != 1 || q.NextAttemptAt == nil || !q.NextAttemptAt.Equal(at(0).Add(backoff(1))) ||
		q.LastError == nil || !strings.Contains(*q.LastError, errTestSMTP.Error()) {
		t.Fatalf("after a failed send: %+v", q)
	}
	if n := e.sendDue(t, s); n != 0 || sends != 1 {
		t.Fatalf("retried before its backoff: took %d, %d sends", n, sends)
	}
	e.clock.Set(at(0).Add(backoff(1)))
	fail = false
	e.sendDue(t, s)
	if d, _, ok := e.delivery(t, "evt_t"); d != "smtp" || !ok || sends != 2 {
		t.Errorf("retry: delivery %q sent %v after %d sends", d, ok, sends)
	}
	if q := e.queued(t, "evt_t"); q.NextAttemptAt != nil || q.Attempts != 2 || q.LastError != nil {
		t.Errorf("after the retry: %+v", q)
	}
}

// A mail server that never takes the notice: after maxAttempts the notice is failed with its
// last error, and no longer due.
func TestSenderGivesUpAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.link(t, "u_t", "cus_t", "user@example.com")
	e.enqueue(t, trialNotice)
	sends := 0
	s := e.sender(nil, func(context.Context, mail.Config, string, []byte) error { sends++; return errTestSMTP })
	for range maxAttempts + 2 {
		q := e.queued(t, "evt_t")
		if q.NextAttemptAt == nil {
			break
		}
		e.clock.Set(*q.NextAttemptAt)
		e.sendDue(t, s)
	}
	if sends != maxAttempts {
		t.Errorf("%d sends, want %d", sends, maxAttempts)
	}
	if d, _, ok := e.delivery(t, "evt_t"); d != "failed" || ok {
		t.Errorf("delivery %q sent %v, want failed", d, ok)
	}
	if q := e.queued(t, "evt_t"); q.NextAttemptAt != nil || q.Attempts != maxAttempts || q.LastError == nil {
		t.Errorf("queue: %+v", q)
	}
}

// A notice that cannot be rendered will not render on a retry: failed at the first attempt.
func TestSenderFailsANoticeItCannotRender(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.link(t, "u_t", "cus_t", "user@example.com")
	in := trialNotice
	in.Kind = "no_such_kind"
	e.enqueue(t, in)
	e.sendDue(t, e.sender(nil, func(context.Context, mail.Config, string, []byte) error {
		t.Error("sent a notice that does not render")
		return nil
	}))
	if d, _, ok := e.delivery(t, "evt_t"); d != "failed" || ok {
		t.Errorf("delivery %q sent %v, want failed", d, ok)
	}
	if q := e.queued(t, "evt_t"); q.NextAttemptAt != nil || q.Attempts != 1 || q.LastError == nil || !strings.Contains(*q.LastError, "no_such_kind") {
		t.Errorf("queue: %+v", q)
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

// Two senders (two replicas) at once: a notice one of them has taken is skipped by the other
// while its lease lasts; a sender that never comes back (its lease ended) leaves it to be sent
// again.
func TestSendersTakeANoticeOnceWhileItsLeaseLasts(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.link(t, "u_t", "cus_t", "user@example.com")
	e.enqueue(t, trialNotice)

	var mu sync.Mutex
	sends := 0
	firstSending, release := make(chan struct{}), make(chan struct{})
	send := func(context.Context, mail.Config, string, []byte) error {
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
	first := make(chan error, 1)
	go func() {
		_, err := e.sender(nil, send).SendDue(context.Background())
		first <- err
	}()
	<-firstSending
	if n := e.sendDue(t, e.sender(nil, send)); n != 0 || count() != 1 {
		t.Fatalf("a second sender took %d notices while the first was sending (%d sends)", n, count())
	}
	// The first sender is gone for longer than its lease: the notice is due again.
	e.clock.Set(at(0).Add(lease))
	if n := e.sendDue(t, e.sender(nil, send)); n != 1 || count() != 2 {
		t.Fatalf("after the lease: took %d notices, %d sends; want 1 and 2", n, count())
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if d, _, ok := e.delivery(t, "evt_t"); d != "smtp" || !ok {
		t.Errorf("delivery %q sent %v", d, ok)
	}
}

// The sender end to end over SMTP: render, build, send, record.
func TestSenderSendsOverSMTP(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.link(t, "u1", "cus_1", "jane@example.com")
	e.enqueue(t, paymentNotice)

	srv, pool := mailtest.NewServer(t, false, true)
	s := NewSender(SenderConfig{DB: e.db, Mail: mail.Config{SMTPURL: "smtp://" + srv.Addr(), From: "billing@example.com", RootCAs: pool}, Now: e.clock.Now})
	e.sendDue(t, s)
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

// Run, as serve runs it, sends a notice written after it started, and returns when stopped.
func TestRunSendsNoticesAsTheyAreWritten(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.link(t, "u1", "cus_1", "jane@example.com")
	s := e.sender(nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	e.enqueue(t, paymentNotice)
	deadline := time.Now().Add(30 * time.Second)
	for d, _, _ := e.delivery(t, "evt_f"); d != "log"; d, _, _ = e.delivery(t, "evt_f") {
		if time.Now().After(deadline) {
			t.Fatalf("not sent within 30 s: delivery %q", d)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
}

// Notices written before the sender (no due time) were queued as River jobs: the worker still
// sends them, once, and the sender never takes them.
func TestJobsOfEarlierBuildsStillSend(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.link(t, "u1", "cus_1", "jane@example.com")
	var id int64
	if err := e.db.Raw(`INSERT INTO notices (event_id, kind, subscription_id, stripe_customer_id, recipient)
		VALUES ('evt_old', 'payment_failed', 'sub_1', 'cus_1', 'jane@example.com') RETURNING id`).Row().Scan(&id); err != nil {
		t.Fatal(err)
	}
	var sent []string
	send := func(_ context.Context, _ mail.Config, to string, _ []byte) error { sent = append(sent, to); return nil }
	if n := e.sendDue(t, e.sender(nil, send)); n != 0 {
		t.Fatalf("the sender took %d notices of River jobs", n)
	}
	w := NewWorker(e.db, mail.Config{SMTPURL: "smtp://127.0.0.1:1", From: "billing@example.com"}, nil)
	w.send = send
	args := paymentNotice
	job := &river.Job[Args]{JobRow: &rivertype.JobRow{}, Args: Args{NoticeID: id, EventID: "evt_old", NoticeKind: KindPaymentFailed,
		SubscriptionID: "sub_1", StripeCustomerID: "cus_1", AmountDue: args.AmountDue, Currency: "usd"}}
	for range 2 { // the second run: a retry after a lost completion
		if err := w.Work(context.Background(), job); err != nil {
			t.Fatal(err)
		}
	}
	if d, r, ok := e.delivery(t, "evt_old"); d != "smtp" || r != "jane@example.com" || !ok || len(sent) != 1 {
		t.Errorf("delivery %q to %q sent %v; mails %v", d, r, ok, sent)
	}
}

// A mail server so slow that a batch's sends would outlast its lease: no send starts with less
// than a send's timeout left on the lease, and the rows not sent go back, due at once with their
// attempt not counted, for the next batch (which may be another replica's) to send.
func TestASlowMailServerHandsTheRestOfTheBatchBack(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.link(t, "u_t", "cus_t", "user@example.com")
	const total = 12
	for k := range total {
		in := trialNotice
		in.EventID = fmt.Sprintf("evt_slow%d", k)
		e.enqueue(t, in)
	}
	var mu sync.Mutex
	sends := 0
	// Each send takes the whole lease (by the sender's clock).
	slow := func(context.Context, mail.Config, string, []byte) error {
		mu.Lock()
		sends++
		mu.Unlock()
		e.clock.Add(lease)
		return nil
	}
	if n := e.sendDue(t, e.sender(nil, slow)); n != total {
		t.Fatalf("took %d notices, want %d", n, total)
	}
	if sends < 1 || sends > sendWorkers {
		t.Fatalf("%d sends began; want one per worker at most, the lease being spent by the first", sends)
	}
	back := 0
	for k := range total {
		id := fmt.Sprintf("evt_slow%d", k)
		if d, _, _ := e.delivery(t, id); d != "" {
			continue
		}
		back++
		if q := e.queued(t, id); q.Attempts != 0 || q.NextAttemptAt == nil || !q.NextAttemptAt.Equal(at(0)) || q.LastError != nil {
			t.Errorf("%s handed back as %+v; want due at %v, no attempt counted", id, q, at(0))
		}
	}
	if back != total-sends {
		t.Fatalf("%d handed back, %d sent, of %d", back, sends, total)
	}
	// The next batch sends them.
	if n := e.sendDue(t, e.sender(nil, func(context.Context, mail.Config, string, []byte) error { return nil })); n != back {
		t.Fatalf("the next batch took %d, want %d", n, back)
	}
}
