package entitlements

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stripe/stripe-go/v79"

	"billing/billing"
	"billing/notices"
	"billing/webhooks"
)

// invoiceRow is everything stored about an invoice, for before/after checks ("[]" when none).
func (e *env) invoiceRow(t *testing.T, id string) string {
	t.Helper()
	return e.invoiceRowIn(t, id, false)
}

// invoiceRowIn is invoiceRow of the given world.
func (e *env) invoiceRowIn(t *testing.T, id string, live bool) string {
	t.Helper()
	var row []map[string]any
	if err := e.db.Raw(`SELECT to_jsonb(i) - 'updated_at' AS r FROM invoices i WHERE invoice_id = $1 AND livemode = $2`, id, live).Scan(&row).Error; err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(row)
	return string(b)
}

// Every type billing registers is spelled as stripe-go v79 spells it.
func TestHandledTypesAreStripeGoEventTypes(t *testing.T) {
	t.Parallel()
	known := map[string]stripe.EventType{
		billing.EventSubscriptionCreated:          stripe.EventTypeCustomerSubscriptionCreated,
		billing.EventSubscriptionUpdated:          stripe.EventTypeCustomerSubscriptionUpdated,
		billing.EventSubscriptionDeleted:          stripe.EventTypeCustomerSubscriptionDeleted,
		billing.EventSubscriptionTrialWillEnd:     stripe.EventTypeCustomerSubscriptionTrialWillEnd,
		billing.EventSubscriptionPaused:           stripe.EventTypeCustomerSubscriptionPaused,
		billing.EventSubscriptionResumed:          stripe.EventTypeCustomerSubscriptionResumed,
		billing.EventInvoicePaymentFailed:         stripe.EventTypeInvoicePaymentFailed,
		billing.EventInvoicePaymentSucceeded:      stripe.EventTypeInvoicePaymentSucceeded,
		billing.EventInvoicePaid:                  stripe.EventTypeInvoicePaid,
		billing.EventInvoicePaymentActionRequired: stripe.EventTypeInvoicePaymentActionRequired,
		billing.EventInvoiceVoided:                stripe.EventTypeInvoiceVoided,
		billing.EventInvoiceFinalized:             stripe.EventTypeInvoiceFinalized,
		billing.EventInvoiceUpdated:               stripe.EventTypeInvoiceUpdated,
		billing.EventInvoiceMarkedUncollectible:   stripe.EventTypeInvoiceMarkedUncollectible,
		EventEntitlementSummaryUpdated:            stripe.EventTypeEntitlementsActiveEntitlementSummaryUpdated,
	}
	for _, typ := range newRegistryTypes(t) {
		if st, ok := known[typ]; !ok || string(st) != typ {
			t.Errorf("%s: not checked against stripe-go, or spelled differently (%q)", typ, st)
		}
	}
}

// invoice.paid (also paid out of band) lifts the hold like payment_succeeded, with the same
// guard: not when it pays an invoice older than the held one.
func TestInvoicePaidLiftsTheHold(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	held := invObj{ID: "in_2", Customer: "cus_1", Subscription: "sub_1", AttemptCount: 1, Created: 200}
	e.mustHandle(t, created("c1", 1, s1), failed("f2", 250, held),
		invEv("paid_old", billing.EventInvoicePaid, 300, invObj{ID: "in_1", Customer: "cus_1", Subscription: "sub_1", Created: 100, Status: "paid"}))
	if _, ok := e.holds(t)["sub_1"]; !ok {
		t.Fatal("paying an older invoice lifted the hold")
	}
	e.mustHandle(t, invEv("paid_2", billing.EventInvoicePaid, 260, held))
	if h, ok := e.holds(t)["sub_1"]; ok {
		t.Errorf("invoice.paid of the held invoice left the hold: %+v", h)
	}
	// A payment_succeeded in the same second as a failure wins the tie, and so does invoice.paid.
	e.mustHandle(t, failed("f3", 400, held), invEv("paid_3", billing.EventInvoicePaid, 400, held))
	if _, ok := e.holds(t)["sub_1"]; ok {
		t.Error("invoice.paid lost the tie with a failure of the same second")
	}
}

