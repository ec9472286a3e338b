package checkout

import (
	"net/http"
	"slices"
	"testing"
	"time"

	"billing/internal/stripeemu"
	"billing/internal/stripeevents"
	"billing/webhooks"
)

// openAndPay opens a session through the API for u1 (linked to cus_u1) and pays it at Stripe
// with subscription sub_1, which Stripe then holds as active. It returns the session object.
func openAndPay(t *testing.T, v *env) map[string]any {
	t.Helper()
	v.link("u1", "cus_u1", false)
	id := v.open("u1", body("r1"))["id"].(string)
	v.putSubscription(activeSub("sub_1", "cus_u1"))
	return v.sessions.Complete(id, "sub_1")
}

// checkout.session.completed first: the job reads the subscription from Stripe and the user is
// entitled with no subscription event at all; the older customer.subscription.created that comes
// late does not undo it.
func TestCompletedBeforeTheSubscriptionEvents(t *testing.T) {
	t.Parallel()
	v := defaultEnv(t)
	session := openAndPay(t, v)
	id := session["id"].(string)
	if e := v.entitlement("u1"); e.Entitled {
		t.Fatalf("entitled before paying: %+v", e)
	}

	v.deliver(sessionEvent("evt_c1", EventSessionCompleted, time.Now(), session))
	v.processed("evt_c1")
	v.synced(id, 1)
	e := v.entitlement("u1")
	if !e.Entitled || e.Status != "active" || deref(e.SubscriptionID) != "sub_1" {
		t.Fatalf("after checkout.session.completed: %+v", e)
	}
	reads := v.proxy.Filter(http.MethodGet, "/v1/subscriptions/sub_1")
	if len(reads) != 1 || reads[0].StripeVersion != "2024-06-20" || reads[0].Query.Get("expand[0]") != "latest_invoice" {
		t.Errorf("subscription reads %+v", reads)
	}

	// The subscription's own first event, created before the read, arrives late: it is older than
	// the snapshot and changes nothing.
	incomplete := activeSub("sub_1", "cus_u1")
	incomplete.Status = "incomplete"
	v.deliver(stripeevents.SubscriptionEvent("evt_s1", "customer.subscription.created", time.Now().Add(-time.Minute), false, incomplete))
	v.processed("evt_s1")
	if e := v.entitlement("u1"); !e.Entitled || e.Status != "active" {
		t.Errorf("a late older event undid the read: %+v", e)
	}
	var status string
	v.db.Raw(`SELECT session_status FROM checkout_sessions WHERE session_id = $1`, id).Scan(&status)
	if status != "complete" {
		t.Errorf("session status %q", status)
	}
}

// The subscription events first: created (incomplete) leaves the user without access until
// checkout.session.completed's read says active; a newer event after the read still applies.
func TestCompletedAfterTheSubscriptionEvents(t *testing.T) {
	t.Parallel()
	v := defaultEnv(t)
	session := openAndPay(t, v)
	id := session["id"].(string)

	incomplete := activeSub("sub_1", "cus_u1")
	incomplete.Status = "incomplete"
	v.deliver(stripeevents.SubscriptionEvent("evt_s1", "customer.subscription.created", time.Now().Add(-time.Minute), false, incomplete))
	v.processed("evt_s1")
	if e := v.entitlement("u1"); e.Entitled || e.Status != "incomplete" {
		t.Fatalf("after the created event: %+v", e)
	}

	v.deliver(sessionEvent("evt_c1", EventSessionCompleted, time.Now(), session))
	v.processed("evt_c1")
	v.synced(id, 1)
	if e := v.entitlement("u1"); !e.Entitled || e.Status != "active" {
		t.Fatalf("after checkout.session.completed: %+v", e)
	}

	// A cancellation Stripe reports after the read wins over it.
	canceled := activeSub("sub_1", "cus_u1")
	canceled.Status, canceled.CanceledAt, canceled.EndedAt = "canceled", time.Now(), time.Now()
	v.deliver(stripeevents.SubscriptionEvent("evt_s2", "customer.subscription.deleted", time.Now().Add(5*time.Second), false, canceled))
	v.processed("evt_s2")
	if e := v.entitlement("u1"); e.Entitled || e.Status != "canceled" {
		t.Errorf("a newer event after the read: %+v", e)
	}
}

