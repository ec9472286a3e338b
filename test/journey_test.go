package test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"billing/internal/stripeemu"
	"billing/internal/stripeevents"
	"billing/internal/testenv"
)

const (
	jnyUser      = "user_journey"
	jnySub       = "sub_journey1"
	jnyMonthly   = "price_monthly"
	jnyYearly    = "price_yearly"
	jnyReturnURL = "https://app.example.com/account"
	// jnyWait bounds every poll: it only ends a failing test, on a machine shared with others.
	jnyWait = 60 * time.Second
)

// One user's whole life through the real binary, as the app backend and Stripe see it: the
// customer, Checkout, the trial, its conversion, a failed renewal, a 3-D Secure retry, the
// payment, a plan change and the cancellation through the Customer Portal. The app's side goes
// through the REST API, Stripe's through signed webhooks; Stripe itself is stripe-mock behind the
// test double, whose account and Checkout sessions hold what the service reads back (the
// subscription the checkout job reads, the item a plan change names, the active entitlements
// behind a summary event). After every step the entitlement must say what the policy says of the
// state Stripe described: access, the seats bought, and the features granted (a feature gate).
func TestOneUsersWholeLife(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	db := openDB(t, url)
	proxy := stripeemu.New(t, testenv.StripeMockURL(t))
	acct := stripeemu.NewAccount(proxy, false)
	sessions := stripeemu.NewCheckoutSessions(proxy, false)
	env := relEnv(t, url)
	env["BILLING_STRIPE_API_URL"] = proxy.URL
	env["BILLING_PORTAL_RETURN_URL"] = jnyReturnURL
	j := &journey{
		t: t, svc: newService(t, "billing", env), proxy: proxy, acct: acct, db: db, started: time.Now(),
		// Redirects are the answer under test, not something to follow.
		client: &http.Client{Timeout: 30 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		}},
	}

	// Before anything, the app's user is unknown.
	if a := j.call(http.MethodGet, "/v1/customers/"+jnyUser+"/entitlement", nil); a.status != http.StatusNotFound {
		t.Fatalf("entitlement of a user never seen: %d %s, want 404", a.status, a.body)
	}

	// 1. The customer, then a Checkout session with a 14-day trial; the success page answers
	// while the session is still open.
	a := j.call(http.MethodPut, "/v1/customers/"+jnyUser, map[string]any{"email": "journey@example.com", "name": "Journey"})
	var link struct {
		UserID           string `json:"user_id"`
		StripeCustomerID string `json:"stripe_customer_id"`
	}
	a.decode(t, "PUT customer", http.StatusCreated, &link)
	if link.UserID != jnyUser || !strings.HasPrefix(link.StripeCustomerID, "cus_") {
		t.Fatalf("PUT customer: %s", a.body)
	}
	j.customer = link.StripeCustomerID
	j.expect("1. customer created", entitlementAnswer{Status: "none"})

	checkout := map[string]any{
		"request_id": "journey-1", "price_id": jnyMonthly, "quantity": 2, "trial_period_days": 14,
		"success_url": "https://app.example.com/welcome?session_id={CHECKOUT_SESSION_ID}",
		"cancel_url":  "https://app.example.com/pricing",
	}
	a = j.call(http.MethodPost, "/v1/customers/"+jnyUser+"/checkout-sessions", checkout)
	var cs struct {
		ID             string `json:"id"`
		URL            string `json:"url"`
		IdempotencyKey string `json:"idempotency_key"`
	}
	a.decode(t, "POST checkout-sessions", http.StatusCreated, &cs)
	creates := proxy.Filter(http.MethodPost, "/v1/checkout/sessions")
	if len(creates) != 1 {
		t.Fatalf("Stripe got %d Checkout session creates, want 1", len(creates))
	}
	made := sessions.Get(cs.ID)
	if made == nil || cs.URL == "" || cs.URL != made["url"] || cs.IdempotencyKey != creates[0].IdempotencyKey {
		t.Fatalf("POST checkout-sessions answered %s; Stripe made %v with key %q", a.body, made, creates[0].IdempotencyKey)
	}
	for k, v := range map[string]string{
		"mode": "subscription", "customer": j.customer, "client_reference_id": jnyUser,
		"line_items[0][price]": jnyMonthly, "line_items[0][quantity]": "2", "subscription_data[trial_period_days]": "14",
		"success_url": checkout["success_url"].(string), "cancel_url": checkout["cancel_url"].(string),
	} {
		if got := creates[0].Form.Get(k); got != v {
			t.Errorf("Checkout session create: %s = %q, want %q", k, got, v)
		}
	}
	j.successPage(cs.ID, "open", "", entitlementAnswer{Status: "none"})
	j.expect("1. checkout opened", entitlementAnswer{Status: "none"})

	// 2. The customer pays in Checkout: the session completes with a trialing subscription.
	start := j.tick()
	j.sub = map[string]any{
		"id": jnySub, "object": "subscription", "customer": j.customer, "status": "trialing", "livemode": false,
		"created": start.Unix(), "cancel_at_period_end": false, "cancel_at": nil, "canceled_at": nil, "ended_at": nil,
		"current_period_start": start.Unix(), "current_period_end": start.AddDate(0, 0, 14).Unix(),
		"trial_start": start.Unix(), "trial_end": start.AddDate(0, 0, 14).Unix(),
		"metadata": map[string]any{"user_id": jnyUser}, "latest_invoice": nil, "currency": "usd",
	}
	j.seats = 2
	j.setPrice(jnyMonthly)
	j.putSub(nil)
	completed := stripeevents.Event(j.nextEventID(), "checkout.session.completed", start, false, sessions.Complete(cs.ID, jnySub), nil)
	j.deliver(completed, j.subEvent("customer.subscription.created", nil))
	j.waitCheckoutRead()
	trialing := entitlementAnswer{Entitled: true, Status: "trialing", SubscriptionID: jnySub, PriceID: jnyMonthly}
	j.expect("2. checkout completed", trialing)
	j.expectSeatsAndFeatures("2. checkout completed", 2)
	j.successPage(cs.ID, "complete", jnySub, trialing)
	checkout["request_id"] = "journey-2"
	a = j.call(http.MethodPost, "/v1/customers/"+jnyUser+"/checkout-sessions", checkout)
	if a.status != http.StatusConflict || apiErrorCode(a.body) != "already_subscribed" {
		t.Fatalf("a second checkout while trialing: %d %s, want 409 already_subscribed", a.status, a.body)
	}
	if n := len(proxy.Filter(http.MethodPost, "/v1/checkout/sessions")); n != 1 {
		t.Errorf("the refused checkout reached Stripe: %d creates", n)
	}
	j.expect("2. second checkout refused", trialing)

	// 3. The trial ends and the first invoice is paid.
	at := j.tick()
	paid1 := j.invoice("in_journey1", "paid", 1, at, time.Time{})
	j.sub["status"], j.sub["trial_end"] = "active", at.Unix()
	j.sub["current_period_start"], j.sub["current_period_end"] = at.Unix(), at.AddDate(0, 1, 0).Unix()
	j.putSub(paid1)
	j.deliver(j.subEvent("customer.subscription.updated", map[string]any{"status": "trialing"}),
		j.invoiceEvent("invoice.payment_succeeded", paid1))
	active := entitlementAnswer{Entitled: true, Status: "active", SubscriptionID: jnySub, PriceID: jnyMonthly}
	j.expect("3. trial converted", active)
	j.expectInvoices("3. trial converted", "in_journey1:paid")
	j.usage("3. metered use", at, at.AddDate(0, 1, 0))

	// 3b. The plan's features: Stripe's summary carries the first 10 of 12 and says it has more;
	// the service reads every page and gates by all of them.
	features := make([]string, 12)
	for i := range features {
		features[i] = fmt.Sprintf("feature_%02d", i)
	}
	j.acct.SetActiveEntitlements(j.customer, features...)
	j.acct.SetEntitlementPageSize(5)
	j.deliver(stripeevents.Event(j.nextEventID(), "entitlements.active_entitlement_summary.updated", j.tick(), false,
		j.acct.ActiveEntitlementSummary(j.customer, 10), nil))
	j.expectSeatsAndFeatures("3b. features granted", 2, features...)
	j.expectFeature("3b. a feature past the event's page", "feature_11", true, "Allowed")
	j.expectFeature("3b. a feature of no plan", "enterprise_sso", false, "not among")
	if n := len(j.proxy.Filter(http.MethodGet, "/v1/entitlements/active_entitlements")); n != 3 {
		t.Errorf("3b. %d pages of active entitlements read, want 3", n)
	}

	// 4. The renewal's payment fails: Stripe retries, the subscription is past_due, and access
	// stays (policy.past_due_entitled, true by default) under a payment_failed hold.
	renewal := j.tick()
	failed2 := j.invoice("in_journey2", "open", 1, renewal, renewal.AddDate(0, 0, 3))
	j.putSub(failed2)
	j.deliver(j.invoiceEvent("invoice.payment_failed", failed2))
	at = j.tick()
	j.sub["status"] = "past_due"
	j.sub["current_period_start"], j.sub["current_period_end"] = at.Unix(), at.AddDate(0, 1, 0).Unix()
	j.putSub(failed2)
	j.deliver(j.subEvent("customer.subscription.updated", map[string]any{"status": "active"}))
	j.expect("4. renewal failed", entitlementAnswer{Entitled: true, Status: "past_due", OnHold: true, HoldReason: "payment_failed",
		SubscriptionID: jnySub, PriceID: jnyMonthly})
	// Access stays, the features wait for the payment.
	j.expectSeatsAndFeatures("4. renewal failed", 2)
	j.expectFeature("4. renewal failed", "feature_11", false, "on hold")

	// 5. Stripe's retry needs the customer to authenticate it (3-D Secure).
	action2 := j.invoice("in_journey2", "open", 2, renewal, time.Time{})
	j.putSub(action2)
	j.deliver(j.invoiceEvent("invoice.payment_action_required", action2))
	j.expect("5. authentication required", entitlementAnswer{Entitled: true, Status: "past_due", OnHold: true,
		HoldReason: "authentication_required", SubscriptionID: jnySub, PriceID: jnyMonthly})

	// 6. The customer authenticates and the invoice is paid: the hold is lifted.
	paid2 := j.invoice("in_journey2", "paid", 2, renewal, time.Time{})
	j.sub["status"] = "active"
	j.putSub(paid2)
	j.deliver(j.invoiceEvent("invoice.payment_succeeded", paid2), j.invoiceEvent("invoice.paid", paid2),
		j.subEvent("customer.subscription.updated", map[string]any{"status": "past_due"}))
	j.expect("6. invoice paid", active)
	j.expectInvoices("6. invoice paid", "in_journey2:paid", "in_journey1:paid")
	j.expectSeatsAndFeatures("6. invoice paid", 2, features...)
	j.expectFeature("6. invoice paid", "feature_11", true, "Allowed")

	// 7. A plan change goes through the portal's confirmation of the new price; Stripe's update
	// brings it back.
	item := j.sub["items"].(map[string]any)["data"].([]any)[0].(map[string]any)["id"].(string)
	j.portalRedirect("7. plan change", "/change", map[string]any{"price_id": jnyYearly}, map[string]string{
		"flow_data[type]": "subscription_update_confirm",
		"flow_data[subscription_update_confirm][subscription]":       jnySub,
		"flow_data[subscription_update_confirm][items][0][id]":       item,
		"flow_data[subscription_update_confirm][items][0][price]":    jnyYearly,
		"flow_data[subscription_update_confirm][items][0][quantity]": "2",
	})
	j.expect("7. portal opened for the change", active)
	at = j.tick()
	j.setPrice(jnyYearly)
	j.sub["current_period_start"], j.sub["current_period_end"] = at.Unix(), at.AddDate(1, 0, 0).Unix()
	j.putSub(paid2)
	j.deliver(j.subEvent("customer.subscription.updated", map[string]any{"plan": map[string]any{"id": jnyMonthly}}))
	yearly := active
	yearly.PriceID = jnyYearly
	j.expect("7. plan changed", yearly)
	j.expectSeatsAndFeatures("7. plan changed", 2, features...)

	// 7b. Three more seats, through the portal's confirmation of the same price with the new
	// quantity; Stripe's update brings them back.
	j.portalRedirect("7b. seats", "/change", map[string]any{"quantity": 5}, map[string]string{
		"flow_data[type]": "subscription_update_confirm",
		"flow_data[subscription_update_confirm][subscription]":       jnySub,
		"flow_data[subscription_update_confirm][items][0][id]":       item,
		"flow_data[subscription_update_confirm][items][0][price]":    jnyYearly,
		"flow_data[subscription_update_confirm][items][0][quantity]": "5",
	})
	j.expectSeatsAndFeatures("7b. portal opened for the seats", 2, features...)
	j.seats = 5
	j.setPrice(jnyYearly)
	j.putSub(paid2)
	j.deliver(j.subEvent("customer.subscription.updated", map[string]any{"quantity": 2}))
	j.expect("7b. seats changed", yearly)
	j.expectSeatsAndFeatures("7b. seats changed", 5, features...)

	// 8. The customer cancels in the portal; Stripe ends the subscription.
	j.portalRedirect("8. cancel", "/cancel", nil, map[string]string{
		"flow_data[type]": "subscription_cancel",
		"flow_data[subscription_cancel][subscription]": jnySub,
	})
	j.expect("8. portal opened for the cancellation", yearly)
	at = j.tick()
	j.sub["status"], j.sub["canceled_at"], j.sub["ended_at"] = "canceled", at.Unix(), at.Unix()
	j.putSub(paid2)
	j.deliver(j.subEvent("customer.subscription.deleted", nil))
	j.expect("8. canceled", entitlementAnswer{Status: "canceled", SubscriptionID: jnySub, PriceID: jnyYearly})
	j.expectSeatsAndFeatures("8. canceled", 5)
	j.expectFeature("8. canceled", "feature_00", false, "features follow access")
}

