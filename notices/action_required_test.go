package notices

import (
	"strings"
	"testing"
)

// The authentication notice carries the invoice's page, where the customer confirms the payment.
func TestRenderPaymentActionRequired(t *testing.T) {
	t.Parallel()
	p := mustParseTemplates()
	amount := int64(1250)
	url := `https://invoice.stripe.com/i/acct_1/in_9?s=ap&x="y"`
	n, err := p.render(Args{NoticeKind: KindPaymentActionRequired, SubscriptionID: "sub_1", InvoiceID: "in_9",
		AmountDue: &amount, Currency: "usd", HostedInvoiceURL: url})
	if err != nil {
		t.Fatal(err)
	}
	if n.Subject != "Confirm your payment" || !strings.Contains(n.Text, url) || !strings.Contains(n.Text, "12.50 USD") ||
		!strings.Contains(n.HTML, `href="https://invoice.stripe.com/i/acct_1/in_9?s=ap&amp;x=%22y%22"`) ||
		!strings.Contains(n.Text, "in_9") || !strings.Contains(n.Text, "test-mode") {
		t.Errorf("notice:\n%s\n%s\n%s", n.Subject, n.Text, n.HTML)
	}
	// Without a page (or with an unsafe one) it says where else to go, and renders no link.
	n, err = p.render(Args{NoticeKind: KindPaymentActionRequired, HostedInvoiceURL: "javascript:alert(1)", Livemode: true})
	if err != nil || strings.Contains(n.HTML, "javascript") || strings.Contains(n.HTML, "href") ||
		!strings.Contains(n.Text, "billing page") || strings.Contains(n.Text, "test-mode") {
		t.Errorf("notice without a page: %v\n%s\n%s", err, n.Text, n.HTML)
	}
}

// Enqueued like the others: one row per event, with the page in what it says.
func TestEnqueuePaymentActionRequired(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.link(t, "u1", "cus_1", "user@example.com")
	in := paymentNotice
	in.EventID, in.Kind = "evt_ar", KindPaymentActionRequired
	e.enqueue(t, in)
	e.enqueue(t, in)
	if n := e.count(t, "evt_ar", KindPaymentActionRequired); n != 1 {
		t.Fatalf("%d notices, want 1", n)
	}
	if a := e.content(t, "evt_ar", KindPaymentActionRequired); a.HostedInvoiceURL != paymentNotice.HostedInvoiceURL {
		t.Errorf("content: %+v", a)
	}
}