// invoice.voided lifts the hold of that invoice: nothing is owed any more.
func TestInvoiceVoidedLiftsItsHold(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	inv := invObj{ID: "in_1", Customer: "cus_1", Subscription: "sub_1", AttemptCount: 1, Created: 100}
	e.mustHandle(t, created("c1", 1, s1), failed("f1", 150, inv))
	inv.Status = "void"
	e.mustHandle(t, invEv("v1", billing.EventInvoiceVoided, 200, inv))
	if h, ok := e.holds(t)["sub_1"]; ok {
		t.Errorf("voided invoice still held: %+v", h)
	}
}

// invoice.payment_action_required: a hold with the reason authentication_required, and a notice
// carrying the invoice's page where the customer confirms the payment.
func TestPaymentActionRequiredHoldsAndNotifies(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.link(t, "u1", "cus_1", "u1@example.com")
	inv := invObj{ID: "in_1", Customer: "cus_1", Subscription: "sub_1", AttemptCount: 1, AmountDue: 1500, Currency: "eur",
		URL: "https://invoice.stripe.com/i/in_1", Created: 100, BillingReason: "subscription_cycle"}
	ev := invEv("ar1", billing.EventInvoicePaymentActionRequired, 150, inv)
	e.mustHandle(t, created("c1", 1, s1), ev, ev)

	h, ok := e.holds(t)["sub_1"]
	if !ok || h.HoldReason != billing.HoldAuthenticationRequired || ptrStr(h.HostedInvoiceURL) != inv.URL || ptrTime(h.OnHoldSince) != ptrTime(ptr(at(150))) {
		t.Fatalf("hold: %+v (listed %v)", h, ok)
	}
	ent := e.customerView(t, "u1").Entitlement
	if !ent.OnHold || ptrStr(ent.HoldReason) != billing.HoldAuthenticationRequired || !ent.Entitled {
		t.Errorf("entitlement: %+v (reason %s)", ent, ptrStr(ent.HoldReason))
	}
	if rows, due := e.noticeCount(t, "ar1", notices.KindPaymentActionRequired); rows != 1 || due != 1 {
		t.Fatalf("notices %d, queued %d; want 1 and 1", rows, due)
	}
	if a := e.noticeContent(t, "ar1", notices.KindPaymentActionRequired); a.HostedInvoiceURL != inv.URL || a.InvoiceID != "in_1" ||
		ptrInt(a.AmountDue) != "1500" || a.Currency != "eur" {
		t.Errorf("job args: %+v", a)
	}
	// Within one second, the action-required word wins over a plain failure of the attempt.
	e.mustHandle(t, failed("f1", 150, inv))
	if h := e.holds(t)["sub_1"]; h.HoldReason != billing.HoldAuthenticationRequired {
		t.Errorf("reason after a failure of the same second: %s", h.HoldReason)
	}
	// Confirmed: paid, the hold is lifted.
	e.mustHandle(t, succeeded("p1", 200, inv))
	if h, ok := e.holds(t)["sub_1"]; ok {
		t.Errorf("still held after the payment: %+v", h)
	}
}

// Checkout's own first invoice needing authentication is the payment page's business: no hold,
// no mail.
func TestPaymentActionRequiredOfANeverStartedSubscription(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.link(t, "u1", "cus_1", "u1@example.com")
	inv := invObj{ID: "in_1", Customer: "cus_1", Subscription: "sub_1", AttemptCount: 1, Created: 1, BillingReason: "subscription_create"}
	e.mustHandle(t, created("c1", 1, s1.With(billing.StatusIncomplete)), invEv("ar1", billing.EventInvoicePaymentActionRequired, 2, inv))
	if rows, _ := e.totalNotices(t); rows != 0 {
		t.Errorf("%d notices, want none", rows)
	}
	if h, ok := e.holds(t)["sub_1"]; ok {
		t.Errorf("listed as a hold: %+v", h)
	}
}

// customer.subscription.paused / resumed carry the subscription with its new status, ordered
// like every subscription event.
func TestSubscriptionPausedAndResumed(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.link(t, "u1", "cus_1", "")
	paused := subEv("pa1", billing.EventSubscriptionPaused, 100, s1.With(billing.StatusPaused))
	resumed := subEv("re1", billing.EventSubscriptionResumed, 200, s1.With(billing.StatusActive))
	e.mustHandle(t, created("c1", 1, s1), paused)
	if ent := e.customerView(t, "u1").Entitlement; ent.Entitled || ent.Status != billing.StatusPaused {
		t.Errorf("paused: %+v", ent)
	}
	e.mustHandle(t, resumed, paused) // the pause delivered again, late
	if ent := e.customerView(t, "u1").Entitlement; !ent.Entitled || ent.Status != billing.StatusActive {
		t.Errorf("resumed: %+v", ent)
	}
	if got := e.sub(t, "sub_1"); ptrStr(got.SubEventID) != "re1" || ptrTime(got.StatusSince) != ptrTime(ptr(at(200))) {
		t.Errorf("event %s since %s", ptrStr(got.SubEventID), ptrTime(got.StatusSince))
	}
}

