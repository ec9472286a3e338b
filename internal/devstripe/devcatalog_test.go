package devstripe

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v79"

	"billing/internal/stripeclient"
	"billing/internal/stripeemu"
	"billing/internal/stripeevents"
	"billing/internal/testenv"
)

// devSubscribe completes a Checkout of price × qty for a new customer and returns the customer
// and the subscription.
func devSubscribe(t *testing.T, d *DevStripe, price, qty string, extra url.Values) (string, string) {
	t.Helper()
	_, c := call(t, d.Proxy, http.MethodPost, "/v1/customers", url.Values{"email": {"a@example.com"}})
	cus := str(c, "id")
	f := url.Values{"line_items[0][price]": {price}, "line_items[0][quantity]": {qty}}
	for k, v := range extra {
		f[k] = v
	}
	status, res := devPost(t, d, "/dev/checkout/sessions/"+d.testSession(t, cus, f)+"/complete", nil)
	if status != http.StatusOK || res.Changes[0].Status != "active" {
		t.Fatalf("checkout: %d %+v", status, res)
	}
	return cus, res.Changes[0].Subscription
}

// devChangePlan confirms a plan change in the portal and returns the result.
func devChangePlan(t *testing.T, d *DevStripe, cus, sub, price, qty string) DevResult {
	t.Helper()
	status, ps := call(t, d.Proxy, http.MethodPost, "/v1/billing_portal/sessions", url.Values{"customer": {cus},
		"flow_data[type]": {"subscription_update_confirm"},
		"flow_data[subscription_update_confirm][subscription]":       {sub},
		"flow_data[subscription_update_confirm][items][0][id]":       {itemID(sub)},
		"flow_data[subscription_update_confirm][items][0][price]":    {price},
		"flow_data[subscription_update_confirm][items][0][quantity]": {qty}})
	if status != http.StatusOK {
		t.Fatalf("portal session: %d %v", status, ps)
	}
	status, res := devPost(t, d, "/dev/portal/sessions/"+str(ps, "id")+"/apply", nil)
	if status != http.StatusOK || len(res.Changes) != 1 || res.Changes[0].What != "changed" {
		t.Fatalf("portal change: %d %+v", status, res)
	}
	return res
}

func cents(amount int64, left, period int64) int64 {
	return int64(math.Round(float64(amount) * float64(left) / float64(period)))
}

func lineAmounts(inv map[string]any) (amounts []int64, prorations []bool) {
	for _, l := range inv["lines"].(map[string]any)["data"].([]any) {
		m := l.(map[string]any)
		amounts = append(amounts, int64(m["amount"].(float64)))
		prorations = append(prorations, m["proration"] == true)
	}
	return amounts, prorations
}

