package reconcile

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"billing/catalog"
	"billing/internal/stripeemu"
	"billing/internal/stripeevents"
)

// stepClock is a clock a second apart at each reading, from now: each run's reads are of a
// later second than the last run's, as between runs in production (a read loses its second's
// ties, so two runs in one second would leave the second's winner to chance).
func stepClock() func() time.Time {
	var mu sync.Mutex
	t := time.Now().UTC()
	return func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		t = t.Add(time.Second)
		return t
	}
}

// catalogEnv is an env whose reconciler also compares the catalog.
func newCatalogEnv(t *testing.T) (*env, *catalog.Service) {
	t.Helper()
	e := newEnv(t, func(d *Deps) { d.Now = stepClock() })
	cat := catalog.New(catalog.Deps{DB: e.db, Logger: slog.New(slog.DiscardHandler)})
	cat.Register(e.reg)
	e.rec.SetCatalog(cat)
	return e, cat
}

func wantCatalog(t *testing.T, sum Summary, objects, drifted, repaired, exit int) {
	t.Helper()
	if !sum.Catalog || sum.CatalogObjects != objects || sum.CatalogDrifted != drifted || sum.CatalogRepaired != repaired ||
		sum.Errors != 0 || sum.ExitCode() != exit || sum.Err != nil {
		t.Fatalf("summary %q (exit %d, err %v), want catalog_objects=%d catalog_drifted=%d catalog_repaired=%d errors=0 (exit %d)",
			sum.Line(), sum.ExitCode(), sum.Err, objects, drifted, repaired, exit)
	}
}

// fieldsOf are the drift rows of a run as "object field repaired", sorted.
func (e *env) fieldsOf(runID string) []string {
	e.t.Helper()
	var out []string
	for _, d := range e.drift(runID) {
		out = append(out, fmt.Sprintf("%s %s %v", d.SubscriptionID, d.Field, d.Repaired))
	}
	slices.Sort(out)
	return out
}

