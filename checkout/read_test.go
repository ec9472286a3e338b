package checkout

import (
	"net/http"
	"testing"
	"time"

	"billing/internal/stripeemu"
)

type sessionAnswer struct {
	ID          string
	Status      *string
	UserID      *string `json:"user_id"`
	Entitlement struct {
		Entitled bool
		Status   string
	}
}

func (v *env) success(id string) (sessionAnswer, int) {
	v.t.Helper()
	rec := v.get("/v1/checkout-sessions/" + id)
	expectStatus(v.t, rec, http.StatusOK)
	m := decode(v.t, rec)
	var a sessionAnswer
	a.ID, _ = m["id"].(string)
	if s, ok := m["status"].(string); ok {
		a.Status = &s
	}
	if u, ok := m["user_id"].(string); ok {
		a.UserID = &u
	}
	e, _ := m["entitlement"].(map[string]any)
	if _, ok := e["features"].([]any); !ok {
		v.t.Errorf("session %s: entitlement.features %v is not a list (never null)", id, e["features"])
	}
	a.Entitlement.Entitled, _ = e["entitled"].(bool)
	a.Entitlement.Status, _ = e["status"].(string)
	return a, len(v.proxy.Requests())
}

// The customer is back from Checkout before the webhook: the success page reads the session and
// its subscription from Stripe once, records them and answers entitled; the next read is local.
func TestSuccessPageReadsStripeOnceThenLocalState(t *testing.T) {
	t.Parallel()
	v := defaultEnv(t)
	session := openAndPay(t, v)
	id := session["id"].(string)

	before := len(v.proxy.Requests())
	a, after := v.success(id)
	if a.ID != id || deref(a.Status) != "complete" || deref(a.UserID) != "u1" || !a.Entitlement.Entitled || a.Entitlement.Status != "active" {
		t.Fatalf("first read %+v", a)
	}
	if got := v.proxy.Filter(http.MethodGet, sessionsPath+"/"+id); len(got) != 1 || after-before != 2 {
		t.Errorf("%d session reads, %d calls; want 1 and 2 (the session, its subscription)", len(got), after-before)
	}

	again, calls := v.success(id)
	if calls != after || deref(again.Status) != "complete" || !again.Entitlement.Entitled {
		t.Errorf("second read %+v with %d new calls", again, calls-after)
	}

	// The event that comes afterwards finds the session recorded and changes nothing.
	v.deliver(sessionEvent("evt_c1", EventSessionCompleted, time.Now(), session))
	v.processed("evt_c1")
	v.synced(id, 1)
	var rows int
	v.db.Raw(`SELECT count(*) FROM checkout_sessions WHERE session_id = $1`, id).Scan(&rows)
	if rows != 1 {
		t.Errorf("%d rows of the session", rows)
	}
	if e := v.entitlement("u1"); !e.Entitled {
		t.Errorf("entitlement %+v", e)
	}
}

// After the webhook, the page answers from local state without calling Stripe.
func TestSuccessPageAfterTheEventIsLocal(t *testing.T) {
	t.Parallel()
	v := defaultEnv(t)
	session := openAndPay(t, v)
	id := session["id"].(string)
	v.deliver(sessionEvent("evt_c1", EventSessionCompleted, time.Now(), session))
	v.processed("evt_c1")
	v.synced(id, 1)
	before := len(v.proxy.Requests())
	a, after := v.success(id)
	if after != before || deref(a.Status) != "complete" || !a.Entitlement.Entitled {
		t.Errorf("read %+v with %d calls", a, after-before)
	}
}

// A session still open is read again (the customer has not paid yet); a session Stripe does not
// know is a 404; a session made elsewhere is recorded from the read.
func TestSuccessPageOpenUnknownAndForeignSessions(t *testing.T) {
	t.Parallel()
	v := defaultEnv(t)
	v.link("u1", "cus_u1", false)
	id := v.open("u1", body("r1"))["id"].(string)
	for range 2 {
		a, _ := v.success(id)
		if deref(a.Status) != "open" || a.Entitlement.Entitled || a.Entitlement.Status != "none" {
			t.Errorf("open session %+v", a)
		}
	}
	if n := len(v.proxy.Filter(http.MethodGet, sessionsPath+"/"+id)); n != 2 {
		t.Errorf("%d reads of an open session, want 2", n)
	}

	expectError(t, v.get("/v1/checkout-sessions/cs_test_nope"), http.StatusNotFound, "not_found")
	expectError(t, v.get("/v1/checkout-sessions/sub_1"), http.StatusBadRequest, "invalid_request")

	foreign := v.sessions.Add(map[string]any{"mode": "subscription", "status": "complete", "payment_status": "paid",
		"customer": "cus_u1", "client_reference_id": "u1", "subscription": "sub_9"})
	v.putSubscription(activeSub("sub_9", "cus_u1"))
	a, _ := v.success(foreign)
	if deref(a.UserID) != "u1" || !a.Entitlement.Entitled {
		t.Errorf("foreign session %+v", a)
	}

	// A Payment Link's session names no user: no entitlement, still one of the documented shape.
	anonymous := v.sessions.Add(map[string]any{"mode": "subscription", "status": "open", "payment_status": "unpaid"})
	if a, _ := v.success(anonymous); a.UserID != nil || a.Entitlement.Entitled {
		t.Errorf("a session without a user %+v", a)
	}
}

// When Stripe cannot give the subscription, the session is recorded and the read is queued.
func TestSuccessPageQueuesTheReadWhenStripeFails(t *testing.T) {
	t.Parallel()
	v := defaultEnv(t)
	session := openAndPay(t, v)
	id := session["id"].(string)
	v.proxy.InjectFault(http.MethodGet, "/v1/subscriptions/sub_1", stripeemu.Fault500, 3) // stripe-go tries three times
	a, _ := v.success(id)
	if deref(a.Status) != "complete" {
		t.Fatalf("read %+v", a)
	}
	v.synced(id, 1)
	if e := v.entitlement("u1"); !e.Entitled {
		t.Errorf("entitlement after the queued read: %+v", e)
	}
}
