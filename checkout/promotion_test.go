package checkout

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

// sell puts prices in the local catalog as their events would.
func (v *env) sell(prices ...stripeevents.Price) {
	v.t.Helper()
	cat := catalog.New(catalog.Deps{DB: v.db})
	for _, p := range prices {
		b, err := json.Marshal(p.Object(false))
		if err != nil {
			v.t.Fatal(err)
		}
		price, err := catalog.DecodePrice(b)
		if err != nil {
			v.t.Fatal(err)
		}
		if err := v.db.Transaction(func(tx *gorm.DB) error {
			_, err := cat.PutPrice(context.Background(), tx, price, catalog.Write{Source: "evt_" + p.ID, Created: time.Now()})
			return err
		}); err != nil {
			v.t.Fatal(err)
		}
	}
}

func (v *env) rows() int {
	v.t.Helper()
	var n int64
	if err := v.db.Raw(`SELECT count(*) FROM checkout_sessions`).Scan(&n).Error; err != nil {
		v.t.Fatal(err)
	}
	return int(n)
}

var proMonthly = stripeevents.Price{ID: "price_pro_m", Product: "prod_pro", LookupKey: "pro_monthly", UnitAmount: 2000, Interval: "month"}

func TestCheckoutTakesALookupKeyAndATypedPromotionCode(t *testing.T) {
	t.Parallel()
	v := newEnv(t, envOpts{successURL: successURL, cancelURL: cancelURL, stripeMock: true})
	v.link("u1", "cus_u1", false)
	v.sell(proMonthly)
	promo := stripeemu.NewCatalog(v.proxy, false).PutPromotionCode(stripeemu.PromotionCodeSpec{Code: "WELCOME20", PercentOff: 20})

	v.open("u1", map[string]any{"request_id": "r1", "price_lookup_key": "pro_monthly", "promotion_code": "welcome20"})
	reqs := v.proxy.Filter(http.MethodPost, sessionsPath)
	if len(reqs) != 1 || reqs[0].Status != http.StatusOK {
		t.Fatalf("session requests %+v: stripe-mock must accept the parameters", reqs)
	}
	expectForm(t, reqs[0], map[string]string{"line_items[0][price]": "price_pro_m", "discounts[0][promotion_code]": promo})
	if reqs[0].Form.Has("allow_promotion_codes") || reqs[0].Form.Has("automatic_tax[enabled]") {
		t.Errorf("form %v: neither allow_promotion_codes nor tax was asked for", reqs[0].Form)
	}
	// The same request again answers from the row; another code under the same request_id is
	// another request.
	apiRec := v.post(checkoutPath("u1"), map[string]any{"request_id": "r1", "price_lookup_key": "pro_monthly", "promotion_code": "welcome20"})
	if apiRec.Code != http.StatusOK {
		t.Fatalf("repeat: %d %s", apiRec.Code, apiRec.Body.String())
	}
	expectError(t, v.post(checkoutPath("u1"), map[string]any{"request_id": "r1", "price_lookup_key": "pro_monthly"}),
		http.StatusConflict, "idempotency_conflict")

	v.open("u1", map[string]any{"request_id": "r2", "price_id": "price_pro_m", "allow_promotion_codes": true})
	reqs = v.proxy.Filter(http.MethodPost, sessionsPath)
	expectForm(t, reqs[len(reqs)-1], map[string]string{"allow_promotion_codes": "true", "line_items[0][price]": "price_pro_m"})
	if reqs[len(reqs)-1].Form.Has("discounts[0][promotion_code]") {
		t.Error("a discount sent with allow_promotion_codes")
	}
}

func TestCheckoutAsksStripeTaxWhenConfigured(t *testing.T) {
	t.Parallel()
	v := newEnv(t, envOpts{successURL: successURL, cancelURL: cancelURL, stripeMock: true, automaticTax: true})
	v.link("u1", "cus_u1", false)
	v.open("u1", map[string]any{"request_id": "r1", "price_id": "price_pro"})
	reqs := v.proxy.Filter(http.MethodPost, sessionsPath)
	if len(reqs) != 1 || reqs[0].Status != http.StatusOK {
		t.Fatalf("session requests %+v: stripe-mock must accept the parameters", reqs)
	}
	expectForm(t, reqs[0], map[string]string{"automatic_tax[enabled]": "true", "customer_update[address]": "auto",
		"billing_address_collection": "required"})
}