// An upgrade mid-period: the preview prices it by the seconds left; confirmed in the portal, its
// prorations wait for the renewal, whose invoice bills them with the new period; the customer's
// entitlements follow the plan.
func TestDevPlanChangeProratesOnTheRenewal(t *testing.T) {
	d, rec := newDevLife(t)
	cus, sub := devSubscribe(t, d, DevPricePro, "1", nil)
	if got := rec.types(); !strings.HasSuffix(got, "checkout.session.completed entitlements.active_entitlement_summary.updated") {
		t.Errorf("events of a Checkout of Pro: %s", got)
	}
	spec, _ := d.Account.Spec(sub)
	start, end := spec.CurrentPeriodStart.Unix(), spec.CurrentPeriodEnd.Unix()
	if inv := decode(d.Account.Invoice(spec.LatestInvoice.ID)); inv["amount_due"] != float64(DevUnitAmount) {
		t.Errorf("first invoice of Pro: %v", inv["amount_due"])
	}
	devPost(t, d, "/dev/advance", url.Values{"days": {"10.3"}})

	// The service previews the change first.
	at := d.Account.Now().Unix() + 7
	status, pv := call(t, d.Proxy, http.MethodPost, "/v1/invoices/create_preview", url.Values{"customer": {cus}, "subscription": {sub},
		"subscription_details[items][0][id]": {itemID(sub)}, "subscription_details[items][0][price]": {DevPriceTeam},
		"subscription_details[items][0][quantity]": {"2"}, "subscription_details[proration_behavior]": {"create_prorations"},
		"subscription_details[proration_date]": {itoa(at)}})
	if status != http.StatusOK {
		t.Fatalf("preview: %d %v", status, pv)
	}
	wantPreview := []int64{-cents(2000, end-at, end-start), cents(5000*2, end-at, end-start), 5000 * 2}
	if got, pr := lineAmounts(pv); !slices.Equal(got, wantPreview) || !pr[0] || !pr[1] || pr[2] ||
		pv["amount_due"] != float64(wantPreview[0]+wantPreview[1]+wantPreview[2]) || pv["next_payment_attempt"] != float64(end) {
		t.Errorf("preview lines %v (prorations %v), due %v; want %v", got, pr, pv["amount_due"], wantPreview)
	}

	res := devChangePlan(t, d, cus, sub, DevPriceTeam, "2")
	if got := rec.types(); got != "customer.subscription.updated entitlements.active_entitlement_summary.updated" {
		t.Errorf("events of an upgrade to Team: %s", got)
	}
	_, ents := call(t, d.Proxy, http.MethodGet, "/v1/entitlements/active_entitlements?customer="+cus, nil)
	if data, _ := ents["data"].([]any); len(data) != 2 || str(data[1].(map[string]any), "lookup_key") != "sso" {
		t.Errorf("entitlements of Team: %v", ents)
	}
	changed := res.Now.Unix()
	if n := len(d.Account.PendingItems(sub)); n != 2 {
		t.Errorf("%d pending items after the change, want 2", n)
	}

	_, res = devPost(t, d, "/dev/advance", url.Values{"days": {"21"}})
	if len(res.Changes) != 1 || res.Changes[0].What != "renewed" {
		t.Fatalf("renewal: %+v", res)
	}
	inv := decode(d.Account.Invoice(res.Changes[0].Invoice))
	want := []int64{-cents(2000, end-changed, end-start), cents(5000*2, end-changed, end-start), 5000 * 2}
	got, pr := lineAmounts(inv)
	if !slices.Equal(got, want) || !pr[0] || !pr[1] || pr[2] {
		t.Errorf("renewal lines %v (prorations %v), want %v", got, pr, want)
	}
	if due := want[0] + want[1] + want[2]; inv["amount_due"] != float64(due) || inv["amount_paid"] != float64(due) || inv["total"] != float64(due) {
		t.Errorf("renewal invoice: due %v paid %v total %v, want %d", inv["amount_due"], inv["amount_paid"], inv["total"], due)
	}
	if n := len(d.Account.PendingItems(sub)); n != 0 {
		t.Errorf("%d pending items after the renewal billed them", n)
	}
	// The next renewal is of Team alone.
	_, res = devPost(t, d, "/dev/advance", url.Values{"days": {"31"}})
	if inv := decode(d.Account.Invoice(res.Changes[0].Invoice)); inv["amount_due"] != float64(5000*2) {
		t.Errorf("the renewal after: %v", inv["amount_due"])
	}
}

// A downgrade whose credit outweighs the renewal leaves nothing due; the rest is the customer's
// balance, which the next invoice uses up.
func TestDevDowngradeCreditCarriesToTheNextInvoice(t *testing.T) {
	d, _ := newDevLife(t)
	cus, sub := devSubscribe(t, d, DevPriceTeam, "10", nil)
	spec, _ := d.Account.Spec(sub)
	start, end := spec.CurrentPeriodStart.Unix(), spec.CurrentPeriodEnd.Unix()
	at := devChangePlan(t, d, cus, sub, DevPricePro, "1").Now.Unix()

	_, res := devPost(t, d, "/dev/advance", url.Values{"days": {"32"}})
	inv := decode(d.Account.Invoice(res.Changes[0].Invoice))
	total := -cents(50000, end-at, end-start) + cents(2000, end-at, end-start) + 2000
	if total >= 0 {
		t.Fatalf("the downgrade should leave a credit: %d", total)
	}
	if inv["amount_due"] != float64(0) || inv["total"] != float64(total) || inv["ending_balance"] != float64(total) ||
		inv["status"] != "paid" || d.Account.Balance(cus) != total {
		t.Errorf("renewal after the downgrade: due %v total %v ending balance %v status %v, balance %d; want 0 due, %d",
			inv["amount_due"], inv["total"], inv["ending_balance"], inv["status"], d.Account.Balance(cus), total)
	}
	_, res = devPost(t, d, "/dev/advance", url.Values{"days": {"31"}})
	inv = decode(d.Account.Invoice(res.Changes[0].Invoice))
	if inv["amount_due"] != float64(max(total+2000, 0)) || inv["starting_balance"] != float64(total) || d.Account.Balance(cus) != min(total+2000, 0) {
		t.Errorf("the next renewal: due %v starting balance %v, balance %d; credit %d", inv["amount_due"], inv["starting_balance"], d.Account.Balance(cus), total)
	}
}