// A session made elsewhere for a user who has no customer yet links the user to the customer
// that paid (client_reference_id), and the user is entitled.
func TestCompletedLinksTheCustomer(t *testing.T) {
	t.Parallel()
	v := defaultEnv(t)
	id := v.sessions.Add(map[string]any{"mode": "subscription", "status": "complete", "payment_status": "paid",
		"customer": "cus_new", "client_reference_id": "u7", "subscription": "sub_7"})
	v.putSubscription(activeSub("sub_7", "cus_new"))
	v.deliver(sessionEvent("evt_c7", EventSessionCompleted, time.Now(), v.sessions.Get(id)))
	v.processed("evt_c7")
	v.synced(id, 1)
	var linked string
	v.db.Raw(`SELECT stripe_customer_id FROM customers WHERE user_id = 'u7'`).Scan(&linked)
	if linked != "cus_new" {
		t.Fatalf("u7 linked to %q", linked)
	}
	if e := v.entitlement("u7"); !e.Entitled {
		t.Errorf("entitlement %+v", e)
	}

	// A user linked to another customer keeps that link.
	v.link("u8", "cus_old", false)
	id8 := v.sessions.Add(map[string]any{"mode": "subscription", "status": "complete", "payment_status": "paid",
		"customer": "cus_other", "client_reference_id": "u8", "subscription": "sub_8"})
	v.putSubscription(activeSub("sub_8", "cus_other"))
	v.deliver(sessionEvent("evt_c8", EventSessionCompleted, time.Now(), v.sessions.Get(id8)))
	v.processed("evt_c8")
	v.synced(id8, 1)
	v.db.Raw(`SELECT stripe_customer_id FROM customers WHERE user_id = 'u8'`).Scan(&linked)
	if linked != "cus_old" {
		t.Errorf("u8 relinked to %q", linked)
	}
}

// An asynchronous payment: completed with the payment pending leaves the subscription
// incomplete; async_payment_succeeded reads it again, now active.
func TestAsyncPaymentSucceeded(t *testing.T) {
	t.Parallel()
	v := defaultEnv(t)
	v.link("u1", "cus_u1", false)
	id := v.open("u1", body("r1"))["id"].(string)
	pending := activeSub("sub_1", "cus_u1")
	pending.Status = "incomplete"
	v.putSubscription(pending)
	session := v.sessions.Complete(id, "sub_1")
	session["payment_status"] = "unpaid"
	v.deliver(sessionEvent("evt_c1", EventSessionCompleted, time.Now().Add(-2*time.Second), session))
	v.processed("evt_c1")
	v.synced(id, 1)
	if e := v.entitlement("u1"); e.Entitled || e.Status != "incomplete" {
		t.Fatalf("with the payment pending: %+v", e)
	}

	// The read of the second event is fetched in a later second than the first's: it must win.
	v.clock.Add(2 * time.Second)
	v.putSubscription(activeSub("sub_1", "cus_u1"))
	session["payment_status"] = "paid"
	v.deliver(sessionEvent("evt_c2", EventSessionAsyncPaymentSucceeded, time.Now(), session))
	v.processed("evt_c2")
	v.synced(id, 2)
	if e := v.entitlement("u1"); !e.Entitled || e.Status != "active" {
		t.Fatalf("after async_payment_succeeded: %+v", e)
	}
	var payment string
	v.db.Raw(`SELECT payment_status FROM checkout_sessions WHERE session_id = $1`, id).Scan(&payment)
	if payment != "paid" {
		t.Errorf("payment status %q", payment)
	}

	// A late async_payment_failed of the same session does not unpay it.
	session["payment_status"] = "unpaid"
	v.deliver(sessionEvent("evt_c3", EventSessionAsyncPaymentFailed, time.Now(), session))
	v.processed("evt_c3")
	v.db.Raw(`SELECT payment_status FROM checkout_sessions WHERE session_id = $1`, id).Scan(&payment)
	if payment != "paid" {
		t.Errorf("payment status after a late failure %q", payment)
	}
}

// The four types are registered, and payment-mode sessions are acknowledged and left alone.
func TestRegisteredTypesAndOtherSessions(t *testing.T) {
	t.Parallel()
	reg := webhooks.NewRegistry()
	New(Deps{}).Register(reg)
	want := []string{"checkout.session.async_payment_failed", "checkout.session.async_payment_succeeded", "checkout.session.completed",
		"checkout.session.expired"}
	if got := reg.Types(); !slices.Equal(got, want) {
		t.Errorf("types %v, want %v", got, want)
	}

	v := defaultEnv(t)
	v.deliver(sessionEvent("evt_p1", EventSessionCompleted, time.Now(), map[string]any{
		"id": "cs_test_payment", "object": "checkout.session", "mode": "payment", "status": "complete",
		"customer": "cus_p", "client_reference_id": "u5"}))
	v.processed("evt_p1")
	var n int
	v.db.Raw(`SELECT count(*) FROM checkout_sessions`).Scan(&n)
	if n != 0 {
		t.Errorf("%d sessions recorded", n)
	}
}