// journey is the state of one user's life: what Stripe holds and the last event's time.
type journey struct {
	t        *testing.T
	svc      *service
	client   *http.Client
	proxy    *stripeemu.Proxy
	acct     *stripeemu.Account
	db       *sql.DB
	customer string
	// sub is the subscription as Stripe holds it now (latest_invoice as an id, as events carry it).
	sub map[string]any
	// seats is the quantity of the subscription's item at Stripe.
	seats   int64
	created time.Time // of the last event
	events  int
	started time.Time
}

// tick is the created time of the next event: at least a second after the last one, so that
// no two events of the subscription tie, and never before now, so that no event is older than a
// read of Stripe the service made before it was sent.
func (j *journey) tick() time.Time {
	next := j.created.Add(time.Second)
	if now := time.Now().Truncate(time.Second); now.After(next) {
		next = now
	}
	j.created = next
	return next
}

func (j *journey) nextEventID() string {
	j.events++
	return fmt.Sprintf("evt_journey_%02d", j.events)
}

func (j *journey) setPrice(price string) {
	j.sub["items"] = map[string]any{"object": "list", "has_more": false, "data": []any{map[string]any{
		"id": "si_journey1", "object": "subscription_item", "quantity": j.seats, "subscription": jnySub,
		"price": map[string]any{"id": price, "object": "price", "currency": "usd", "active": true, "type": "recurring"},
	}}}
	j.sub["plan"] = map[string]any{"id": price, "object": "plan"}
}

