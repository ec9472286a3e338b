package portal

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"gorm.io/gorm"

	"billing/catalog"
	"billing/internal/stripeemu"
	"billing/internal/stripeevents"
)

// previewNow is the clock of the portal under test: the proration date it sends.
var previewNow = time.Date(2026, 5, 10, 8, 30, 0, 0, time.UTC)

const previewPath = "/v1/invoices/create_preview"

func previewPathOf(user, sub string) string { return changePath(user, sub) + "/preview" }

// sell puts prices in the catalog as their events would.
func (v *env) sell(prices ...stripeevents.Price) {
	v.t.Helper()
	cat := catalog.New(catalog.Deps{DB: v.db})
	for _, p := range prices {
		price, err := catalog.DecodePrice(mustJSON(v.t, p.Object(false)))
		if err != nil {
			v.t.Fatal(err)
		}
		if err := v.db.Transaction(func(tx *gorm.DB) error {
			_, err := cat.PutPrice(context.Background(), tx, price, catalog.Write{Source: "evt_" + p.ID, Created: previewNow})
			return err
		}); err != nil {
			v.t.Fatal(err)
		}
	}
}

func TestPreviewAsksStripeForTheProratedInvoiceAndChangesNothing(t *testing.T) {
	t.Parallel()
	v := newEnv(t, defaultURL, nil)
	ss := v.stripeSubscriptions()
	ss.put("sub_active", "cus_u1", "price_basic")
	ss.seats["sub_active"] = 2
	v.sell(stripeevents.Price{ID: "price_team", Product: "prod_team", LookupKey: "team_monthly", UnitAmount: 5000, Interval: "month"})
	end := previewNow.Add(20 * 24 * time.Hour)
	line := func(desc string, amount int64, proration bool, from, to time.Time) map[string]any {
		return map[string]any{"id": "il_" + desc, "object": "line_item", "description": desc, "amount": amount, "currency": "usd",
			"proration": proration, "quantity": 2, "period": map[string]any{"start": from.Unix(), "end": to.Unix()},
			"price": map[string]any{"id": "price_team", "object": "price"}}
	}
	v.proxy.Respond(http.MethodPost, previewPath, 1, func(stripeemu.Request) stripeemu.Answer {
		return stripeemu.Answer{Status: http.StatusOK, Body: map[string]any{"object": "invoice", "currency": "usd",
			"amount_due": 16667, "subtotal": 16667, "total": 16667, "tax": nil, "next_payment_attempt": end.Unix(),
			"subscription_proration_date": previewNow.Add(time.Hour).Unix(),
			"lines": map[string]any{"object": "list", "has_more": false, "data": []any{
				line("Unused time on Basic", -1333, true, previewNow, end),
				line("Remaining time on Team", 6667, true, previewNow, end),
				line("Team", 10000, false, end, end.AddDate(0, 1, 0)),
			}}}}
	})
	rec := v.post(appToken, previewPathOf("u1", "sub_active"), `{"price_lookup_key":"team_monthly"}`)
	expectStatus(t, rec, http.StatusOK)

	sent := v.proxy.Filter(http.MethodPost, previewPath)
	if len(sent) != 1 {
		t.Fatalf("%d previews asked", len(sent))
	}
	expectForm(t, sent[0], map[string]string{
		"customer":                                 "cus_u1",
		"subscription":                             "sub_active",
		"subscription_details[items][0][id]":       "si_sub_active_a",
		"subscription_details[items][0][price]":    "price_team",
		"subscription_details[proration_behavior]": "create_prorations",
	})
	if sent[0].Form.Has("subscription_details[proration_date]") {
		t.Error("a proration date sent: Stripe's now (a test clock's) must decide")
	}
	if sent[0].Form.Has("subscription_details[items][0][quantity]") {
		t.Error("a price alone sent a quantity: the seats bought must stay")
	}
	var p Preview
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
		t.Fatal(err)
	}
	if p.Currency != "usd" || p.AmountDue != 16667 || p.Subtotal != 16667 || p.Tax != 0 || len(p.Lines) != 3 ||
		p.NextPaymentAt == nil || !p.NextPaymentAt.Equal(end.Truncate(time.Second)) || !p.ProrationDate.Equal(previewNow.Add(time.Hour)) {
		t.Fatalf("preview %+v", p)
	}
	if l := p.Lines[0]; !l.Proration || l.Amount != -1333 || l.Description != "Unused time on Basic" ||
		!l.PeriodStart.Equal(previewNow) || !l.PeriodEnd.Equal(end.Truncate(time.Second)) {
		t.Fatalf("first line %+v", l)
	}
	if l := p.Lines[2]; l.Proration || l.Amount != 10000 {
		t.Fatalf("the next period's line %+v", l)
	}
	// The raw answer names the contract's fields.
	var raw map[string]any
	_ = json.Unmarshal(rec.Body.Bytes(), &raw)
	for _, f := range []string{"currency", "amount_due", "subtotal", "tax", "lines", "next_payment_at"} {
		if _, ok := raw[f]; !ok {
			t.Errorf("field %s missing", f)
		}
	}
	// Only reads and the preview: nothing changed, no portal session.
	for _, r := range v.proxy.Requests() {
		if !(r.Method == http.MethodGet && r.Path == "/v1/subscriptions/sub_active") && r.Path != previewPath {
			t.Errorf("unexpected Stripe call %s %s", r.Method, r.Path)
		}
	}
}

