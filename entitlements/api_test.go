package entitlements

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"

	"billing/billing"
	"billing/internal/apitest"
	"billing/internal/httpserver"
)

func TestEntitlementUnknownUser(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, path := range []string{"/v1/customers/nobody/entitlement"} {
		code, body := e.get(t, path, nil)
		var errBody struct {
			Error struct{ Code string } `json:"error"`
		}
		_ = json.Unmarshal(body, &errBody)
		if code != http.StatusNotFound || errBody.Error.Code != "not_found" {
			t.Errorf("GET %s = %d %s, want 404 not_found", path, code, body)
		}
	}
	// An id that no user can have is a 400, as on PUT /v1/customers/{user_id}.
	for _, path := range []string{"/v1/customers/a%20b/entitlement", "/v1/customers/" + strings.Repeat("x", 101) + "/entitlement"} {
		code, body := e.get(t, path, nil)
		if code != http.StatusBadRequest || !strings.Contains(string(body), `"invalid_user_id"`) {
			t.Errorf("GET %s = %d %s, want 400 invalid_user_id", path, code, body)
		}
	}
}

func TestEntitlementJSONShape(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.link(t, "u1", "cus_1", "u1@example.com")
	e.link(t, "u_nolink", "", "")

	wantKeys := []string{"cancel_at_period_end", "current_period_end", "entitled", "features", "hold_reason", "on_hold",
		"price_id", "quantity", "status", "subscription_id", "trial_end", "unconfirmed_since", "user_id"}

	// A customers row without a Stripe customer is a link still being made: no customer yet.
	for _, path := range []string{"/v1/customers/u_nolink", "/v1/customers/u_nolink/entitlement"} {
		if code, body := e.get(t, path, nil); code != http.StatusNotFound {
			t.Errorf("GET %s = %d %s, want 404", path, code, body)
		}
	}

	// A known user without subscriptions: entitled false, status "none", nulls.
	for _, user := range []string{"u1"} {
		code, body := e.get(t, "/v1/customers/"+user+"/entitlement", nil)
		var m map[string]any
		if err := json.Unmarshal(body, &m); err != nil || code != http.StatusOK {
			t.Fatalf("%s: %d %s", user, code, body)
		}
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		if !slices.Equal(keys, wantKeys) {
			t.Errorf("%s: keys %v, want %v", user, keys, wantKeys)
		}
		if m["entitled"] != false || m["status"] != "none" || m["on_hold"] != false || m["hold_reason"] != nil ||
			m["subscription_id"] != nil || m["price_id"] != nil || m["current_period_end"] != nil || m["trial_end"] != nil ||
			m["cancel_at_period_end"] != false || m["unconfirmed_since"] != nil || m["user_id"] != user ||
			m["quantity"] != nil || fmt.Sprint(m["features"]) != "[]" {
			t.Errorf("%s: %s", user, body)
		}
	}

	e.mustHandle(t, created("e1", 1, subObj{ID: "sub_1", Customer: "cus_1", Status: billing.StatusTrialing, Price: "price_pro",
		PeriodStart: 1, PeriodEnd: 86400, TrialStart: 1, TrialEnd: 86400}))
	code, body := e.get(t, "/v1/customers/u1/entitlement", nil)
	want := `{"user_id":"u1","entitled":true,"status":"trialing","on_hold":false,"hold_reason":null,"subscription_id":"sub_1","price_id":"price_pro","current_period_end":"2024-06-02T00:00:00Z","cancel_at_period_end":false,"trial_end":"2024-06-02T00:00:00Z","unconfirmed_since":null,"quantity":null,"features":[]}`
	if code != http.StatusOK || strings.TrimSpace(string(body)) != want {
		t.Errorf("entitlement = %d %s\nwant %s", code, body, want)
	}

	cv := e.customerView(t, "u1")
	if cv.UserID != "u1" || ptrStr(cv.StripeCustomerID) != "cus_1" || len(cv.Subscriptions) != 1 ||
		cv.Subscriptions[0].SubscriptionID != "sub_1" || !cv.Subscriptions[0].Entitled || !cv.Entitlement.Entitled {
		t.Errorf("customer view: %+v", cv)
	}
	e.link(t, "u2", "cus_2", "")
	body, _ = json.Marshal(e.customerView(t, "u2"))
	if !strings.Contains(string(body), `"subscriptions":[]`) ||
		!strings.Contains(string(body), `"entitlement":{"user_id":"u2","entitled":false,"status":"none"`) {
		t.Errorf("customer without subscriptions: %d %s", code, body)
	}
}

