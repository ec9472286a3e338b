package stripeemu

import (
	"errors"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v79"

	"billing/internal/stripeclient"
)

func newAccount(t *testing.T) (*Proxy, *Account) {
	t.Helper()
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusTeapot, map[string]any{"error": map[string]any{"type": "api_error", "message": "not the account"}})
	})
	p := New(t, newTestServer(t, upstream))
	return p, NewAccount(p, false)
}

// The account pages a list the way stripe-go's iterator walks it: every subscription once, newest
// first, with the expansions asked for, canceled ones only with status=all.
func TestAccountListsEveryPage(t *testing.T) {
	p, acct := newAccount(t)
	cus := acct.AddCustomer(CustomerSpec{Email: "a@example.com", Metadata: map[string]string{"user_id": "u1"}})
	const n = 250
	for i := range n {
		status := "active"
		if i%10 == 0 {
			status = "canceled"
		}
		acct.PutSubscription(SubscriptionSpec{Customer: cus, Status: status, PriceID: "price_1",
			LatestInvoice: &InvoiceSpec{Status: "paid", AttemptCount: 1}})
	}
	sc := stripeclient.New(p.URL, "sk_test_123", slog.New(slog.DiscardHandler))

	params := &stripe.SubscriptionListParams{Status: stripe.String("all")}
	params.Limit = stripe.Int64(100)
	params.AddExpand("data.latest_invoice")
	params.AddExpand("data.customer")
	it := sc.Subscriptions.List(params)
	var ids []string
	for it.Next() {
		s := it.Subscription()
		ids = append(ids, s.ID)
		if s.LatestInvoice == nil || s.LatestInvoice.Status != stripe.InvoiceStatusPaid {
			t.Fatalf("%s: latest_invoice not expanded: %+v", s.ID, s.LatestInvoice)
		}
		if s.Customer == nil || s.Customer.Metadata["user_id"] != "u1" {
			t.Fatalf("%s: customer not expanded: %+v", s.ID, s.Customer)
		}
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	want := acct.SubscriptionIDs()
	if len(ids) != n || ids[0] != want[0] || ids[n-1] != want[n-1] {
		t.Fatalf("listed %d subscriptions (first %v), want %d in the account's order", len(ids), ids[:1], n)
	}
	if got := acct.Stats().Pages; got != 3 {
		t.Errorf("pages = %d, want 3", got)
	}

	// Without status=all, canceled subscriptions are left out.
	it = sc.Subscriptions.List(&stripe.SubscriptionListParams{})
	count := 0
	for it.Next() {
		count++
	}
	if count != n-n/10 {
		t.Errorf("default list = %d subscriptions, want %d", count, n-n/10)
	}
}

// Throttled requests answer 429 with Retry-After, then the account answers again.
func TestAccountThrottles(t *testing.T) {
	p, acct := newAccount(t)
	id := acct.PutSubscription(SubscriptionSpec{Customer: acct.AddCustomer(CustomerSpec{}), Status: "active"})
	acct.Throttle(1, 2*time.Second, false)
	sc := stripeclient.New(p.URL, "sk_test_123", slog.New(slog.DiscardHandler))

	_, err := sc.Subscriptions.Get(id, nil)
	var se *stripe.Error
	if !errors.As(err, &se) || se.HTTPStatusCode != http.StatusTooManyRequests || se.Code != "rate_limit" {
		t.Fatalf("first get: %v, want a 429 rate_limit", err)
	}
	if ra := se.LastResponse.Header.Get("Retry-After"); ra != "2" {
		t.Errorf("Retry-After = %q, want 2", ra)
	}
	got, err := sc.Subscriptions.Get(id, nil)
	if err != nil || got.ID != id {
		t.Fatalf("second get = %v, %v", got, err)
	}
	if s := acct.Stats(); s.Requests != 2 {
		t.Errorf("requests = %d, want 2", s.Requests)
	}
}

// Updates and cancels change what later reads answer.
func TestAccountUpdatesAndCancels(t *testing.T) {
	p, acct := newAccount(t)
	id := acct.PutSubscription(SubscriptionSpec{Customer: acct.AddCustomer(CustomerSpec{}), Status: "active", PriceID: "price_a"})
	sc := stripeclient.New(p.URL, "sk_test_123", slog.New(slog.DiscardHandler))

	params := &stripe.SubscriptionParams{CancelAtPeriodEnd: stripe.Bool(true)}
	if _, err := sc.Subscriptions.Update(id, params); err != nil {
		t.Fatal(err)
	}
	got, err := sc.Subscriptions.Get(id, nil)
	if err != nil || !got.CancelAtPeriodEnd || got.Items.Data[0].Price.ID != "price_a" {
		t.Fatalf("after update: %+v, %v", got, err)
	}
	if _, err := sc.Subscriptions.Cancel(id, nil); err != nil {
		t.Fatal(err)
	}
	got, err = sc.Subscriptions.Get(id, nil)
	if err != nil || got.Status != stripe.SubscriptionStatusCanceled || got.EndedAt == 0 {
		t.Fatalf("after cancel: %+v, %v", got, err)
	}
	acct.RemoveSubscription(id)
	if _, err := sc.Subscriptions.Get(id, nil); err == nil {
		t.Fatal("removed subscription still answered")
	}
}