func TestPreviewOfStripeMocksInvoiceMapsItsLines(t *testing.T) {
	t.Parallel()
	v := newEnv(t, defaultURL, nil)
	ss := v.stripeSubscriptions()
	ss.put("sub_active", "cus_u1", "price_basic")
	rec := v.post(appToken, previewPathOf("u1", "sub_active"), `{"quantity":3}`)
	expectStatus(t, rec, http.StatusOK)
	sent := v.proxy.Filter(http.MethodPost, previewPath)
	if len(sent) != 1 || sent[0].Status != http.StatusOK {
		t.Fatalf("previews %+v: stripe-mock must accept the request as Stripe's spec describes it", sent)
	}
	expectForm(t, sent[0], map[string]string{"subscription_details[items][0][quantity]": "3"})
	if sent[0].Form.Has("subscription_details[items][0][price]") {
		t.Error("seats alone sent a price: the item's price must stay")
	}
	var p Preview
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || p.Currency == "" || p.Lines == nil {
		t.Fatalf("preview %s: %v", rec.Body.String(), err)
	}
}

func TestPreviewRefusesWhatChangeRefuses(t *testing.T) {
	t.Parallel()
	v := newEnv(t, defaultURL, nil)
	ss := v.stripeSubscriptions()
	ss.put("sub_active", "cus_u1", "price_basic")
	v.sell(stripeevents.Price{ID: "price_old", Product: "prod_team", LookupKey: "old_monthly", UnitAmount: 5000, Interval: "month", Inactive: true})
	for _, tc := range []struct {
		name, user, sub, body string
		status                int
		code                  string
	}{
		{"canceled", "u1", "sub_canceled", `{"quantity":2}`, http.StatusConflict, "subscription_already_canceled"},
		{"another user's", "u1", "sub_of_u2", `{"quantity":2}`, http.StatusNotFound, "not_found"},
		{"zero seats", "u1", "sub_active", `{"quantity":0}`, http.StatusBadRequest, "invalid_quantity"},
		{"too many seats", "u1", "sub_active", `{"quantity":10001}`, http.StatusBadRequest, "invalid_quantity"},
		{"unknown lookup key", "u1", "sub_active", `{"price_lookup_key":"gold_monthly"}`, http.StatusUnprocessableEntity, "unknown_price"},
		{"inactive price", "u1", "sub_active", `{"price_lookup_key":"old_monthly"}`, http.StatusUnprocessableEntity, "inactive_price"},
		{"inactive price by id", "u1", "sub_active", `{"price_id":"price_old"}`, http.StatusUnprocessableEntity, "inactive_price"},
		{"both", "u1", "sub_active", `{"price_id":"price_x","price_lookup_key":"x"}`, http.StatusBadRequest, "invalid_request"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			expectError(t, v.post(appToken, previewPathOf(tc.user, tc.sub), tc.body), tc.status, tc.code)
			// The same validation as change.
			expectError(t, v.post(appToken, changePath(tc.user, tc.sub), tc.body), tc.status, tc.code)
		})
	}
	if n := len(v.proxy.Filter(http.MethodPost, previewPath)) + len(v.proxy.Filter(http.MethodPost, sessionsPath)); n != 0 {
		t.Errorf("%d calls to Stripe for refused requests", n)
	}
}

func TestChangeTakesALookupKey(t *testing.T) {
	t.Parallel()
	v := newEnv(t, defaultURL, nil)
	ss := v.stripeSubscriptions()
	ss.put("sub_active", "cus_u1", "price_basic")
	v.sell(stripeevents.Price{ID: "price_team", Product: "prod_team", LookupKey: "team_monthly", UnitAmount: 5000, Interval: "month"})
	expectStatus(t, v.post(appToken, changePath("u1", "sub_active"), `{"price_lookup_key":"team_monthly"}`), http.StatusSeeOther)
	reqs := v.proxy.Filter(http.MethodPost, sessionsPath)
	expectForm(t, reqs[len(reqs)-1], map[string]string{"flow_data[subscription_update_confirm][items][0][price]": "price_team"})
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