// A live-mode session delivered to a test-mode service is recorded, but its subscription is not
// read with the test key.
func TestSessionOfTheOtherModeIsNotRead(t *testing.T) {
	t.Parallel()
	v := defaultEnv(t)
	payload := stripeevents.Event("evt_l1", EventSessionCompleted, time.Now(), true, map[string]any{
		"id": "cs_live_1", "object": "checkout.session", "mode": "subscription", "status": "complete",
		"payment_status": "paid", "customer": "cus_live", "client_reference_id": "u6", "subscription": "sub_live"}, nil)
	v.deliverLive(payload)
	v.processed("evt_l1")
	var jobs, rows int
	v.db.Raw(`SELECT count(*) FROM river_job WHERE kind = $1`, SyncJobKind).Scan(&jobs)
	v.db.Raw(`SELECT count(*) FROM checkout_sessions WHERE session_id = 'cs_live_1' AND livemode`).Scan(&rows)
	if jobs != 0 || rows != 1 {
		t.Errorf("%d jobs, %d live rows; want 0 and 1", jobs, rows)
	}
	if reads := v.proxy.Filter(http.MethodGet, "/v1/subscriptions/sub_live"); len(reads) != 0 {
		t.Errorf("read with the test key: %+v", reads)
	}
}

// The answer to the request was lost, and the customer (who had the URL some other way) paid
// before the request was repeated: the event recorded the session on its own row, and the repeat
// takes that row's state into the request's row. One row, complete, with the subscription.
func TestEventBeforeTheRequestIsFinished(t *testing.T) {
	t.Parallel()
	v := defaultEnv(t)
	v.link("u1", "cus_u1", false)
	v.proxy.InjectFault(http.MethodPost, sessionsPath, stripeemu.FaultDropAfter, 3)
	expectStatus(t, v.post(checkoutPath("u1"), body("r1")), http.StatusServiceUnavailable)
	if v.sessions.Len() != 1 {
		t.Fatalf("%d sessions", v.sessions.Len())
	}
	// The double numbers its sessions: the first is this request's.
	id := "cs_test_proxy000001"
	if s := v.sessions.Get(id); s == nil || s["client_reference_id"] != "u1" {
		t.Fatalf("session %v", s)
	}
	v.putSubscription(activeSub("sub_1", "cus_u1"))
	v.deliver(sessionEvent("evt_c1", EventSessionCompleted, time.Now(), v.sessions.Complete(id, "sub_1")))
	v.processed("evt_c1")
	v.synced(id, 1)

	got := v.open("u1", body("r1"))
	if got["id"] != id {
		t.Fatalf("answer %v, want session %s", got, id)
	}
	var rows []sessionRow
	v.db.Raw(`SELECT * FROM checkout_sessions WHERE session_id = $1`, id).Scan(&rows)
	if len(rows) != 1 || deref(rows[0].RequestID) != "r1" || deref(rows[0].SessionStatus) != "complete" ||
		deref(rows[0].SubscriptionID) != "sub_1" || deref(rows[0].PaymentStatus) != "paid" {
		t.Errorf("rows %+v", rows)
	}
}

// checkout.session.expired marks the local session expired: the success page says so from local
// state, without asking Stripe, and the user can open a new session.
func TestExpiredSessionIsMarkedExpired(t *testing.T) {
	t.Parallel()
	v := defaultEnv(t)
	v.link("u1", "cus_u1", false)
	id := v.open("u1", body("r1"))["id"].(string)
	// The double still holds the session open: a page that asked Stripe would answer "open".
	expired := v.sessions.Get(id)
	expired["status"], expired["url"] = "expired", nil
	v.deliver(sessionEvent("evt_x1", EventSessionExpired, time.Now(), expired))
	v.processed("evt_x1")

	rec := v.get("/v1/checkout-sessions/" + id)
	expectStatus(t, rec, http.StatusOK)
	got := decode(t, rec)
	if got["status"] != "expired" || got["payment_status"] != "unpaid" || got["subscription_id"] != nil || got["user_id"] != "u1" {
		t.Errorf("success page of the expired session: %v", got)
	}
	if reads := v.proxy.Filter(http.MethodGet, sessionsPath+"/"+id); len(reads) != 0 {
		t.Errorf("the success page read Stripe %d times for a session known to be expired", len(reads))
	}
	if r := v.row("u1", "r1"); deref(r.SessionStatus) != "expired" {
		t.Errorf("row status %q, want expired", deref(r.SessionStatus))
	}

	next := v.open("u1", body("r2"))
	if next["id"] == id || next["id"] == "" {
		t.Errorf("new session %v, want another than the expired %s", next["id"], id)
	}
}