// withPause adds pause_collection to a subscription event's object.
func withPause(ev webhooks.Event, behavior string, resumesAt int64) webhooks.Event {
	var obj map[string]any
	if err := json.Unmarshal(ev.Object, &obj); err != nil {
		panic(err)
	}
	pc := map[string]any{"behavior": behavior, "resumes_at": nil}
	if resumesAt != 0 {
		pc["resumes_at"] = base + resumesAt
	}
	obj["pause_collection"] = pc
	b, _ := json.Marshal(obj)
	return event(ev.ID, ev.Type, ev.Created.Unix()-base, b)
}

// pause_collection keeps the status; whether it keeps access is policy.paused_collection_entitled.
func TestPausedCollectionFollowsThePolicy(t *testing.T) {
	t.Parallel()
	for _, entitled := range []bool{true, false} {
		t.Run(fmt.Sprint("entitled=", entitled), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, func(d *Deps, _ *billing.Deps) { d.Policy.PausedCollectionEntitled = entitled })
			e.link(t, "u1", "cus_1", "")
			e.mustHandle(t, created("c1", 1, s1), withPause(updated("u1", 10, s1), "void", 5*86400))
			cv := e.customerView(t, "u1")
			if cv.Entitlement.Entitled != entitled || cv.Entitlement.Status != billing.StatusActive || !cv.Subscriptions[0].CollectionPaused {
				t.Errorf("paused collection: %+v, collection_paused %v", cv.Entitlement, cv.Subscriptions[0].CollectionPaused)
			}
			// The pause ends by itself at resumes_at.
			e.clock.Set(at(5 * 86400))
			if cv := e.customerView(t, "u1"); !cv.Entitlement.Entitled || cv.Subscriptions[0].CollectionPaused {
				t.Errorf("after resumes_at: %+v", cv.Entitlement)
			}
			// Or by an update without it; an older update with it does not bring it back.
			e.clock.Set(at(0))
			e.mustHandle(t, updated("u2", 20, s1), withPause(updated("u0", 5, s1), "keep_as_draft", 0))
			if cv := e.customerView(t, "u1"); !cv.Entitlement.Entitled || cv.Subscriptions[0].CollectionPaused {
				t.Errorf("after the pause was lifted: %+v", cv.Entitlement)
			}
		})
	}
}

// listInvoices answers GET /v1/customers/{user_id}/invoices with query.
func (e *env) listInvoices(t *testing.T, userID, query string) (int, billing.InvoicePage) {
	t.Helper()
	var page billing.InvoicePage
	code, body := e.get(t, "/v1/customers/"+userID+"/invoices"+query, &page)
	if code == http.StatusOK && page.Invoices == nil {
		t.Fatalf("invoices is null: %s", body)
	}
	return code, page
}

func invoiceIDs(p billing.InvoicePage) string {
	var ids []string
	for _, i := range p.Invoices {
		ids = append(ids, i.InvoiceID)
	}
	return fmt.Sprint(ids, " has_more=", p.HasMore)
}