// A change from monthly to yearly restarts the cycle: an invoice of the year at once, the unused
// month credited on it.
func TestDevIntervalChangeInvoicesAtOnce(t *testing.T) {
	d, rec := newDevLife(t)
	cus, sub := devSubscribe(t, d, DevPricePro, "1", nil)
	spec, _ := d.Account.Spec(sub)
	start, end := spec.CurrentPeriodStart.Unix(), spec.CurrentPeriodEnd.Unix()
	devPost(t, d, "/dev/advance", url.Values{"days": {"5"}})
	rec.types()
	res := devChangePlan(t, d, cus, sub, DevPriceProYearly, "1")
	at := res.Now.Unix()
	if got := rec.types(); got != "customer.subscription.updated invoice.paid invoice.payment_succeeded" {
		t.Errorf("events of a change of interval: %s", got)
	}
	inv := decode(d.Account.Invoice(res.Changes[0].Invoice))
	want := []int64{-cents(2000, end-at, end-start), 20000}
	if got, _ := lineAmounts(inv); !slices.Equal(got, want) || inv["amount_due"] != float64(want[0]+want[1]) || inv["billing_reason"] != "subscription_update" {
		t.Errorf("invoice of the change: %v due %v, want %v", got, inv["amount_due"], want)
	}
	if spec, _ := d.Account.Spec(sub); spec.CurrentPeriodStart.Unix() != at || spec.CurrentPeriodEnd != spec.CurrentPeriodStart.AddDate(1, 0, 0) {
		t.Errorf("period after the change: %v to %v", spec.CurrentPeriodStart, spec.CurrentPeriodEnd)
	}
}

// A promotion code given to Checkout discounts every invoice of the subscription; Checkout
// refuses an unknown code and a code with allow_promotion_codes; automatic tax is complete, of 0.
func TestDevPromotionCodeLowersInvoices(t *testing.T) {
	d, _ := newDevLife(t)
	_, sub := devSubscribe(t, d, DevPriceTeam, "1", url.Values{"discounts[0][promotion_code]": {DevPromoWelcome20},
		"automatic_tax[enabled]": {"true"}})
	sc := stripeclient.New(d.Proxy.URL, "sk_test_dev", slog.New(slog.DiscardHandler))
	s, err := sc.Subscriptions.Get(sub, &stripe.SubscriptionParams{Expand: stripe.StringSlice([]string{"latest_invoice"})})
	if err != nil {
		t.Fatal(err)
	}
	inv := s.LatestInvoice
	wantDiscount := int64(math.Round(5000 * 0.2))
	if s.Discount == nil || s.Discount.PromotionCode.ID != DevPromoWelcome20 || inv.AmountDue != 5000-wantDiscount || inv.Subtotal != 5000 ||
		inv.Tax != 0 || inv.Discount == nil || inv.Discount.Coupon.PercentOff != 20 || len(inv.TotalDiscountAmounts) != 1 ||
		inv.TotalDiscountAmounts[0].Amount != wantDiscount || !inv.AutomaticTax.Enabled || inv.AutomaticTax.Status != "complete" {
		t.Errorf("first invoice with WELCOME20: due %d subtotal %d discount %+v amounts %+v tax %+v", inv.AmountDue, inv.Subtotal, inv.Discount, inv.TotalDiscountAmounts, inv.AutomaticTax)
	}
	_, res := devPost(t, d, "/dev/advance", url.Values{"days": {"31"}})
	if inv := decode(d.Account.Invoice(res.Changes[0].Invoice)); inv["amount_due"] != float64(5000-wantDiscount) {
		t.Errorf("renewal with WELCOME20: %v", inv["amount_due"])
	}
	if pc := decode(d.Catalog.PromotionCode(DevPromoWelcome20)); pc["times_redeemed"] != float64(1) {
		t.Errorf("WELCOME20 redeemed %v times, want 1", pc["times_redeemed"])
	}

	_, sub = devSubscribe(t, d, DevPricePro, "1", url.Values{"discounts[0][promotion_code]": {DevPromoTenOff}})
	spec, _ := d.Account.Spec(sub)
	if spec.LatestInvoice.AmountDue != DevUnitAmount-1000 {
		t.Errorf("Pro with TENOFF: %d", spec.LatestInvoice.AmountDue)
	}
	// Amount off never takes an invoice below 0.
	_, sub = devSubscribe(t, d, "price_cheap", "1", url.Values{"discounts[0][promotion_code]": {DevPromoTenOff}})
	d.Catalog.PutPrice(stripeevents.Price{ID: "price_cheap", Product: DevProductPro, UnitAmount: 500, Interval: "month"})
	_, res = devPost(t, d, "/dev/advance", url.Values{"days": {"31"}})
	for _, ch := range res.Changes {
		if ch.Subscription == sub {
			if inv := decode(d.Account.Invoice(ch.Invoice)); inv["amount_due"] != float64(0) || inv["total"] != float64(0) {
				t.Errorf("a 500 renewal with 1000 off: due %v total %v", inv["amount_due"], inv["total"])
			}
		}
	}

	_, c := call(t, d.Proxy, http.MethodPost, "/v1/customers", url.Values{"email": {"b@example.com"}})
	for _, f := range []url.Values{
		{"discounts[0][promotion_code]": {"promo_nope"}},
		{"discounts[0][promotion_code]": {DevPromoTenOff}, "allow_promotion_codes": {"true"}},
	} {
		f.Set("mode", "subscription")
		f.Set("customer", str(c, "id"))
		f.Set("line_items[0][price]", DevPricePro)
		if status, _ := call(t, d.Proxy, http.MethodPost, "/v1/checkout/sessions", f); status != http.StatusBadRequest {
			t.Errorf("session with %v: %d, want 400", f, status)
		}
	}
	status, s2 := call(t, d.Proxy, http.MethodPost, "/v1/checkout/sessions", url.Values{"mode": {"subscription"}, "customer": {str(c, "id")},
		"line_items[0][price]": {DevPricePro}, "allow_promotion_codes": {"true"}, "automatic_tax[enabled]": {"true"}})
	if status != http.StatusOK || s2["allow_promotion_codes"] != true || str(s2, "automatic_tax", "status") != "complete" {
		t.Errorf("session allowing codes: %d %v", status, s2)
	}
}

