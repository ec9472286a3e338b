package admin

import (
	"context"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"golang.org/x/net/html"
	"gorm.io/gorm"

	"billing/billing"
	"billing/catalog"
	"billing/customers"
	"billing/internal/httpserver"
	"billing/internal/stripeevents"
)

// catalogEnv is env with the catalog's handlers registered and a console (of the given mode)
// that reads the catalog, or none.
type catalogEnv struct {
	*env
	cat *catalog.Service
}

func newCatalogEnv(t *testing.T, live, withCatalog bool) *catalogEnv {
	t.Helper()
	e := newEnv(t)
	now := func() time.Time { return at(0) }
	cat := catalog.New(catalog.Deps{DB: e.db, Livemode: live, Now: now})
	cat.Register(e.reg)
	// A console of its own: newEnv's reads holds and dead letters only.
	e.echo = echo.New()
	e.echo.HTTPErrorHandler = httpserver.ErrorHandler(slog.New(slog.DiscardHandler))
	d := Deps{Holds: e.svc, Subscriptions: e.svc, Policy: e.ents, People: customers.NewDirectory(e.db), Accounts: e.svc,
		Livemode: live, Now: now}
	if withCatalog {
		d.Catalog = cat
	}
	New(d).Mount(e.echo.Group("/admin"))
	return &catalogEnv{env: e, cat: cat}
}