// The invoices of the invoice.* events are kept and listed newest first, a page at a time.
func TestInvoicesAreKeptAndListed(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.link(t, "u1", "cus_1", "")
	inv := func(id string, created int64, status string) invObj {
		return invObj{ID: id, Customer: "cus_1", Subscription: "sub_1", Created: created, Status: status, Number: "N-" + id,
			AmountDue: 1000, AmountPaid: 1000, Currency: "usd", PeriodStart: created, PeriodEnd: created + 30*86400,
			URL: "https://invoice.stripe.com/i/" + id, PDF: "https://pay.stripe.com/invoice/" + id + "/pdf"}
	}
	e.mustHandle(t, created("c1", 1, s1),
		succeeded("p1", 10, inv("in_1", 10, "paid")),
		invEv("pd2", billing.EventInvoicePaid, 20, inv("in_2", 20, "paid")),
		// Two in one second: the id breaks the tie.
		invEv("fz3", billing.EventInvoiceFinalized, 30, inv("in_3a", 30, "open")),
		invEv("fz4", billing.EventInvoiceFinalized, 30, inv("in_3b", 30, "open")),
		invEv("up5", billing.EventInvoiceUpdated, 40, inv("in_draft", 40, "draft")),
		// A one-off invoice of the customer is theirs too.
		invEv("pd6", billing.EventInvoicePaid, 50, invObj{ID: "in_oneoff", Customer: "cus_1", Created: 50, Status: "paid", AmountDue: 300, Currency: "usd"}),
		// Another customer's.
		invEv("pd7", billing.EventInvoicePaid, 60, invObj{ID: "in_other", Customer: "cus_2", Created: 60, Status: "paid"}),
	)
	code, page := e.listInvoices(t, "u1", "")
	if code != http.StatusOK || invoiceIDs(page) != "[in_oneoff in_3b in_3a in_2 in_1] has_more=false" {
		t.Fatalf("list: %d %s", code, invoiceIDs(page))
	}
	got := page.Invoices[4]
	want := inv("in_1", 10, "paid")
	if ptrStr(got.Number) != want.Number || ptrStr(got.Status) != "paid" || ptrInt(got.AmountDue) != "1000" || ptrInt(got.AmountPaid) != "1000" ||
		ptrStr(got.Currency) != "usd" || ptrTime(got.PeriodStart) != ptrTime(ptr(at(10))) || ptrTime(got.PeriodEnd) != ptrTime(ptr(at(10+30*86400))) ||
		ptrStr(got.HostedInvoiceURL) != want.URL || ptrStr(got.InvoicePDF) != want.PDF || !got.Created.Equal(at(10)) {
		t.Errorf("entry: %+v", got)
	}
	_, body := e.get(t, "/v1/customers/u1/invoices?limit=1", nil)
	var raw map[string]any
	if err := json.Unmarshal(body, &raw); err != nil {
		t.Fatal(err)
	}
	entry := raw["invoices"].([]any)[0].(map[string]any)
	for _, field := range []string{"invoice_id", "number", "status", "amount_due", "amount_paid", "currency", "period_start",
		"period_end", "hosted_invoice_url", "invoice_pdf", "created"} {
		if _, ok := entry[field]; !ok {
			t.Errorf("field %s missing: %s", field, body)
		}
	}
	if _, ok := raw["has_more"]; !ok {
		t.Errorf("has_more missing: %s", body)
	}

	// Keyset pages of two.
	var pages []string
	after := ""
	for range 5 {
		q := "?limit=2"
		if after != "" {
			q += "&starting_after=" + after
		}
		code, p := e.listInvoices(t, "u1", q)
		if code != http.StatusOK {
			t.Fatalf("page after %q: %d", after, code)
		}
		pages = append(pages, invoiceIDs(p))
		if !p.HasMore {
			break
		}
		after = p.Invoices[len(p.Invoices)-1].InvoiceID
	}
	if fmt.Sprint(pages) != "[[in_oneoff in_3b] has_more=true [in_3a in_2] has_more=true [in_1] has_more=false]" {
		t.Errorf("pages: %v", pages)
	}

	// An invoice inserted between two reads does not shift the next page.
	e.mustHandle(t, invEv("fz8", billing.EventInvoiceFinalized, 70, inv("in_new", 70, "open")))
	if _, p := e.listInvoices(t, "u1", "?limit=2&starting_after=in_3b"); invoiceIDs(p) != "[in_3a in_2] has_more=true" {
		t.Errorf("page after in_3b: %s", invoiceIDs(p))
	}

	for _, q := range []string{"?limit=0", "?limit=101", "?limit=x", "?starting_after=in_other", "?starting_after=in_missing", "?starting_after=a%20b"} {
		if code, body := e.get(t, "/v1/customers/u1/invoices"+q, nil); code != http.StatusBadRequest {
			t.Errorf("%s: %d %s, want 400", q, code, body)
		}
	}
	if code, _ := e.get(t, "/v1/customers/u_unknown/invoices", nil); code != http.StatusNotFound {
		t.Errorf("unknown user: %d, want 404", code)
	}
	if code, _ := e.get(t, "/v1/customers/bad%20id/invoices", nil); code != http.StatusBadRequest {
		t.Errorf("bad user id: %d, want 400", code)
	}
}