// putSub makes Stripe hold the subscription as j.sub says, with latest as its latest invoice, before
// the events that tell of it are sent: whatever the service reads back is Stripe's truth.
func (j *journey) putSub(latest map[string]any) {
	j.t.Helper()
	obj := jnyClone(j.t, j.sub)
	if latest != nil {
		j.sub["latest_invoice"] = latest["id"]
		obj["latest_invoice"] = latest
	}
	b, err := json.Marshal(obj)
	if err != nil {
		j.t.Fatal(err)
	}
	j.acct.PutSubscriptionJSON(b)
}

func (j *journey) subEvent(typ string, previous map[string]any) []byte {
	return stripeevents.Event(j.nextEventID(), typ, j.tick(), false, jnyClone(j.t, j.sub), previous)
}

func (j *journey) invoiceEvent(typ string, inv map[string]any) []byte {
	return stripeevents.Event(j.nextEventID(), typ, j.tick(), false, inv, nil)
}

// invoice is a renewal invoice of the subscription for 20 USD.
func (j *journey) invoice(id, status string, attempts int64, created, nextAttempt time.Time) map[string]any {
	var paid int64
	if status == "paid" {
		paid = 2000
	}
	var next any
	if !nextAttempt.IsZero() {
		next = nextAttempt.Unix()
	}
	return map[string]any{
		"id": id, "object": "invoice", "customer": j.customer, "customer_email": "journey@example.com",
		"subscription": jnySub, "status": status, "billing_reason": "subscription_cycle", "livemode": false,
		"attempt_count": attempts, "attempted": attempts > 0, "next_payment_attempt": next,
		"amount_due": int64(2000), "amount_paid": paid, "currency": "usd", "paid": status == "paid",
		"created": created.Unix(), "period_start": created.Unix(), "period_end": created.AddDate(0, 1, 0).Unix(),
		"hosted_invoice_url": "https://invoice.stripe.com/i/acct_test/" + id,
	}
}