// stripe-mock's lists hold one fixture each: enough for the backfill of an empty catalog, a run
// that finds nothing, a dry run that reports a local change and exits 1, and its repair.
func TestCatalogBackfillFromStripeMock(t *testing.T) {
	e, cat := newCatalogEnv(t)
	ctx := context.Background()

	sum := e.run(false)
	wantCatalog(t, sum, 2, 2, 2, ExitClean)
	wantSummary(t, sum, 0, 2, 2, 0, 0, ExitClean) // the catalog's drift counts in drifted and repaired
	if !strings.HasSuffix(sum.Line(), " errors=0 catalog_objects=2 catalog_drifted=2 catalog_repaired=2") {
		t.Errorf("summary line %q", sum.Line())
	}
	products, err := cat.Products(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	prices, err := cat.AllPrices(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(products) != 1 || len(prices) != 1 || !strings.HasPrefix(products[0].ProductID, "prod_") ||
		!strings.HasPrefix(prices[0].PriceID, "price_") {
		t.Fatalf("after the backfill: products %+v, prices %+v", products, prices)
	}
	prod, price := products[0].ProductID, prices[0].PriceID
	rows := e.fieldsOf(sum.RunID)
	for _, want := range []string{prod + " product.missing_locally true", price + " price.missing_locally true"} {
		if !slices.Contains(rows, want) {
			t.Errorf("drift rows %q lack %q", rows, want)
		}
	}
	var source string
	if err := e.db.Raw(`SELECT event_id FROM catalog_prices WHERE price_id = $1`, price).Scan(&source).Error; err != nil ||
		source != "reconcile:"+sum.RunID {
		t.Errorf("price written by %q (%v), want the run's read", source, err)
	}

	wantCatalog(t, e.run(false), 2, 0, 0, ExitClean)

	// Changed locally without an event (as a restore would): the row's news is older than Stripe's.
	if err := e.db.Exec(`UPDATE catalog_products SET name = 'Edited', event_created = event_created - interval '1 hour'`).Error; err != nil {
		t.Fatal(err)
	}
	if err := e.db.Exec(`UPDATE catalog_prices SET unit_amount = 1, event_created = event_created - interval '1 hour'`).Error; err != nil {
		t.Fatal(err)
	}
	dry, err := e.rec.Run(ctx, RunOptions{DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	wantCatalog(t, dry, 2, 2, 0, ExitDrift)
	if got, want := e.fieldsOf(dry.RunID), []string{price + " price.unit_amount false", prod + " product.name false"}; !slices.Equal(got, want) {
		t.Errorf("dry run's drift %q, want %q", got, want)
	}
	for _, d := range e.drift(dry.RunID) {
		if d.Field == FieldProductName && (d.Local != "Edited" || d.Stripe == "" || d.Reason == nil || *d.Reason != "dry run") {
			t.Errorf("dry run's drift row %+v", d)
		}
	}
	if n := e.count(`SELECT count(*) FROM catalog_products WHERE name = 'Edited'`); n != 1 {
		t.Fatalf("the dry run changed the product (%d edited left)", n)
	}

	rep := e.run(false)
	wantCatalog(t, rep, 2, 2, 2, ExitClean)
	if n := e.count(`SELECT count(*) FROM catalog_products WHERE name = 'Edited'`) +
		e.count(`SELECT count(*) FROM catalog_prices WHERE unit_amount = 1`); n != 0 {
		t.Fatalf("%d edits left after the repair", n)
	}
	wantCatalog(t, e.run(false), 2, 0, 0, ExitClean)
}

// A catalog of more than a page: every page of the prices (expand[]=data.tiers, 100 a page),
// active and archived, each product's features; then what Stripe changed without an event is
// reported by a dry run and repaired by a run, and a price Stripe no longer has (404) is kept
// deleted, reported once.
func TestCatalogEveryPageAndGoneAtStripe(t *testing.T) {
	e, cat := newCatalogEnv(t)
	ctx := context.Background()
	sc := stripeemu.NewCatalog(e.proxy, false)
	sc.PutProduct(stripeevents.Product{ID: "prod_basic", Name: "Basic", Description: "The basic plan"})
	sc.PutProduct(stripeevents.Product{ID: "prod_pro", Name: "Pro"})
	sc.PutProduct(stripeevents.Product{ID: "prod_old", Name: "Old", Inactive: true})
	sc.SetProductFeatures("prod_pro", "seats", "api", "export")
	sc.SetProductFeatures("prod_basic", "export")
	const n = 230
	for i := range n {
		p := stripeevents.Price{ID: fmt.Sprintf("price_%03d", i), Product: "prod_basic", UnitAmount: int64(100 + i),
			Interval: "month", Inactive: i%50 == 3}
		switch i % 5 {
		case 1:
			p.Product, p.LookupKey, p.Nickname, p.Interval, p.IntervalCount = "prod_pro", fmt.Sprintf("pro_%d", i), "Pro yearly", "year", 1
		case 2:
			p.Product, p.Tiers = "prod_pro", []stripeevents.Tier{{UpTo: 10, UnitAmount: 500}, {UnitAmount: 400, FlatAmount: 100}}
		case 3:
			p.Product, p.UsageType, p.Meter, p.Currency = "prod_old", "metered", "mtr_calls", "eur"
		case 4:
			p.Interval = "" // one-time
		}
		sc.PutPrice(p)
	}

	sum := e.run(false)
	wantCatalog(t, sum, 3+n, 3+n, 3+n, ExitClean)
	if got := e.proxy.Executed(http.MethodGet, "/v1/prices"); got != 3 {
		t.Errorf("%d price pages asked for, want 3 (100 a page)", got)
	}
	for _, r := range e.proxy.Filter(http.MethodGet, "/v1/prices") {
		if r.Query.Get("limit") != "100" || r.Query.Get("active") != "" || !slices.Contains(expansionsOf(r), "data.tiers") {
			t.Errorf("price list asked with %v", r.Query)
		}
	}
	for _, r := range e.proxy.Filter(http.MethodGet, "/v1/products") {
		if r.Query.Get("limit") != "100" || r.Query.Get("active") != "" {
			t.Errorf("product list asked with %v", r.Query)
		}
	}
	products, err := cat.Products(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]catalog.ProductView{}
	for _, p := range products {
		got[p.ProductID] = p
	}
	if p := got["prod_pro"]; !slices.Equal(p.Features, []string{"api", "export", "seats"}) || !p.Active {
		t.Errorf("prod_pro: %+v", p)
	}
	if p := got["prod_basic"]; deref(p.Description) != "The basic plan" || !slices.Equal(p.Features, []string{"export"}) {
		t.Errorf("prod_basic: %+v", p)
	}
	if p, ok := got["prod_old"]; !ok || p.Active || p.Deleted {
		t.Errorf("prod_old (archived): %+v", p)
	}
	prices, err := cat.AllPrices(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(prices) != n {
		t.Fatalf("%d prices after the backfill, want %d", len(prices), n)
	}
	// Every price as Stripe has it: the local one compares equal to what the double serves.
	local := &catLocal{prices: map[string]*catalog.PriceView{}, rows: map[string]catRow{}}
	for i := range prices {
		local.prices[prices[i].PriceID] = &prices[i]
	}
	var rows []catRow
	if err := e.db.Raw(`SELECT 'price' AS kind, price_id AS id, active, deleted, event_created FROM catalog_prices`).Scan(&rows).Error; err != nil {
		t.Fatal(err)
	}
	for _, row := range rows {
		local.rows[kindPrice+":"+row.ID] = row
	}
	for _, p := range sc.Prices() {
		o, err := decodeCatalog(kindPrice, sc.Price(p.ID), time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if d := local.compare(o); len(d) > 0 {
			t.Errorf("price %s differs after the backfill: %+v", p.ID, d)
		}
	}
	if v := local.prices["price_002"]; len(v.Tiers) != 2 || v.BillingScheme != "tiered" || v.Tiers[0].UpTo == nil || *v.Tiers[0].UpTo != 10 {
		t.Errorf("tiered price: %+v", v)
	}
	if v := local.prices["price_003"]; v.Active || v.Recurring == nil || v.Recurring.Meter == nil || *v.Recurring.Meter != "mtr_calls" || v.Currency != "eur" {
		t.Errorf("archived metered price: %+v", v)
	}

	wantCatalog(t, e.run(false), 3+n, 0, 0, ExitClean)

	// Stripe changes without events reaching the service.
	sc.ArchivePrice("price_007")
	sc.SetProductFeatures("prod_pro", "api")
	sc.PutProduct(stripeevents.Product{ID: "prod_basic", Name: "Basic (2024)", Description: "The basic plan"})
	sc.DeletePrice("price_009")
	want := []string{
		"price_007 price.active %v", "price_009 price.missing_at_stripe %v",
		"prod_basic product.name %v", "prod_pro product.features %v",
	}
	wantRows := func(runID string, repaired bool) {
		t.Helper()
		var w []string
		for _, s := range want {
			w = append(w, fmt.Sprintf(s, repaired))
		}
		if got := e.fieldsOf(runID); !slices.Equal(got, w) {
			t.Errorf("drift %q, want %q", got, w)
		}
	}
	dry, err := e.rec.Run(ctx, RunOptions{DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	// price_009 is not listed any more: it is not one of the objects, but it is drift.
	wantCatalog(t, dry, 3+n-1, 4, 0, ExitDrift)
	wantRows(dry.RunID, false)
	if n := e.count(`SELECT count(*) FROM catalog_prices WHERE price_id = 'price_009' AND NOT deleted AND active`); n != 1 {
		t.Fatalf("the dry run changed price_009")
	}

	rep := e.run(false)
	wantCatalog(t, rep, 3+n-1, 4, 4, ExitClean)
	wantRows(rep.RunID, true)
	// Inactive, not deleted: a later read (a run with the right account's key) may bring it back.
	if n := e.count(`SELECT count(*) FROM catalog_prices WHERE price_id = 'price_009' AND NOT deleted AND NOT active AND unit_amount = 109`); n != 1 {
		t.Fatalf("price_009 gone at Stripe is not kept inactive, with its fields")
	}
	if n := e.count(`SELECT count(*) FROM catalog_prices WHERE price_id = 'price_007' AND NOT active`); n != 1 {
		t.Fatalf("price_007 not archived locally")
	}
	products, err = cat.Products(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range products {
		if (p.ProductID == "prod_pro" && !slices.Equal(p.Features, []string{"api"})) || (p.ProductID == "prod_basic" && p.Name != "Basic (2024)") {
			t.Errorf("after the repair: %+v", p)
		}
	}
	// The price made inactive is not reported again: it sells nothing.
	wantCatalog(t, e.run(false), 3+n-1, 0, 0, ExitClean)
}

// An event newer than the run's read keeps its row: the read does not overwrite it, and the run
// says it could not repair the field (the next run compares again).
func TestCatalogEventNewerThanTheReadIsKept(t *testing.T) {
	e, cat := newCatalogEnv(t)
	sc := stripeemu.NewCatalog(e.proxy, false)
	sc.PutProduct(stripeevents.Product{ID: "prod_pro", Name: "Pro"})
	sc.PutPrice(stripeevents.Price{ID: "price_pro", Product: "prod_pro", UnitAmount: 900, Interval: "month", Nickname: "at Stripe"})
	wantCatalog(t, e.run(false), 2, 2, 2, ExitClean)

	// An event from later than the next run's reads (the clock steps a second a reading).
	ev := stripeevents.Price{ID: "price_pro", Product: "prod_pro", UnitAmount: 900, Interval: "month", Nickname: "from the event"}
	e.deliver(catalog.EventPriceUpdated, mustJSON(t, ev.Object(false)), time.Now().Add(time.Hour).UTC().Truncate(time.Second))
	sum := e.run(false)
	wantCatalog(t, sum, 2, 1, 0, ExitDrift)
	rows := e.drift(sum.RunID)
	if len(rows) != 1 || rows[0].Field != FieldPriceNickname || rows[0].Repaired || rows[0].Reason == nil ||
		!strings.Contains(*rows[0].Reason, "newer") {
		t.Fatalf("drift %+v", rows)
	}
	v, err := cat.Price(context.Background(), "price_pro")
	if err != nil || deref(v.Nickname) != "from the event" {
		t.Fatalf("price after the run: %+v (%v)", v, err)
	}
	if got := e.proxy.Executed(http.MethodGet, "/v1/prices/price_pro"); got != 1 {
		t.Errorf("%d re-reads of the price, want 1 (its row had news from the read's second or later)", got)
	}
}

// A catalog that Stripe refuses to list stops the run, as the subscriptions' listing does.
func TestCatalogListRefusedStopsTheRun(t *testing.T) {
	e, _ := newCatalogEnv(t)
	e.proxy.Respond(http.MethodGet, "/v1/prices", 1, func(stripeemu.Request) stripeemu.Answer {
		return stripeemu.Answer{Status: http.StatusUnauthorized, Body: map[string]any{"error": map[string]any{
			"type": "invalid_request_error", "message": "Invalid API Key provided"}}}
	})
	sum := e.run(false)
	if sum.Err == nil || sum.ExitCode() != ExitStopped || !strings.Contains(sum.Err.Error(), "list prices") {
		t.Fatalf("summary %q err %v, want a stopped run", sum.Line(), sum.Err)
	}
	if n := e.count(`SELECT count(*) FROM catalog_prices`); n != 0 {
		t.Fatalf("%d prices stored by a run that could not list them", n)
	}
}

func TestCatalogSummaryLine(t *testing.T) {
	s := Summary{Objects: 5, Drifted: 4, Repaired: 4, Catalog: true, CatalogObjects: 7, CatalogDrifted: 2, CatalogRepaired: 2}
	if got := s.Line(); got != "reconcile: objects=5 drifted=4 repaired=4 missing_at_stripe=0 errors=0 catalog_objects=7 catalog_drifted=2 catalog_repaired=2" {
		t.Errorf("%q", got)
	}
	s.Catalog = false
	if got := s.Line(); got != "reconcile: objects=5 drifted=4 repaired=4 missing_at_stripe=0 errors=0" {
		t.Errorf("without a catalog: %q", got)
	}
	if (Summary{Catalog: true, CatalogDrifted: 1, Drifted: 1, DryRun: true}).ExitCode() != ExitDrift {
		t.Error("a dry run's catalog drift exits 0")
	}
}

func expansionsOf(r stripeemu.Request) []string {
	var out []string
	for k, v := range r.Query {
		if strings.HasPrefix(k, "expand[") {
			out = append(out, v...)
		}
	}
	return out
}

func mustJSON(t *testing.T, v any) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// An object the catalog cannot keep is an error about it alone: counted (exit 1), the rest of
// the list applied, and, being listed, not taken for gone at Stripe.
func TestCatalogUnreadableObjectIsAnErrorOfItsOwn(t *testing.T) {
	e, cat := newCatalogEnv(t)
	good := stripeevents.Product{ID: "prod_good", Name: "Good"}.Object(false)
	bad := stripeevents.Product{ID: "prod_bad", Name: "Bad\x00name"}.Object(false)
	e.proxy.Respond(http.MethodGet, "/v1/products", 1, func(stripeemu.Request) stripeemu.Answer {
		return stripeemu.Answer{Status: http.StatusOK, Body: map[string]any{"object": "list", "url": "/v1/products",
			"has_more": false, "data": []any{bad, good}}}
	})
	stripeemu.NewCatalog(e.proxy, false) // no prices, no features; a retrieve of prod_bad is a 404
	// Known locally from an event: listed (if unreadable), it is not missing at Stripe.
	if _, err := cat.PutProduct(context.Background(), e.db, catalog.Product{ID: "prod_bad", Name: "Bad", Active: true},
		catalog.Write{Source: newEventID(), Created: ago(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	sum := e.run(false)
	if sum.Err != nil || sum.Errors != 1 || sum.CatalogObjects != 2 || sum.CatalogDrifted != 1 || sum.CatalogRepaired != 1 ||
		sum.ExitCode() != ExitDrift {
		t.Fatalf("summary %q (err %v), want one error, two objects, the good one repaired", sum.Line(), sum.Err)
	}
	if n := e.count(`SELECT count(*) FROM catalog_products WHERE product_id = 'prod_good'`) +
		e.count(`SELECT count(*) FROM catalog_products WHERE product_id = 'prod_bad' AND NOT deleted AND name = 'Bad'`); n != 2 {
		t.Fatalf("after the run: the good product not stored, or the unreadable one changed")
	}
	if n := len(e.proxy.Filter(http.MethodGet, "/v1/products/prod_bad")); n != 0 {
		t.Errorf("the listed product was read again %d times as if gone", n)
	}
}