func TestEntitlementPerStatus(t *testing.T) {
	t.Parallel()
	statuses := []string{billing.StatusIncomplete, billing.StatusIncompleteExpired, billing.StatusTrialing, billing.StatusActive, billing.StatusPastDue,
		billing.StatusCanceled, billing.StatusUnpaid, billing.StatusPaused, "brand_new_status"}
	for _, pastDueEntitled := range []bool{true, false} {
		e := newEnv(t, withPastDueEntitled(pastDueEntitled))
		for i, status := range statuses {
			user, cus, sub := "u_"+status, "cus_"+status, "sub_"+status
			e.link(t, user, cus, "")
			e.mustHandle(t, created("e_"+status, int64(i+1), subObj{ID: sub, Customer: cus, Status: status, PeriodEnd: 86400}))
			var ent Entitlement
			if code, body := e.get(t, "/v1/customers/"+user+"/entitlement", &ent); code != http.StatusOK {
				t.Fatalf("%s: %d %s", status, code, body)
			}
			want := status == billing.StatusTrialing || status == billing.StatusActive || (status == billing.StatusPastDue && pastDueEntitled)
			wantHold := status == billing.StatusPastDue || status == billing.StatusUnpaid
			if ent.Entitled != want || ent.Status != status || ent.OnHold != wantHold || ptrStr(ent.SubscriptionID) != sub {
				t.Errorf("past_due_entitled=%v %s: %+v, want entitled %v on_hold %v", pastDueEntitled, status, ent, want, wantHold)
			}
		}
	}
}

func TestEntitlementCancelAtPeriodEnd(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.link(t, "u1", "cus_1", "")
	e.mustHandle(t, updated("e1", 1, subObj{ID: "sub_1", Customer: "cus_1", Status: billing.StatusActive, PeriodEnd: 1000, CancelAtPeriodEnd: true}))
	tests := []struct {
		now  int64
		want bool
	}{{0, true}, {999, true}, {1000, false}, {5000, false}}
	for _, tc := range tests {
		e.clock.Set(at(tc.now))
		var ent Entitlement
		e.get(t, "/v1/customers/u1/entitlement", &ent)
		if ent.Entitled != tc.want || !ent.CancelAtPeriodEnd || ent.Status != billing.StatusActive {
			t.Errorf("at +%ds: %+v, want entitled %v", tc.now, ent, tc.want)
		}
	}
}

func TestSubscriptionsAttachWhenCustomerIsLinked(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	// Made in the dashboard before the app ever linked the customer.
	e.mustHandle(t, created("e1", 1, subObj{ID: "sub_dash", Customer: "cus_dash", Status: billing.StatusActive, Price: "price_x"}))
	e.link(t, "u1", "", "")
	if code, body := e.get(t, "/v1/customers/u1/entitlement", nil); code != http.StatusNotFound {
		t.Fatalf("before linking: %d %s", code, body)
	}
	e.link(t, "u1", "cus_dash", "")
	var ent Entitlement
	e.get(t, "/v1/customers/u1/entitlement", &ent)
	if !ent.Entitled || ptrStr(ent.SubscriptionID) != "sub_dash" {
		t.Errorf("after linking: %+v", ent)
	}
}