// deliver posts each event as Stripe does and waits until the service has applied all of them.
func (j *journey) deliver(events ...[]byte) {
	j.t.Helper()
	var ids []string
	for _, body := range events {
		var ev struct {
			ID, Type string
		}
		if err := json.Unmarshal(body, &ev); err != nil {
			j.t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		code, status, err := postEvent(ctx, j.client, j.svc.url(""), body)
		cancel()
		if err != nil || code != http.StatusOK || status != "received" {
			j.t.Fatalf("deliver %s %s: %d %q %v, want 200 received", ev.Type, ev.ID, code, status, err)
		}
		ids = append(ids, ev.ID)
	}
	for _, id := range ids {
		var last string
		if !waitUntil(jnyWait, func() bool {
			a := j.callAs(relAdminToken, http.MethodGet, "/admin/events/"+id, nil)
			var ev struct {
				Status     string `json:"status"`
				APIVersion string `json:"api_version"`
			}
			_ = json.Unmarshal(a.body, &ev)
			last = fmt.Sprintf("%d %s", a.status, a.body)
			if ev.Status == "failed" || (ev.Status != "" && ev.APIVersion != stripeevents.APIVersion) {
				j.t.Fatalf("event %s: %s, want processed, API version %s", id, tail(last, 2000), stripeevents.APIVersion)
			}
			return a.status == http.StatusOK && ev.Status == "processed"
		}) {
			j.t.Fatalf("event %s not processed after %s: %s", id, jnyWait, tail(last, 2000))
		}
	}
}

// waitCheckoutRead waits until the job that reads the completed session's subscription from
// Stripe has applied it (River's row of the job, completed), so that no read of Stripe is left
// to race the next steps, and checks that it read the subscription Stripe holds.
func (j *journey) waitCheckoutRead() {
	j.t.Helper()
	var total, completed, final int
	var states string
	if !waitUntil(jnyWait, func() bool {
		err := j.db.QueryRow(`SELECT count(*), count(*) FILTER (WHERE state = 'completed'),
			count(*) FILTER (WHERE state IN ('completed', 'cancelled', 'discarded')),
			coalesce(string_agg(state::text, ',' ORDER BY id), '')
			FROM river_job WHERE kind = 'checkout_subscription_sync'`).Scan(&total, &completed, &final, &states)
		return err == nil && total > 0 && final == total
	}) {
		j.t.Fatalf("the checkout's read of the subscription did not end: jobs %q", states)
	}
	if completed != total {
		j.t.Fatalf("checkout read jobs %q, want every one completed", states)
	}
	reads := 0
	for _, r := range j.proxy.Filter(http.MethodGet, "/v1/subscriptions/"+jnySub) {
		if r.Status == http.StatusOK {
			reads++
		}
	}
	if reads == 0 {
		j.t.Fatalf("the completed checkout never read %s from Stripe", jnySub)
	}
}

// entitlementAnswer is the part of a GET /v1/customers/{user_id}/entitlement answer that the
// tests compare ("" for null).
type entitlementAnswer struct {
	Entitled       bool
	Status         string
	OnHold         bool
	HoldReason     string
	SubscriptionID string
	PriceID        string
}

// entitlementOf decodes an entitlement answer.
func entitlementOf(raw []byte) (entitlementAnswer, error) {
	var e struct {
		Entitled       bool    `json:"entitled"`
		Status         string  `json:"status"`
		OnHold         bool    `json:"on_hold"`
		HoldReason     *string `json:"hold_reason"`
		SubscriptionID *string `json:"subscription_id"`
		PriceID        *string `json:"price_id"`
	}
	if err := json.Unmarshal(raw, &e); err != nil {
		return entitlementAnswer{}, err
	}
	s := func(p *string) string {
		if p == nil {
			return ""
		}
		return *p
	}
	return entitlementAnswer{Entitled: e.Entitled, Status: e.Status, OnHold: e.OnHold, HoldReason: s(e.HoldReason),
		SubscriptionID: s(e.SubscriptionID), PriceID: s(e.PriceID)}, nil
}

// expect polls the entitlement until it is want.
func (j *journey) expect(step string, want entitlementAnswer) {
	j.t.Helper()
	var last string
	if !waitUntil(jnyWait, func() bool {
		a := j.call(http.MethodGet, "/v1/customers/"+jnyUser+"/entitlement", nil)
		last = fmt.Sprintf("%d %s", a.status, a.body)
		got, err := entitlementOf(a.body)
		return a.status == http.StatusOK && err == nil && got == want
	}) {
		j.t.Fatalf("%s: entitlement %s\nwant %+v", step, last, want)
	}
	j.t.Logf("%s (at %s): %+v", step, time.Since(j.started).Round(time.Millisecond), want)
}

// expectSeatsAndFeatures polls the entitlement until its quantity and features are these.
func (j *journey) expectSeatsAndFeatures(step string, seats int64, features ...string) {
	j.t.Helper()
	if features == nil {
		features = []string{}
	}
	var last string
	if !waitUntil(jnyWait, func() bool {
		a := j.call(http.MethodGet, "/v1/customers/"+jnyUser+"/entitlement", nil)
		last = fmt.Sprintf("%d %s", a.status, a.body)
		var e struct {
			Quantity *int64   `json:"quantity"`
			Features []string `json:"features"`
		}
		return a.status == http.StatusOK && json.Unmarshal(a.body, &e) == nil && e.Quantity != nil && *e.Quantity == seats &&
			e.Features != nil && strings.Join(e.Features, ",") == strings.Join(features, ",")
	}) {
		j.t.Fatalf("%s: entitlement %s\nwant quantity %d, features %v", step, last, seats, features)
	}
}

// expectFeature checks the feature gate's answer, and that its reason says why.
func (j *journey) expectFeature(step, feature string, allowed bool, reason string) {
	j.t.Helper()
	a := j.call(http.MethodGet, "/v1/customers/"+jnyUser+"/features/"+feature, nil)
	var got struct {
		UserID  string `json:"user_id"`
		Feature string `json:"feature"`
		Allowed bool   `json:"allowed"`
		Reason  string `json:"reason"`
	}
	a.decode(j.t, step+": feature "+feature, http.StatusOK, &got)
	if got.UserID != jnyUser || got.Feature != feature || got.Allowed != allowed || !strings.Contains(got.Reason, reason) {
		j.t.Fatalf("%s: feature %s: %s, want allowed %v with a reason saying %q", step, feature, a.body, allowed, reason)
	}
}

// successPage checks GET /v1/checkout-sessions/{id}: the session's status and subscription and
// the user's entitlement.
func (j *journey) successPage(id, status, subscription string, want entitlementAnswer) {
	j.t.Helper()
	a := j.call(http.MethodGet, "/v1/checkout-sessions/"+id, nil)
	var page struct {
		ID             string          `json:"id"`
		Status         *string         `json:"status"`
		UserID         *string         `json:"user_id"`
		SubscriptionID *string         `json:"subscription_id"`
		Entitlement    json.RawMessage `json:"entitlement"`
	}
	a.decode(j.t, "success page", http.StatusOK, &page)
	got, err := entitlementOf(page.Entitlement)
	if err != nil || page.ID != id || page.Status == nil || *page.Status != status || page.UserID == nil ||
		*page.UserID != jnyUser || (subscription == "") != (page.SubscriptionID == nil) ||
		(page.SubscriptionID != nil && *page.SubscriptionID != subscription) || got != want {
		j.t.Fatalf("success page: %s\nwant status %s, subscription %q, entitlement %+v", a.body, status, subscription, want)
	}
}

// expectInvoices checks the user's invoices, newest first, as "id:status".
func (j *journey) expectInvoices(step string, want ...string) {
	j.t.Helper()
	a := j.call(http.MethodGet, "/v1/customers/"+jnyUser+"/invoices", nil)
	var page struct {
		Invoices []struct {
			InvoiceID      string `json:"invoice_id"`
			Status         string `json:"status"`
			AmountPaid     int64  `json:"amount_paid"`
			SubscriptionID string `json:"subscription_id"`
		} `json:"invoices"`
		HasMore bool `json:"has_more"`
	}
	a.decode(j.t, step+": invoices", http.StatusOK, &page)
	var got []string
	for _, inv := range page.Invoices {
		got = append(got, inv.InvoiceID+":"+inv.Status)
		if inv.SubscriptionID != jnySub || (inv.Status == "paid" && inv.AmountPaid != 2000) {
			j.t.Errorf("%s: invoice %s", step, a.body)
		}
	}
	if strings.Join(got, " ") != strings.Join(want, " ") || page.HasMore {
		j.t.Fatalf("%s: invoices %v (has_more %v), want %v", step, got, page.HasMore, want)
	}
}

// portalRedirect posts a portal route of the subscription and checks the 303 to the portal
// session Stripe opened with the flow.
func (j *journey) portalRedirect(step, route string, body any, flow map[string]string) {
	j.t.Helper()
	before := len(j.proxy.Filter(http.MethodPost, "/v1/billing_portal/sessions"))
	a := j.call(http.MethodPost, "/v1/customers/"+jnyUser+"/subscriptions/"+jnySub+route, body)
	if a.status != http.StatusSeeOther {
		j.t.Fatalf("%s: %d %s, want 303", step, a.status, a.body)
	}
	reqs := j.proxy.Filter(http.MethodPost, "/v1/billing_portal/sessions")
	if len(reqs) != before+1 {
		j.t.Fatalf("%s: %d portal sessions opened, want 1", step, len(reqs)-before)
	}
	opened := j.proxy.Objects("/v1/billing_portal/sessions")
	url, _ := opened[len(opened)-1]["url"].(string)
	if loc := a.header.Get("Location"); url == "" || loc != url {
		j.t.Fatalf("%s: Location %q, want the portal session's URL %q", step, loc, url)
	}
	flow["customer"] = j.customer
	flow["return_url"] = jnyReturnURL
	for k, v := range flow {
		if got := reqs[len(reqs)-1].Form.Get(k); got != v {
			j.t.Errorf("%s: portal session %s = %q, want %q", step, k, got, v)
		}
	}
}

type jnyAnswer struct {
	status int
	header http.Header
	body   []byte
}

func (a jnyAnswer) decode(t *testing.T, what string, status int, v any) {
	t.Helper()
	if a.status != status {
		t.Fatalf("%s: %d %s, want %d", what, a.status, a.body, status)
	}
	if err := json.Unmarshal(a.body, v); err != nil {
		t.Fatalf("%s: %v: %s", what, err, a.body)
	}
}

// call is the app backend calling the API with its token.
func (j *journey) call(method, path string, body any) jnyAnswer {
	j.t.Helper()
	return j.callAs(relAPIToken, method, path, body)
}

func (j *journey) callAs(token, method, path string, body any) jnyAnswer {
	j.t.Helper()
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			j.t.Fatal(err)
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, j.svc.url(path), r)
	if err != nil {
		j.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := j.client.Do(req)
	if err != nil {
		j.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		j.t.Fatalf("%s %s: %v", method, path, err)
	}
	return jnyAnswer{status: resp.StatusCode, header: resp.Header, body: b}
}

// jnyClone is a deep copy of a JSON object, so that an event keeps what it said when it was made.
func jnyClone(t *testing.T, m map[string]any) map[string]any {
	t.Helper()
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}
