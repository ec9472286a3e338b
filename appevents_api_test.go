package main

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"billing/internal/apitest"
	"billing/internal/stripeevents"
)

// The app events as the app and the operator reach them over HTTP: the feed, the admin's list,
// a redelivery (audited), and their refusals — every answer checked against the OpenAPI document.
func TestAppEventsOverHTTP(t *testing.T) {
	t.Parallel()
	d := newDevService(t)
	if err := d.app.DB.Exec(`INSERT INTO customers (user_id, stripe_customer_id, email) VALUES ('u_ae', 'cus_ae', 'ae@example.com')`).Error; err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for k, status := range []string{"active", "past_due"} {
		d.webhook("customer.subscription.updated", stripeevents.SampleOptions{EventID: "evt_ae_" + status, Status: status,
			Subscription: "sub_ae", Customer: "cus_ae", Now: now.Add(time.Duration(k) * time.Second)})
	}

	code, feed := d.do(apitest.AppToken, http.MethodGet, "/v1/app-events?limit=1", nil)
	evs, _ := feed["events"].([]any)
	if code != http.StatusOK || len(evs) != 1 || feed["has_more"] != true {
		t.Fatalf("feed page 1: %d %v", code, feed)
	}
	first := evs[0].(map[string]any)
	if first["type"] != "entitlement.updated" || first["user_id"] != "u_ae" || first["sequence"] != float64(1) {
		t.Fatalf("first event %v", first)
	}
	code, feed = d.do(apitest.AppToken, http.MethodGet, "/v1/app-events?after="+first["id"].(string), nil)
	evs, _ = feed["events"].([]any)
	if code != http.StatusOK || len(evs) != 1 || feed["has_more"] != false || evs[0].(map[string]any)["sequence"] != float64(2) {
		t.Fatalf("feed page 2: %d %v", code, feed)
	}
	second := evs[0].(map[string]any)
	if data := second["data"].(map[string]any); data["status"] != "past_due" || data["previous"].(map[string]any)["status"] != "active" {
		t.Errorf("second event's data %v", data)
	}

	for _, tc := range []struct{ path, code string }{
		{"/v1/app-events?after=aevt_nothing", "unknown_app_event"},
		{"/v1/app-events?limit=0", "invalid_request"},
		{"/v1/app-events?limit=501", "invalid_request"},
	} {
		if code, got := d.do(apitest.AppToken, http.MethodGet, tc.path, nil); code != http.StatusBadRequest || errCode(got) != tc.code {
			t.Errorf("GET %s: %d %v, want 400 %s", tc.path, code, got, tc.code)
		}
	}
	if code, _ := d.do(apitest.AdminToken, http.MethodGet, "/v1/app-events", nil); code != http.StatusUnauthorized && code != http.StatusForbidden {
		t.Errorf("the feed answered an admin token: %d", code)
	}

	// No url is configured: the events wait, pending, and the operator sees them.
	code, list := d.do(apitest.AdminToken, http.MethodGet, "/admin/app-events?user_id=u_ae&status=pending", nil)
	rows, _ := list["events"].([]any)
	if code != http.StatusOK || len(rows) != 2 || rows[0].(map[string]any)["sequence"] != float64(2) {
		t.Fatalf("admin list: %d %v", code, list)
	}
	if code, got := d.do(apitest.AdminToken, http.MethodGet, "/admin/app-events?status=lost", nil); code != http.StatusBadRequest || errCode(got) != "invalid_request" {
		t.Errorf("a bad status: %d %v", code, got)
	}
	id := first["id"].(string)
	if code, got := d.do(apitest.AdminToken, http.MethodPost, "/admin/app-events/"+id+"/redeliver", nil); code != http.StatusConflict {
		t.Errorf("redeliver a pending event: %d %v, want 409", code, got)
	}
	if err := d.app.DB.Exec(`UPDATE app_events SET status = 'failed', failed_at = now() WHERE id = $1 AND livemode = false`, id).Error; err != nil {
		t.Fatal(err)
	}
	if code, got := d.do(apitest.AdminToken, http.MethodPost, "/admin/app-events/"+id+"/redeliver", nil); code != http.StatusAccepted || got["status"] != "pending" {
		t.Fatalf("redeliver a failed event: %d %v", code, got)
	}
	if code, got := d.do(apitest.AdminToken, http.MethodPost, "/admin/app-events/aevt_nothing/redeliver", nil); code != http.StatusNotFound {
		t.Errorf("redeliver an unknown event: %d %v", code, got)
	}
	code, audit := d.do(apitest.AdminToken, http.MethodGet, "/admin/audit", nil)
	entries, _ := audit["entries"].([]any)
	found := false
	for _, e := range entries {
		if en := e.(map[string]any); en["action"] == "app_event_redeliver" && en["target"] == id && strings.Contains(en["result"].(string), "was failed") {
			found = true
		}
	}
	if code != http.StatusOK || !found {
		t.Errorf("the redelivery is not in the audit log: %d %v", code, audit)
	}
}

func errCode(body map[string]any) string {
	e, _ := body["error"].(map[string]any)
	c, _ := e["code"].(string)
	return c
}