func TestCheckoutRefusesWhatStripeWouldRefuse(t *testing.T) {
	t.Parallel()
	v := defaultEnv(t)
	v.link("u1", "cus_u1", false)
	v.link("u2", "cus_u2", false)
	old := proMonthly
	old.ID, old.LookupKey, old.Inactive = "price_old", "old_monthly", true
	v.sell(proMonthly, old)
	codes := stripeemu.NewCatalog(v.proxy, false)
	codes.PutPromotionCode(stripeemu.PromotionCodeSpec{Code: "OFF", PercentOff: 10, Inactive: true})
	codes.PutPromotionCode(stripeemu.PromotionCodeSpec{Code: "GONE", PercentOff: 10, ExpiresAt: time.Now().Add(-time.Hour)})
	codes.PutPromotionCode(stripeemu.PromotionCodeSpec{Code: "CAROL", AmountOff: 500, Customer: "cus_u2"})
	codes.PutPromotionCode(stripeemu.PromotionCodeSpec{Code: "USEDUP", AmountOff: 500, MaxRedemptions: 1, TimesRedeemed: 1})
	for _, tc := range []struct {
		name   string
		body   map[string]any
		status int
		code   string
	}{
		{"unknown lookup key", map[string]any{"price_lookup_key": "gold_monthly"}, http.StatusUnprocessableEntity, "unknown_price"},
		{"inactive lookup key", map[string]any{"price_lookup_key": "old_monthly"}, http.StatusUnprocessableEntity, "inactive_price"},
		{"inactive price", map[string]any{"price_id": "price_old"}, http.StatusUnprocessableEntity, "inactive_price"},
		{"price and lookup key", map[string]any{"price_id": "price_pro_m", "price_lookup_key": "pro_monthly"}, http.StatusBadRequest, "invalid_request"},
		{"unknown code", map[string]any{"price_id": "price_pro_m", "promotion_code": "NOSUCH"}, http.StatusUnprocessableEntity, "invalid_promotion_code"},
		{"inactive code", map[string]any{"price_id": "price_pro_m", "promotion_code": "OFF"}, http.StatusUnprocessableEntity, "invalid_promotion_code"},
		{"expired code", map[string]any{"price_id": "price_pro_m", "promotion_code": "gone"}, http.StatusUnprocessableEntity, "invalid_promotion_code"},
		{"another customer's code", map[string]any{"price_id": "price_pro_m", "promotion_code": "CAROL"}, http.StatusUnprocessableEntity, "invalid_promotion_code"},
		{"used up code", map[string]any{"price_id": "price_pro_m", "promotion_code": "USEDUP"}, http.StatusUnprocessableEntity, "invalid_promotion_code"},
		{"not a code", map[string]any{"price_id": "price_pro_m", "promotion_code": "50% off"}, http.StatusUnprocessableEntity, "invalid_promotion_code"},
		{"code and allow", map[string]any{"price_id": "price_pro_m", "promotion_code": "X", "allow_promotion_codes": true}, http.StatusBadRequest, "invalid_request"},
		{"too many seats", map[string]any{"price_id": "price_pro_m", "quantity": 10001}, http.StatusBadRequest, "invalid_quantity"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.body["request_id"] = "r1"
			expectError(t, v.post(checkoutPath("u1"), tc.body), tc.status, tc.code)
		})
	}
	if n := len(v.proxy.Filter(http.MethodPost, sessionsPath)); n != 0 {
		t.Errorf("%d sessions asked for refused requests", n)
	}
	if n := v.rows(); n != 0 {
		t.Errorf("%d checkout rows written by refused requests: the request_id must stay free", n)
	}
	// An unknown lookup key makes no Stripe customer for a user who has none yet.
	expectError(t, v.post(checkoutPath("u_new"), map[string]any{"request_id": "r1", "price_lookup_key": "gold_monthly"}),
		http.StatusUnprocessableEntity, "unknown_price")
	if n := len(v.proxy.Filter(http.MethodPost, "/v1/customers")); n != 0 {
		t.Errorf("%d Stripe customers made for a refused request", n)
	}
	// The customer the code is for may use it, under the request_id the refusals left free.
	v.open("u2", map[string]any{"request_id": "r1", "price_id": "price_pro_m", "promotion_code": "carol"})
}