// At start the dev Stripe tells the service its catalog, products before prices, waiting for a
// service that is not answering yet; the same catalog is listed.
func TestDevSendsTheSeededCatalog(t *testing.T) {
	var mu sync.Mutex
	var got []map[string]any
	refuse := 6
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		if refuse > 0 {
			refuse--
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
		var ev map[string]any
		_ = json.Unmarshal(b, &ev)
		got = append(got, ev)
	}))
	t.Cleanup(srv.Close)
	d := NewDevStripe(stripeemu.New(t, testenv.StripeMockURL(t)))
	// Fewer attempts than the service's start takes: only SendWithin's patience gets through.
	d.Webhooks = &WebhookSender{URL: srv.URL, Secret: "whsec_x", Attempts: 2, Backoff: time.Millisecond}
	ds, err := d.SendCatalog(context.Background(), time.Minute)
	if err != nil || len(ds) != 6 || ds[0].Attempts != 7 {
		t.Fatalf("deliveries %+v, %v", ds, err)
	}
	var seen []string
	for _, ev := range got {
		obj := ev["data"].(map[string]any)["object"].(map[string]any)
		seen = append(seen, ev["type"].(string)+":"+str(obj, "id"))
		if ev["type"] == "price.created" && str(obj, "id") == DevPriceTeamYearly &&
			(obj["unit_amount"] != float64(50000) || str(obj, "lookup_key") != "team_yearly" || str(obj, "recurring", "interval") != "year" || str(obj, "product") != DevProductTeam) {
			t.Errorf("price.created of team yearly: %v", obj)
		}
	}
	want := "product.created:prod_dev_pro product.created:prod_dev_team price.created:price_pro price.created:price_pro_yearly price.created:price_team price.created:price_team_yearly"
	if strings.Join(seen, " ") != want {
		t.Errorf("sent %v\nwant %s", seen, want)
	}

	_, l := call(t, d.Proxy, http.MethodGet, "/v1/prices?lookup_keys[0]=pro_monthly&lookup_keys[1]=team_monthly", nil)
	if data, _ := l["data"].([]any); len(data) != 2 || str(data[0].(map[string]any), "id") != DevPriceTeam ||
		data[1].(map[string]any)["unit_amount"] != float64(DevUnitAmount) {
		t.Errorf("the monthly prices by lookup key: %v", l)
	}
	_, f := call(t, d.Proxy, http.MethodGet, "/v1/products/"+DevProductTeam+"/features", nil)
	if data, _ := f["data"].([]any); len(data) != 2 || str(data[1].(map[string]any), "entitlement_feature", "lookup_key") != "sso" {
		t.Errorf("Team's features: %v", f)
	}
	_, pc := call(t, d.Proxy, http.MethodGet, "/v1/promotion_codes?code=tenoff&active=true", nil)
	if data, _ := pc["data"].([]any); len(data) != 1 || data[0].(map[string]any)["coupon"].(map[string]any)["amount_off"] != float64(1000) {
		t.Errorf("TENOFF: %v", pc)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
