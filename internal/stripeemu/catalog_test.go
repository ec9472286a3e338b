package stripeemu

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/client"

	"billing/internal/stripeclient"
	"billing/internal/stripeevents"
	"billing/internal/testenv"
)

// newCatalog serves a catalog in front of an upstream that answers 418, so that a test sees what
// passed through to "stripe-mock".
func newCatalog(t *testing.T) (*Proxy, *Catalog, *client.API) {
	t.Helper()
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusTeapot, map[string]any{"error": map[string]any{"type": "api_error", "message": "upstream " + r.URL.Path}})
	})
	p := New(t, newTestServer(t, upstream))
	return p, NewCatalog(p, false), stripeclient.New(p.URL, "sk_test_catalog", slog.New(slog.DiscardHandler))
}

// stripe-go's iterator walks every price once over pages of 100, newest first; the filters pick
// by active, product and lookup keys; tiers come with a tiered price; what the catalog does not
// serve passes through.
func TestCatalogPagesAndFiltersPrices(t *testing.T) {
	p, c, sc := newCatalog(t)
	c.PutProduct(stripeevents.Product{ID: "prod_a", Name: "A"})
	c.PutProduct(stripeevents.Product{ID: "prod_b", Name: "B", Inactive: true})
	const n = 250
	inactive, ofB := 0, 0
	for i := range n {
		pr := stripeevents.Price{ID: fmt.Sprintf("price_%03d", i), Product: "prod_a", UnitAmount: int64(100 + i), Interval: "month",
			LookupKey: fmt.Sprintf("key_%03d", i)}
		if i%7 == 0 {
			pr.Inactive = true
			inactive++
		}
		if i%5 == 0 {
			pr.Product = "prod_b"
			ofB++
		}
		if i == 3 {
			pr.Tiers = []stripeevents.Tier{{UpTo: 10, UnitAmount: 50}, {UnitAmount: 40}}
		}
		c.PutPrice(pr)
	}

	list := func(params *stripe.PriceListParams) []*stripe.Price {
		t.Helper()
		params.Limit = stripe.Int64(100)
		var out []*stripe.Price
		it := sc.Prices.List(params)
		for it.Next() {
			out = append(out, it.Price())
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	params := &stripe.PriceListParams{}
	params.AddExpand("data.tiers")
	all := list(params)
	if len(all) != n || all[0].ID != "price_249" || all[n-1].ID != "price_000" {
		t.Fatalf("listed %d prices, first %s, last %s; want %d newest first", len(all), all[0].ID, all[n-1].ID, n)
	}
	if pages := len(p.Filter(http.MethodGet, "/v1/prices")); pages != 3 {
		t.Errorf("%d pages of 100 for %d prices, want 3", pages, n)
	}
	seen := map[string]bool{}
	for _, pr := range all {
		if seen[pr.ID] {
			t.Fatalf("%s listed twice", pr.ID)
		}
		seen[pr.ID] = true
		if pr.ID == "price_003" && (pr.BillingScheme != stripe.PriceBillingSchemeTiered || len(pr.Tiers) != 2 || pr.Tiers[0].UpTo != 10) {
			t.Errorf("the tiered price: %+v", pr)
		}
	}
	if got := list(&stripe.PriceListParams{Active: stripe.Bool(true)}); len(got) != n-inactive {
		t.Errorf("active prices: %d, want %d", len(got), n-inactive)
	}
	if got := list(&stripe.PriceListParams{Active: stripe.Bool(false)}); len(got) != inactive || got[0].Active {
		t.Errorf("inactive prices: %d, want %d", len(got), inactive)
	}
	if got := list(&stripe.PriceListParams{Product: stripe.String("prod_b")}); len(got) != ofB || got[0].Product.ID != "prod_b" {
		t.Errorf("prices of prod_b: %d, want %d", len(got), ofB)
	}
	got := list(&stripe.PriceListParams{LookupKeys: stripe.StringSlice([]string{"key_010", "key_042"})})
	if len(got) != 2 || got[0].ID != "price_042" || got[1].ID != "price_010" || got[0].UnitAmount != 142 {
		t.Errorf("prices by lookup key: %v", got)
	}

	// A page stops at its limit and says there is more; the next starts after its last.
	_, page1 := call(t, p, http.MethodGet, "/v1/prices?limit=2&active=true", nil)
	data, _ := page1["data"].([]any)
	if len(data) != 2 || page1["has_more"] != true || str(data[1].(map[string]any), "id") != "price_248" {
		t.Fatalf("first page: %v", page1)
	}
	_, page2 := call(t, p, http.MethodGet, "/v1/prices?limit=2&active=true&starting_after=price_248", nil)
	if data, _ := page2["data"].([]any); len(data) != 2 || str(data[0].(map[string]any), "id") != "price_247" {
		t.Errorf("second page: %v", page2)
	}
	if status, _ := call(t, p, http.MethodGet, "/v1/prices?limit=101", nil); status != http.StatusBadRequest {
		t.Errorf("limit 101: %d, want 400", status)
	}

	// Retrieve; unknown ids are 404 resource_missing; a product list holds archived ones too.
	pr, err := sc.Prices.Get("price_007", nil)
	if err != nil || pr.Active || pr.UnitAmount != 107 || pr.Recurring.Interval != "month" {
		t.Errorf("price_007: %+v, %v", pr, err)
	}
	c.DeletePrice("price_007")
	var se *stripe.Error
	if _, err := sc.Prices.Get("price_007", nil); !errors.As(err, &se) || se.HTTPStatusCode != 404 || se.Code != stripe.ErrorCodeResourceMissing {
		t.Errorf("deleted price: %v", err)
	}
	if _, err := sc.Products.Get("prod_zzz", nil); !errors.As(err, &se) || se.HTTPStatusCode != 404 || se.Code != stripe.ErrorCodeResourceMissing {
		t.Errorf("unknown product: %v", err)
	}
	var products []string
	it := sc.Products.List(&stripe.ProductListParams{})
	for it.Next() {
		products = append(products, it.Product().ID)
	}
	if it.Err() != nil || fmt.Sprint(products) != "[prod_b prod_a]" {
		t.Errorf("products: %v %v", products, it.Err())
	}
	c.ArchiveProduct("prod_a")
	if _, l := call(t, p, http.MethodGet, "/v1/products?active=true", nil); len(l["data"].([]any)) != 0 {
		t.Errorf("active products after archiving both: %v", l)
	}

	// Not the catalog's: stripe-mock answers.
	if status, _ := call(t, p, http.MethodPost, "/v1/prices", url.Values{"currency": {"usd"}}); status != http.StatusTeapot {
		t.Errorf("a price create: %d, want stripe-mock's answer", status)
	}
	if status, _ := call(t, p, http.MethodGet, "/v1/products/search?query=x", nil); status != http.StatusTeapot {
		t.Errorf("a product search: %d, want stripe-mock's answer", status)
	}
}

// A product's features page like any list, each an entitlements feature by lookup key.
func TestCatalogProductFeatures(t *testing.T) {
	p, c, sc := newCatalog(t)
	c.PutProduct(stripeevents.Product{ID: "prod_team", Name: "Team"})
	c.SetProductFeatures("prod_team", "api", "sso", "audit")

	_, page1 := call(t, p, http.MethodGet, "/v1/products/prod_team/features?limit=2", nil)
	data, _ := page1["data"].([]any)
	if len(data) != 2 || page1["has_more"] != true {
		t.Fatalf("first page: %v", page1)
	}
	last := str(data[1].(map[string]any), "id")
	_, page2 := call(t, p, http.MethodGet, "/v1/products/prod_team/features?limit=2&starting_after="+last, nil)
	if data, _ := page2["data"].([]any); len(data) != 1 || page2["has_more"] != false ||
		str(data[0].(map[string]any), "entitlement_feature", "lookup_key") != "audit" {
		t.Errorf("second page: %v", page2)
	}

	var keys []string
	it := sc.ProductFeatures.List(&stripe.ProductFeatureListParams{Product: stripe.String("prod_team")})
	for it.Next() {
		f := it.ProductFeature()
		if f.Object != "product_feature" || f.EntitlementFeature.ID != "feat_"+f.EntitlementFeature.LookupKey || !f.EntitlementFeature.Active {
			t.Errorf("feature %+v", f.EntitlementFeature)
		}
		keys = append(keys, f.EntitlementFeature.LookupKey)
	}
	if it.Err() != nil || fmt.Sprint(keys) != "[api sso audit]" {
		t.Errorf("features: %v %v", keys, it.Err())
	}
	if status, _ := call(t, p, http.MethodGet, "/v1/products/prod_none/features", nil); status != http.StatusNotFound {
		t.Errorf("features of an unknown product: %d, want 404", status)
	}
}

// A code is found whatever its case; the active filter leaves out switched-off, expired and used-up
// codes; the coupon says what it takes off.
func TestCatalogPromotionCodes(t *testing.T) {
	p, c, sc := newCatalog(t)
	now := time.Unix(1_750_000_000, 0)
	c.SetClock(func() time.Time { return now })
	welcome := c.PutPromotionCode(PromotionCodeSpec{Code: "WELCOME20", PercentOff: 20})
	c.PutPromotionCode(PromotionCodeSpec{Code: "OLD", AmountOff: 500, Inactive: true})
	c.PutPromotionCode(PromotionCodeSpec{Code: "SUMMER", AmountOff: 1000, ExpiresAt: now.Add(time.Hour)})
	c.PutPromotionCode(PromotionCodeSpec{Code: "VIP", PercentOff: 50, Customer: "cus_vip", MaxRedemptions: 1, TimesRedeemed: 1})

	find := func(code string, active *bool) []*stripe.PromotionCode {
		t.Helper()
		var out []*stripe.PromotionCode
		it := sc.PromotionCodes.List(&stripe.PromotionCodeListParams{Code: stripe.String(code), Active: active})
		for it.Next() {
			out = append(out, it.PromotionCode())
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	got := find("welcome20", stripe.Bool(true))
	if len(got) != 1 || got[0].ID != welcome || got[0].Code != "WELCOME20" || got[0].Coupon.PercentOff != 20 ||
		got[0].Coupon.Duration != stripe.CouponDurationForever || !got[0].Coupon.Valid || got[0].Customer != nil {
		t.Errorf("welcome20: %+v", got)
	}
	if got := find("old", stripe.Bool(true)); len(got) != 0 {
		t.Errorf("an inactive code listed as active: %+v", got[0])
	}
	if got := find("OLD", stripe.Bool(false)); len(got) != 1 || got[0].Active || got[0].Coupon.AmountOff != 500 || got[0].Coupon.Currency != "usd" {
		t.Errorf("the inactive code: %+v", got)
	}
	if got := find("Summer", stripe.Bool(true)); len(got) != 1 || got[0].ExpiresAt != now.Add(time.Hour).Unix() {
		t.Errorf("summer before it expires: %+v", got)
	}
	now = now.Add(2 * time.Hour)
	if got := find("SUMMER", stripe.Bool(true)); len(got) != 0 {
		t.Errorf("an expired code listed as active")
	}
	if got := find("SUMMER", nil); len(got) != 1 || got[0].Active {
		t.Errorf("summer after it expired: %+v", got)
	}
	if got := find("vip", nil); len(got) != 1 || got[0].Active || got[0].Customer.ID != "cus_vip" || got[0].MaxRedemptions != 1 {
		t.Errorf("a used-up code for one customer: %+v", got)
	}
	if got := find("NOPE", nil); len(got) != 0 {
		t.Errorf("an unknown code found: %+v", got)
	}
	if status, _ := call(t, p, http.MethodGet, "/v1/promotion_codes/promo_none", nil); status != http.StatusNotFound {
		t.Errorf("unknown promotion code: %d, want 404", status)
	}
}

// The preview of a mid-period upgrade credits the unused time on the old price × quantity and
// charges the remaining time on the new one, by the seconds left, then bills the next period at
// the new price; a subscription the account does not know is stripe-mock's.
func TestInvoicePreviewProratesAMidPeriodUpgrade(t *testing.T) {
	p := New(t, testenv.StripeMockURL(t))
	acct := NewAccount(p, false)
	c := NewCatalog(p, false)
	c.PutProduct(stripeevents.Product{ID: "prod_pro", Name: "Pro"})
	c.PutProduct(stripeevents.Product{ID: "prod_team", Name: "Team"})
	c.PutPrice(stripeevents.Price{ID: "price_pro", Product: "prod_pro", UnitAmount: 2000, Interval: "month"})
	c.PutPrice(stripeevents.Price{ID: "price_team", Product: "prod_team", UnitAmount: 5000, Interval: "month"})
	start := time.Date(2024, 6, 1, 0, 0, 0, 0, time.UTC)
	end := start.AddDate(0, 1, 0)
	cus := acct.AddCustomer(CustomerSpec{Email: "a@example.com"})
	sub := acct.PutSubscription(SubscriptionSpec{Customer: cus, Status: "active", PriceID: "price_pro", Quantity: 2,
		CurrentPeriodStart: start, CurrentPeriodEnd: end})
	sc := stripeclient.New(p.URL, "sk_test_preview", slog.New(slog.DiscardHandler))

	s, err := sc.Subscriptions.Get(sub, nil)
	if err != nil || s.Items.Data[0].Price.UnitAmount != 2000 || s.Items.Data[0].Price.Product.ID != "prod_pro" {
		t.Fatalf("the subscription's item carries the catalog's price: %+v, %v", s, err)
	}
	at := start.Add(12*24*time.Hour + 3*time.Hour + 17*time.Minute + 9*time.Second)
	inv, err := sc.Invoices.CreatePreview(&stripe.InvoiceCreatePreviewParams{
		Customer: stripe.String(cus), Subscription: stripe.String(sub),
		SubscriptionDetails: &stripe.InvoiceCreatePreviewSubscriptionDetailsParams{
			Items: []*stripe.InvoiceCreatePreviewSubscriptionDetailsItemParams{{
				ID: stripe.String(s.Items.Data[0].ID), Price: stripe.String("price_team"), Quantity: stripe.Int64(3)}},
			ProrationBehavior: stripe.String("create_prorations"),
			ProrationDate:     stripe.Int64(at.Unix()),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	left, period := float64(end.Unix()-at.Unix()), float64(end.Unix()-start.Unix())
	credit := -int64(math.Round(2000 * 2 * left / period))
	charge := int64(math.Round(5000 * 3 * left / period))
	next := int64(5000 * 3)
	if credit == 0 || charge == 0 || float64(charge) == 5000*3*left/period {
		t.Fatalf("the proration date should leave a fraction of a cent to round: %d %d", credit, charge)
	}
	if len(inv.Lines.Data) != 3 {
		t.Fatalf("%d lines, want 3: %+v", len(inv.Lines.Data), inv.Lines.Data)
	}
	l := inv.Lines.Data
	if l[0].Amount != credit || !l[0].Proration || l[0].Price.ID != "price_pro" || l[0].Quantity != 2 || l[0].Period.Start != at.Unix() || l[0].Period.End != end.Unix() {
		t.Errorf("credit line %+v, want %d", l[0], credit)
	}
	if l[1].Amount != charge || !l[1].Proration || l[1].Price.ID != "price_team" || l[1].Quantity != 3 {
		t.Errorf("charge line %+v, want %d", l[1], charge)
	}
	if l[2].Amount != next || l[2].Proration || l[2].Period.Start != end.Unix() || l[2].Period.End != end.AddDate(0, 1, 0).Unix() {
		t.Errorf("next period's line %+v, want %d", l[2], next)
	}
	if want := credit + charge + next; inv.AmountDue != want || inv.Total != want || inv.Subtotal != want || inv.Tax != 0 ||
		inv.Status != stripe.InvoiceStatusDraft || inv.Currency != "usd" || inv.NextPaymentAttempt != end.Unix() {
		t.Errorf("preview: amount_due %d total %d subtotal %d status %s next attempt %d; want %d due at %d",
			inv.AmountDue, inv.Total, inv.Subtotal, inv.Status, inv.NextPaymentAttempt, want, end.Unix())
	}

	// Quantity only: the price stays; no proration: only the next period.
	inv, err = sc.Invoices.CreatePreview(&stripe.InvoiceCreatePreviewParams{Subscription: stripe.String(sub),
		SubscriptionDetails: &stripe.InvoiceCreatePreviewSubscriptionDetailsParams{
			Items:             []*stripe.InvoiceCreatePreviewSubscriptionDetailsItemParams{{ID: stripe.String(s.Items.Data[0].ID), Quantity: stripe.Int64(5)}},
			ProrationBehavior: stripe.String("none")}})
	if err != nil || len(inv.Lines.Data) != 1 || inv.AmountDue != 5*2000 {
		t.Errorf("5 seats of Pro without proration: %+v, %v", inv, err)
	}

	// Not the account's: stripe-mock's fixture.
	inv, err = sc.Invoices.CreatePreview(&stripe.InvoiceCreatePreviewParams{Customer: stripe.String("cus_x"), Subscription: stripe.String("sub_unknown")})
	if err != nil || strings.HasPrefix(inv.ID, "upcoming_in_") {
		t.Errorf("preview of an unknown subscription: %+v, %v", inv, err)
	}
	if n := p.Executed(http.MethodPost, "/v1/invoices/create_preview"); n != 3 {
		t.Errorf("%d previews executed, want 3", n)
	}
}