// An invoice's row keeps the newest event's snapshot, and paid or void is never undone.
func TestInvoiceRowIsOrdered(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	open := invObj{ID: "in_1", Customer: "cus_1", Created: 10, Status: "open", AmountDue: 500, AmountPaid: 0}
	paid := open
	paid.Status, paid.AmountPaid = "paid", 500
	e.mustHandle(t, invEv("pd", billing.EventInvoicePaid, 30, paid), invEv("fz", billing.EventInvoiceFinalized, 20, open))
	row := e.invoiceRow(t, "in_1")
	// A newer event that still says open (a stale read by Stripe's own clock) cannot undo paid.
	e.mustHandle(t, invEv("up", billing.EventInvoiceUpdated, 40, open))
	if after := e.invoiceRow(t, "in_1"); after != row {
		t.Errorf("paid invoice changed:\nbefore %s\nafter  %s", row, after)
	}
	var status string
	e.db.Raw(`SELECT status FROM invoices WHERE invoice_id = 'in_1'`).Scan(&status)
	if status != "paid" {
		t.Errorf("status %q, want paid", status)
	}
	// Within one second the later lifecycle stage wins, whatever the delivery order.
	e.mustHandle(t, invEv("b1", billing.EventInvoiceFinalized, 50, invObj{ID: "in_2", Customer: "cus_1", Created: 50, Status: "open"}),
		invEv("b0", billing.EventInvoiceMarkedUncollectible, 50, invObj{ID: "in_2", Customer: "cus_1", Created: 50, Status: "uncollectible"}),
		invEv("b2", billing.EventInvoiceUpdated, 50, invObj{ID: "in_2", Customer: "cus_1", Created: 50, Status: "open"}))
	e.db.Raw(`SELECT status FROM invoices WHERE invoice_id = 'in_2'`).Scan(&status)
	if status != "uncollectible" {
		t.Errorf("status %q, want uncollectible", status)
	}
}

// The list shows only invoices of the customer's own mode, and an invoice event of the other mode
// naming a linked customer, or this world's invoice id, is kept in the other world only.
func TestInvoicesOfTheOtherMode(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.link(t, "u1", "cus_1", "")
	e.mustHandle(t, invEv("own", billing.EventInvoicePaid, 10, invObj{ID: "in_own", Customer: "cus_1", Created: 10, Status: "paid"}))
	if err := e.db.Exec(`INSERT INTO invoices (invoice_id, livemode, stripe_customer_id, status, created) VALUES ('in_live', true, 'cus_1', 'paid', now())`).Error; err != nil {
		t.Fatal(err)
	}
	if _, p := e.listInvoices(t, "u1", ""); invoiceIDs(p) != "[in_own] has_more=false" {
		t.Errorf("list: %s", invoiceIDs(p))
	}
	if code, _ := e.get(t, "/v1/customers/u1/invoices?starting_after=in_live", nil); code != http.StatusBadRequest {
		t.Errorf("paging after the other mode's invoice: %d, want 400", code)
	}
	// A live one-off invoice naming the test customer, and a live event about a test invoice.
	before := e.invoiceRow(t, "in_own")
	e.mustHandle(t, inMode(invEv("x1", billing.EventInvoicePaid, 20, invObj{ID: "in_x", Customer: "cus_1", Created: 20, Status: "paid"}), true),
		inMode(invEv("x2", billing.EventInvoiceVoided, 30, invObj{ID: "in_own", Customer: "cus_9", Created: 10, Status: "void"}), true))
	if after := e.invoiceRow(t, "in_own"); after != before {
		t.Errorf("invoice changed:\nbefore %s\nafter  %s", before, after)
	}
	if got := e.invoiceRow(t, "in_x"); got != "null" && got != "[]" {
		t.Errorf("the other mode's invoice is in this world: %s", got)
	}
	if got := e.invoiceRowIn(t, "in_own", true); !strings.Contains(got, `\"status\": \"void\"`) {
		t.Errorf("the other mode's voided invoice is not in its own world: %s", got)
	}
	if _, p := e.listInvoices(t, "u1", ""); invoiceIDs(p) != "[in_own] has_more=false" {
		t.Errorf("list after the other mode's events: %s", invoiceIDs(p))
	}
}