func TestEntitlementSeveralSubscriptions(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.link(t, "u1", "cus_1", "")
	inv := invObj{ID: "in_b", Customer: "cus_1", Subscription: "sub_b", Currency: "usd", AmountDue: 100, AttemptCount: 1}
	e.mustHandle(t,
		created("a1", 1, subObj{ID: "sub_a", Customer: "cus_1", Status: billing.StatusCanceled, PeriodEnd: 9000}),
		created("b1", 2, subObj{ID: "sub_b", Customer: "cus_1", Status: billing.StatusActive, Price: "price_b", PeriodEnd: 5000}),
		created("c1", 3, subObj{ID: "sub_c", Customer: "cus_1", Status: billing.StatusIncomplete, PeriodEnd: 9999}),
		failed("fb", 4, inv))
	cv := e.customerView(t, "u1")
	ent := cv.Entitlement
	if !ent.Entitled || ptrStr(ent.SubscriptionID) != "sub_b" || ptrStr(ent.PriceID) != "price_b" || !ent.OnHold || ptrStr(ent.HoldReason) != billing.HoldPaymentFailed {
		t.Errorf("entitlement: %+v", ent)
	}
	if len(cv.Subscriptions) != 3 {
		t.Fatalf("%d subscriptions", len(cv.Subscriptions))
	}
	for _, s := range cv.Subscriptions {
		wantHold := s.SubscriptionID == "sub_b"
		if s.OnHold != wantHold || (wantHold && (ptrInt(s.AmountDue) != "100" || ptrInt(s.AttemptCount) != "1")) {
			t.Errorf("%s: on_hold %v amount %s attempts %s", s.SubscriptionID, s.OnHold, ptrInt(s.AmountDue), ptrInt(s.AttemptCount))
		}
	}
}

// The database being down is an outage the caller should retry (503), not a 500.
func TestReadsAnswer503WhenTheDatabaseIsDown(t *testing.T) {
	t.Parallel()
	db := apitest.UnreachableDB(t)
	svc := New(Deps{DB: db, Billing: billing.New(billing.Deps{DB: db})})
	e := echo.New()
	e.HTTPErrorHandler = httpserver.ErrorHandler(slog.New(slog.DiscardHandler))
	svc.MountAPI(e.Group("/v1"))
	for _, path := range []string{"/v1/customers/u1", "/v1/customers/u1/entitlement"} {
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), `"database_unavailable"`) {
			t.Errorf("GET %s = %d %s, want 503 database_unavailable", path, rec.Code, rec.Body)
		}
	}
}

// GET /v1/customers/{user_id} is served here: the link the customers package owns, with the
// subscriptions and entitlement that billing reads from local state.
func TestGetCustomer(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	if code, body := e.get(t, "/v1/customers/nobody", nil); code != http.StatusNotFound || !strings.Contains(string(body), `"not_found"`) {
		t.Errorf("unknown user: %d %s", code, body)
	}
	if code, body := e.get(t, "/v1/customers/a%20b", nil); code != http.StatusBadRequest || !strings.Contains(string(body), `"invalid_user_id"`) {
		t.Errorf("bad user id: %d %s", code, body)
	}
	e.link(t, "u1", "cus_1", "u1@example.com")
	if err := e.db.Exec(`INSERT INTO subscriptions (subscription_id, stripe_customer_id, livemode, status, price_id, sub_event_created)
		VALUES ('sub_1', 'cus_1', false, 'active', 'price_1', now())`).Error; err != nil {
		t.Fatal(err)
	}
	var body map[string]any
	if code, raw := e.get(t, "/v1/customers/u1", &body); code != http.StatusOK {
		t.Fatalf("GET: %d %s", code, raw)
	}
	subs, _ := body["subscriptions"].([]any)
	ent, _ := body["entitlement"].(map[string]any)
	if body["user_id"] != "u1" || body["stripe_customer_id"] != "cus_1" || body["livemode"] != false || len(subs) != 1 ||
		ent["entitled"] != true || ent["subscription_id"] != "sub_1" {
		t.Errorf("customer view: %v", body)
	}
}