// features stores a product's features as the features read does.
func (e *catalogEnv) features(t *testing.T, live bool, productID string, readAt time.Time, keys ...string) {
	t.Helper()
	err := e.db.Transaction(func(tx *gorm.DB) error {
		ok, err := e.cat.PutFeatures(context.Background(), tx, live, productID, keys, readAt)
		if err == nil && !ok {
			t.Errorf("features of %s not stored", productID)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

const hostile = `<script>alert("x")</script>`

// seedCatalog gives test mode: Pro (active, two features) with monthly, quarterly, yearly
// (archived), tiered metered and yen prices and a deleted one; Legacy (archived) with a price
// active by itself; Gone (deleted); a product with a hostile name; a price whose product is not
// known. Live mode has a product and a price of its own.
func (e *catalogEnv) seedCatalog(t *testing.T) {
	t.Helper()
	prod := func(id string, sec int64, live bool, p stripeevents.Product) []byte {
		return stripeevents.ProductEvent(id, catalog.EventProductCreated, at(sec), live, p)
	}
	price := func(id string, sec int64, p stripeevents.Price) []byte {
		return stripeevents.PriceEvent(id, catalog.EventPriceCreated, at(sec), false, p)
	}
	e.handle(t,
		prod("evt_p1", 1, false, stripeevents.Product{ID: "prod_pro", Name: "Pro", Description: "For teams"}),
		prod("evt_p2", 1, false, stripeevents.Product{ID: "prod_old", Name: "Legacy", Inactive: true}),
		prod("evt_p3", 1, false, stripeevents.Product{ID: "prod_gone", Name: "Gone"}),
		stripeevents.ProductEvent("evt_p3d", catalog.EventProductDeleted, at(2), false, stripeevents.Product{ID: "prod_gone", Name: "Gone"}),
		prod("evt_p4", 1, false, stripeevents.Product{ID: "prod_xss", Name: hostile, Description: "<b>bold</b>"}),
		prod("evt_pl", 1, true, stripeevents.Product{ID: "prod_live", Name: "Live Pro"}),
		price("evt_c1", 3, stripeevents.Price{ID: "price_pro_m", Product: "prod_pro", LookupKey: "pro_monthly", Nickname: "Monthly",
			UnitAmount: 2500, Interval: "month"}),
		price("evt_c2", 3, stripeevents.Price{ID: "price_pro_q", Product: "prod_pro", UnitAmount: 6900, Interval: "month", IntervalCount: 3}),
		price("evt_c3", 3, stripeevents.Price{ID: "price_pro_y", Product: "prod_pro", LookupKey: "pro_yearly", UnitAmount: 24000,
			Interval: "year", Inactive: true}),
		price("evt_c4", 3, stripeevents.Price{ID: "price_metered", Product: "prod_pro", Interval: "month", UsageType: "metered",
			Meter: "mtr_calls", Tiers: []stripeevents.Tier{{UpTo: 1000, FlatAmount: 500}, {UnitAmount: 2}}}),
		price("evt_c5", 3, stripeevents.Price{ID: "price_yen", Product: "prod_pro", Currency: "jpy", UnitAmount: 500}),
		price("evt_c6", 3, stripeevents.Price{ID: "price_del", Product: "prod_pro", UnitAmount: 100}),
		stripeevents.PriceEvent("evt_c6d", catalog.EventPriceDeleted, at(4), false,
			stripeevents.Price{ID: "price_del", Product: "prod_pro", UnitAmount: 100, Inactive: true}),
		price("evt_c7", 3, stripeevents.Price{ID: "price_old", Product: "prod_old", UnitAmount: 900, Interval: "month"}),
		price("evt_c8", 3, stripeevents.Price{ID: "price_xss", Product: "prod_xss", Nickname: "<img src=x>", UnitAmount: 100, Interval: "month"}),
		price("evt_c9", 3, stripeevents.Price{ID: "price_orphan", Product: "prod_unknown", LookupKey: "orphan", UnitAmount: 700}),
		stripeevents.PriceEvent("evt_cl", catalog.EventPriceCreated, at(3), true,
			stripeevents.Price{ID: "price_live", Product: "prod_live", UnitAmount: 4900, Interval: "month"}),
	)
	e.features(t, false, "prod_pro", at(60), "seats", "api")
}

// section is the product's section of the catalog page, nil when there is none.
func productSection(doc *html.Node, productID string) *html.Node {
	var out *html.Node
	walk(doc, func(n *html.Node) {
		if n.Type == html.ElementNode && n.Data == "section" && attr(n, "data-product-id") == productID {
			out = n
		}
	})
	return out
}

// byClass is the text of the first element under n with the class.
func byClass(n *html.Node, class string) string {
	out, found := "", false
	walk(n, func(m *html.Node) {
		if !found && m.Type == html.ElementNode && slices.Contains(strings.Fields(attr(m, "class")), class) {
			out, found = text(m), true
		}
	})
	return out
}

func TestCatalogPageListsProductsPricesAndStates(t *testing.T) {
	t.Parallel()
	e := newCatalogEnv(t, false, true)
	e.seedCatalog(t)

	rec := e.get(t, pathCatalog)
	if rec.Code != http.StatusOK {
		t.Fatalf("GET catalog: %d %s", rec.Code, rec.Body)
	}
	page := rec.Body.String()
	doc := parse(t, page)

	// The test mode's products by name; live mode's are another world.
	var order []string
	walk(doc, func(n *html.Node) {
		if n.Type == html.ElementNode && n.Data == "section" && attr(n, "data-product-id") != "" {
			order = append(order, attr(n, "data-product-id"))
		}
	})
	if want := []string{"prod_xss", "prod_gone", "prod_old", "prod_pro"}; !slices.Equal(order, want) {
		t.Errorf("products %v, want %v", order, want)
	}
	if strings.Contains(page, "prod_live") || strings.Contains(page, "price_live") || byID(doc, "no-catalog") != "" {
		t.Error("the catalog page shows live mode's catalog in test mode, or says it is empty")
	}

	pro := productSection(doc, "prod_pro")
	if pro == nil {
		t.Fatal("no section for prod_pro")
	}
	for class, want := range map[string]string{
		"product-name": "Pro", "state": "active", "description": "For teams",
		"features": "api seats read from Stripe 2024-06-01 00:01:00 UTC", "product-id": "prod_pro · dashboard",
	} {
		if got := byClass(pro, class); got != want {
			t.Errorf("prod_pro .%s = %q, want %q", class, got, want)
		}
	}
	if got := byClass(pro, "set-by"); !strings.HasPrefix(got, "evt_p1 created 2024-06-01 00:00:01 UTC") {
		t.Errorf("prod_pro set by %q", got)
	}
	var links []string
	walk(pro, func(n *html.Node) {
		if n.Type == html.ElementNode && n.Data == "a" {
			links = append(links, attr(n, "href"))
		}
	})
	if !slices.Contains(links, "https://dashboard.stripe.com/test/products/prod_pro") || !slices.Contains(links, "/admin/ui/events/evt_p1") {
		t.Errorf("prod_pro links: %v", links)
	}

	prices := cells(t, doc, "prices-prod_pro", "data-price-id")
	if got := rowsOf(doc, "prices-prod_pro", "data-price-id"); len(got) != 6 {
		t.Errorf("prod_pro prices %v, want 6", got)
	}
	for id, want := range map[string]map[string]string{
		"price_pro_m": {"lookup-key": "pro_monthly", "nickname": "Monthly", "amount": "25.00 USD", "period": "every month",
			"usage": "licensed", "state": "active", "stripe.href": "https://dashboard.stripe.com/test/prices/price_pro_m"},
		"price_pro_q": {"lookup-key": "none", "amount": "69.00 USD", "period": "every 3 months", "state": "active"},
		"price_pro_y": {"lookup-key": "pro_yearly", "amount": "240.00 USD", "period": "every year", "state": "archived"},
		"price_metered": {"amount": "tiered (graduated) up to 1000: 5.00 USD flat above 1000: 0.02 USD per unit",
			"period": "every month", "usage": "metered meter mtr_calls", "state": "active"},
		"price_yen": {"amount": "500 JPY", "period": "one-time", "usage": "", "state": "active"},
		"price_del": {"state": "deleted"},
	} {
		for k, v := range want {
			if got := prices[id][k]; got != v {
				t.Errorf("%s %s = %q, want %q", id, k, got, v)
			}
		}
	}
	if _, ok := prices["price_pro_m"]["product"]; ok {
		t.Error("a product's own table repeats the product column")
	}

	// An archived product's active price cannot be sold; a deleted product says so.
	if got := byClass(productSection(doc, "prod_old"), "state"); got != "archived" {
		t.Errorf("prod_old state %q", got)
	}
	if got := byClass(productSection(doc, "prod_old"), "features-read"); got != "not read from Stripe yet" {
		t.Errorf("prod_old features read %q", got)
	}
	if got := cells(t, doc, "prices-prod_old", "data-price-id")["price_old"]["state"]; got != "inactive its product is not active" {
		t.Errorf("price_old state %q", got)
	}
	if got := byClass(productSection(doc, "prod_gone"), "state"); got != "deleted" {
		t.Errorf("prod_gone state %q", got)
	}
	if got := byClass(productSection(doc, "prod_gone"), "no-prices"); got != "No price of this product is known." {
		t.Errorf("prod_gone prices %q", got)
	}

	// A price whose product is not known yet is listed apart, with its product.
	orphans := cells(t, doc, "orphan-prices", "data-price-id")
	if len(orphans) != 1 || orphans["price_orphan"]["product"] != "prod_unknown" || orphans["price_orphan"]["amount"] != "7.00 USD" ||
		orphans["price_orphan"]["state"] != "active" {
		t.Errorf("orphans: %v", orphans)
	}

	// What Stripe sent is text, never markup.
	if strings.Contains(page, "<script>alert") || strings.Contains(page, "<b>bold") || strings.Contains(page, "<img src=x>") ||
		!strings.Contains(page, "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;") {
		t.Error("the catalog's names are not escaped")
	}
	xss := productSection(doc, "prod_xss")
	if byClass(xss, "product-name") != hostile || byClass(xss, "description") != "<b>bold</b>" ||
		cells(t, doc, "prices-prod_xss", "data-price-id")["price_xss"]["nickname"] != "<img src=x>" {
		t.Errorf("hostile names: %q %q", byClass(xss, "product-name"), byClass(xss, "description"))
	}

	// The navigation leads here and marks it.
	var nav string
	walk(doc, func(n *html.Node) {
		if n.Type == html.ElementNode && n.Data == "a" && attr(n, "href") == pathCatalog {
			nav = text(n) + "|" + attr(n, "class")
		}
	})
	if nav != "Catalog|current" {
		t.Errorf("nav link: %q", nav)
	}
}

func TestCatalogPageEmptyAndUnavailable(t *testing.T) {
	t.Parallel()
	// A live console over a database whose catalog is test mode's only: its catalog is empty.
	e := newCatalogEnv(t, true, true)
	e.handle(t, stripeevents.ProductEvent("evt_p1", catalog.EventProductCreated, at(1), false, stripeevents.Product{ID: "prod_pro", Name: "Pro"}),
		stripeevents.PriceEvent("evt_c1", catalog.EventPriceCreated, at(1), false, stripeevents.Price{ID: "price_pro_m", Product: "prod_pro", UnitAmount: 2500}))
	doc, _ := e.page(t, pathCatalog)
	if got := byID(doc, "no-catalog"); !strings.Contains(got, "live mode is empty") ||
		!strings.Contains(got, "product and price events") || !strings.Contains(got, "billing reconcile") {
		t.Errorf("empty catalog: %q", got)
	}
	var tables int
	walk(doc, func(n *html.Node) {
		if n.Type == html.ElementNode && (n.Data == "table" || n.Data == "section") {
			tables++
		}
	})
	if tables != 0 {
		t.Errorf("an empty catalog draws %d tables or sections", tables)
	}

	// Without a catalog the page says so.
	none := newCatalogEnv(t, false, false)
	rec := none.get(t, pathCatalog)
	if rec.Code != http.StatusNotFound || !strings.Contains(rec.Body.String(), "The catalog is not available in this deployment.") {
		t.Errorf("no catalog: %d %s", rec.Code, rec.Body)
	}
}

func TestSubscriptionPagesNameThePrice(t *testing.T) {
	t.Parallel()
	e := newCatalogEnv(t, false, true)
	e.seedCatalog(t)
	e.link(t, "user-1", "cus_1", "u1@example.com")
	sub := func(id string, sec int64, live bool, customer, price string) []byte {
		return stripeevents.SubscriptionEvent("evt_"+id, billing.EventSubscriptionCreated, at(sec), live,
			stripeevents.Subscription{ID: id, Customer: customer, Status: billing.StatusActive, PriceID: price,
				CurrentPeriodStart: at(0), CurrentPeriodEnd: at(30 * 86400)})
	}
	e.handle(t,
		sub("sub_1", 10, false, "cus_1", "price_pro_m"),
		sub("sub_2", 11, false, "cus_1", "price_nowhere"),
		sub("sub_3", 12, false, "cus_3", "price_xss"),
		sub("sub_live", 13, true, "cus_live", "price_live"),
	)

	for id, want := range map[string]string{
		"sub_1": "Pro · Monthly / month price_pro_m",
		// Unknown to the catalog: the id, as before.
		"sub_2": "price_nowhere",
		// A live subscription is named from live mode's catalog, whatever mode the console runs in.
		"sub_live": "Live Pro / month price_live",
		"sub_3":    hostile + " · <img src=x> / month price_xss",
	} {
		rec := e.get(t, subURL(id))
		if rec.Code != http.StatusOK {
			t.Fatalf("GET %s: %d", id, rec.Code)
		}
		if got := byID(parse(t, rec.Body.String()), "sub-price"); got != want {
			t.Errorf("%s price %q, want %q", id, got, want)
		}
		if strings.Contains(rec.Body.String(), "<script>alert") || strings.Contains(rec.Body.String(), "<img src=x>") {
			t.Errorf("%s: the price's name is not escaped", id)
		}
	}

	doc, _ := e.page(t, customerURL("user-1"))
	subs := cells(t, doc, "test-subscriptions", "data-subscription-id")
	if subs["sub_1"]["price"] != "Pro · Monthly / month price_pro_m" || subs["sub_2"]["price"] != "price_nowhere" {
		t.Errorf("customer page prices: %q, %q", subs["sub_1"]["price"], subs["sub_2"]["price"])
	}

	// Without a catalog the id shows, alone.
	none := newCatalogEnv(t, false, false)
	none.handle(t, sub("sub_1", 10, false, "cus_1", "price_pro_m"))
	doc, _ = none.page(t, subURL("sub_1"))
	if got := byID(doc, "sub-price"); got != "price_pro_m" {
		t.Errorf("no catalog: price %q", got)
	}
}

// A reconcile drift row links to its object's page: a subscription's, or the catalog's.
func TestDriftRowsLinkToTheirObjectsPage(t *testing.T) {
	for id, want := range map[string]string{
		"sub_1":       pathSubs + "/sub_1",
		"prod_pro":    pathCatalog + "#product-prod_pro",
		"price_pro_m": pathCatalog,
	} {
		if got := driftURL(id); got != want {
			t.Errorf("driftURL(%s) = %q, want %q", id, got, want)
		}
	}
}

// A keyset page's links keep its filters: newest without a cursor, newer after its first row,
// older before its last; an empty page asked by a cursor still leads back to the newest.
func TestKeysetLinksKeepTheFilters(t *testing.T) {
	filters := url.Values{"status": {"failed"}, "q": {""}}
	newest, newer, older := keysetLinks(pathEvents, filters, "c1", "c9", true, true, true)
	if newest != pathEvents+"?status=failed" || newer != pathEvents+"?after=c1&status=failed" || older != pathEvents+"?before=c9&status=failed" {
		t.Errorf("links %q %q %q", newest, newer, older)
	}
	if newest, newer, older := keysetLinks(pathEvents, filters, "c1", "c9", false, false, false); newest != "" || newer != "" || older != "" {
		t.Errorf("the only page: %q %q %q", newest, newer, older)
	}
	if newest, _, _ := keysetLinks(pathEvents, filters, "", "", false, false, true); newest != pathEvents+"?status=failed" {
		t.Errorf("an empty page past the end: %q", newest)
	}
	if newest, _, _ := keysetLinks(pathEvents, filters, "", "", false, false, false); newest != "" {
		t.Errorf("an empty first page: %q", newest)
	}
}
