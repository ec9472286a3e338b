package catalog

import (
	"compress/gzip"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"gorm.io/gorm"

	"billing/internal/apierr"
	"billing/internal/apitest"
	"billing/internal/stripeclient"
	"billing/internal/stripeemu"
	"billing/internal/stripeevents"
	"billing/internal/testenv"
	"billing/migrations"
	"billing/webhooks"
)

func TestMain(m *testing.M) {
	testenv.SetMigrator(migrations.ApplyQuietly)
	testenv.Main(m)
}

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// recordedJobs is a jobs.Inserter that keeps what was queued (River's own tables are not the
// subject here).
type recordedJobs struct {
	mu   sync.Mutex
	args []river.JobArgs
}

func (r *recordedJobs) InsertTx(_ context.Context, _ *sql.Tx, args river.JobArgs, _ *river.InsertOpts) (*rivertype.JobInsertResult, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.args = append(r.args, args)
	return &rivertype.JobInsertResult{}, nil
}

type env struct {
	db   *gorm.DB
	s    *Service
	reg  *webhooks.Registry
	http *echo.Echo
	jobs *recordedJobs
	// stripe is Stripe's catalog, which the features read reads.
	stripe *stripeemu.Catalog
}

func newEnv(t *testing.T) *env {
	t.Helper()
	db := testenv.DB(t)
	e := &env{db: db, reg: webhooks.NewRegistry(), jobs: &recordedJobs{}}
	proxy := stripeemu.New(t, testenv.StripeMockURL(t))
	e.stripe = stripeemu.NewCatalog(proxy, false)
	api := stripeclient.New(proxy.URL, "sk_test_123", apitest.Logger(t, 0))
	e.s = New(Deps{DB: db, Features: api.ProductFeatures, Jobs: e.jobs, Logger: apitest.Logger(t, 0), Now: func() time.Time { return t0 }})
	e.s.Register(e.reg)
	e.http = apitest.Server(apitest.Logger(t, 0), e.s.Mount)
	return e
}

// deliver applies a built event through its registered handler in a transaction, as the inbox does.
func (e *env) deliver(t *testing.T, payload []byte) {
	t.Helper()
	var env struct {
		ID       string `json:"id"`
		Type     string `json:"type"`
		Livemode bool   `json:"livemode"`
	}
	if err := json.Unmarshal(payload, &env); err != nil {
		t.Fatal(err)
	}
	ev, err := webhooks.DecodeStored(env.ID, env.Type, env.Livemode, stripeevents.APIVersion, payload)
	if err != nil {
		t.Fatal(err)
	}
	h, ok := e.reg.Lookup(ev.Type)
	if !ok {
		t.Fatalf("no handler for %s", ev.Type)
	}
	if err := e.db.Transaction(func(tx *gorm.DB) error { return h.HandleEvent(context.Background(), tx, ev) }); err != nil {
		t.Fatalf("apply %s: %v", ev.Type, err)
	}
}

func (e *env) prices(t *testing.T, query string) []PriceView {
	t.Helper()
	rec := apitest.Do(t, e.http, apitest.AppToken, http.MethodGet, "/v1/prices"+query, nil)
	apitest.ExpectStatus(t, rec, http.StatusOK)
	var a PricesAnswer
	if err := json.Unmarshal(rec.Body.Bytes(), &a); err != nil {
		t.Fatal(err)
	}
	return a.Prices
}

var n int

func evID() string { n++; return fmt.Sprintf("evt_cat%06d", n) }

func pro() stripeevents.Product {
	return stripeevents.Product{ID: "prod_pro", Name: "Pro", Description: "For teams"}
}

func proMonthly(amount int64) stripeevents.Price {
	return stripeevents.Price{ID: "price_pro_m", Product: "prod_pro", LookupKey: "pro_monthly", UnitAmount: amount, Interval: "month"}
}

func TestEventsFillThePricingPage(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.deliver(t, stripeevents.ProductEvent(evID(), EventProductCreated, t0, false, pro()))
	e.deliver(t, stripeevents.PriceEvent(evID(), EventPriceCreated, t0, false, proMonthly(2000)))
	e.deliver(t, stripeevents.PriceEvent(evID(), EventPriceCreated, t0, false, stripeevents.Price{ID: "price_pro_y", Product: "prod_pro",
		LookupKey: "pro_yearly", UnitAmount: 20000, Interval: "year", Nickname: "Yearly"}))
	e.deliver(t, stripeevents.PriceEvent(evID(), EventPriceCreated, t0, false, stripeevents.Price{ID: "price_api", Product: "prod_pro",
		Interval: "month", UsageType: "metered", Meter: "mtr_1", Tiers: []stripeevents.Tier{{UpTo: 1000, UnitAmount: 0}, {UnitAmount: 2, FlatAmount: 100}}}))
	if err := e.db.Transaction(func(tx *gorm.DB) error {
		_, err := e.s.PutFeatures(context.Background(), tx, false, "prod_pro", []string{"sso", "api", "sso"}, t0)
		return err
	}); err != nil {
		t.Fatal(err)
	}

	got := e.prices(t, "")
	if len(got) != 3 {
		t.Fatalf("prices %+v, want 3", got)
	}
	m := got[0]
	if m.PriceID != "price_pro_m" || *m.ProductName != "Pro" || *m.ProductDescription != "For teams" || *m.LookupKey != "pro_monthly" ||
		*m.UnitAmount != 2000 || m.Currency != "usd" || m.BillingScheme != "per_unit" || !m.Active || m.Tiers != nil ||
		m.Recurring == nil || m.Recurring.Interval != "month" || m.Recurring.IntervalCount != 1 || m.Recurring.UsageType != "licensed" {
		t.Fatalf("monthly price %+v", m)
	}
	if fmt.Sprint(m.Features) != "[api sso]" {
		t.Fatalf("features %v, want the product's, sorted and unique", m.Features)
	}
	tiered := got[2]
	if tiered.PriceID != "price_api" || tiered.BillingScheme != "tiered" || len(tiered.Tiers) != 2 || tiered.Tiers[0].UpTo == nil ||
		*tiered.Tiers[0].UpTo != 1000 || tiered.Tiers[1].UpTo != nil || *tiered.Tiers[1].FlatAmount != 100 ||
		tiered.Recurring.UsageType != "metered" || *tiered.Recurring.Meter != "mtr_1" || tiered.UnitAmount != nil {
		t.Fatalf("tiered price %+v", tiered)
	}
	if got := e.prices(t, "?lookup_key=pro_yearly"); len(got) != 1 || got[0].PriceID != "price_pro_y" {
		t.Fatalf("by lookup key %+v", got)
	}
	if got := e.prices(t, "?product_id=prod_other"); len(got) != 0 {
		t.Fatalf("another product's %+v", got)
	}
	// The raw JSON names the contract's fields.
	rec := apitest.Do(t, e.http, apitest.AppToken, http.MethodGet, "/v1/prices?lookup_key=pro_monthly", nil)
	var raw struct {
		Prices []map[string]any `json:"prices"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &raw); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"price_id", "product_id", "product_name", "product_description", "lookup_key", "nickname", "currency",
		"unit_amount", "billing_scheme", "tiers", "recurring", "features", "active"} {
		if _, ok := raw.Prices[0][f]; !ok {
			t.Errorf("field %s missing from %v", f, raw.Prices[0])
		}
	}
}

func TestAnOlderEventNeverOverwritesANewerOne(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.deliver(t, stripeevents.PriceEvent(evID(), EventPriceUpdated, t0.Add(time.Minute), false, proMonthly(3000)))
	e.deliver(t, stripeevents.PriceEvent(evID(), EventPriceCreated, t0, false, proMonthly(2000)))
	// Same second: updated ranks above created, whichever arrives last.
	e.deliver(t, stripeevents.PriceEvent(evID(), EventPriceCreated, t0.Add(time.Minute), false, proMonthly(1000)))
	if got := e.prices(t, ""); len(got) != 1 || *got[0].UnitAmount != 3000 {
		t.Fatalf("prices %+v, want the newest event's 3000", got)
	}
	e.deliver(t, stripeevents.PriceEvent(evID(), EventPriceUpdated, t0.Add(2*time.Minute), false, proMonthly(4000)))
	if got := e.prices(t, ""); *got[0].UnitAmount != 4000 {
		t.Fatalf("prices %+v, want a newer event to apply", got)
	}
}

func TestADeletedOrArchivedPriceStaysInactive(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.deliver(t, stripeevents.ProductEvent(evID(), EventProductCreated, t0, false, pro()))
	e.deliver(t, stripeevents.PriceEvent(evID(), EventPriceCreated, t0, false, proMonthly(2000)))
	if id, err := e.s.PriceOf(ctx, nil, ptr("pro_monthly")); err != nil || id != "price_pro_m" {
		t.Fatalf("resolve %q %v", id, err)
	}
	e.deliver(t, stripeevents.PriceEvent(evID(), EventPriceDeleted, t0.Add(time.Minute), false, proMonthly(2000)))
	// An update older than the deletion, delivered late, does not bring it back.
	e.deliver(t, stripeevents.PriceEvent(evID(), EventPriceUpdated, t0.Add(30*time.Second), false, proMonthly(2000)))
	got := e.prices(t, "")
	if len(got) != 1 || got[0].Active || !got[0].Deleted {
		t.Fatalf("prices %+v, want the deleted price kept, inactive", got)
	}
	if got := e.prices(t, "?active=true"); len(got) != 0 {
		t.Fatalf("active prices %+v, want none", got)
	}
	if got := e.prices(t, "?active=false"); len(got) != 1 {
		t.Fatalf("inactive prices %+v, want the deleted one", got)
	}
	expectCode(t, e.s, nil, ptr("pro_monthly"), apierr.CodeInactivePrice)
	expectCode(t, e.s, ptr("price_pro_m"), nil, apierr.CodeInactivePrice)

	// An archived product makes its prices unsellable, though they are active themselves.
	e.deliver(t, stripeevents.PriceEvent(evID(), EventPriceCreated, t0, false, stripeevents.Price{ID: "price_pro_y", Product: "prod_pro", LookupKey: "pro_yearly", UnitAmount: 1, Interval: "year"}))
	archived := pro()
	archived.Inactive = true
	e.deliver(t, stripeevents.ProductEvent(evID(), EventProductUpdated, t0.Add(time.Minute), false, archived))
	expectCode(t, e.s, nil, ptr("pro_yearly"), apierr.CodeInactivePrice)
}

func TestLookupKeysAndPriceIDsAreCheckedBeforeStripe(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	expectCode(t, e.s, nil, ptr("nobody_sells_this"), apierr.CodeUnknownPrice)
	expectCode(t, e.s, ptr("price_x"), ptr("pro_monthly"), apierr.CodeInvalidRequest)
	expectCode(t, e.s, nil, ptr(""), apierr.CodeInvalidLookupKey)
	expectCode(t, e.s, ptr("not a price"), nil, apierr.CodeInvalidPriceID)
	// A price the catalog does not know may exist at Stripe: it is passed on.
	if id, err := e.s.PriceOf(context.Background(), ptr("price_unknown_here"), nil); err != nil || id != "price_unknown_here" {
		t.Fatalf("unknown price id: %q %v", id, err)
	}
	if id, err := e.s.PriceOf(context.Background(), nil, nil); err != nil || id != "" {
		t.Fatalf("neither: %q %v", id, err)
	}
	rec := apitest.Do(t, e.http, apitest.AppToken, http.MethodGet, "/v1/prices?active=yes", nil)
	apitest.ExpectError(t, rec, http.StatusBadRequest, string(apierr.CodeInvalidActive))
}

func TestTheOtherModesCatalogIsAnotherWorld(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.deliver(t, stripeevents.PriceEvent(evID(), EventPriceCreated, t0, true, proMonthly(2000)))
	if got := e.prices(t, ""); len(got) != 0 {
		t.Fatalf("a test deployment lists live prices: %+v", got)
	}
	expectCode(t, e.s, nil, ptr("pro_monthly"), apierr.CodeUnknownPrice)
	live, err := e.s.AllPrices(context.Background(), true)
	if err != nil || len(live) != 1 {
		t.Fatalf("live prices %+v %v", live, err)
	}
	if len(e.jobs.args) != 0 {
		t.Fatalf("jobs %+v", e.jobs.args)
	}
	e.deliver(t, stripeevents.ProductEvent(evID(), EventProductCreated, t0, true, pro()))
	if len(e.jobs.args) != 0 {
		t.Fatalf("a live product's features read queued by a test deployment: %+v", e.jobs.args)
	}
}

func TestAReadLosesItsSecondToTheEventsButNotTheNextOne(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.deliver(t, stripeevents.PriceEvent(evID(), EventPriceCreated, t0, false, proMonthly(2000)))
	p, err := DecodePrice(mustJSON(t, proMonthly(9999).Object(false)))
	if err != nil {
		t.Fatal(err)
	}
	put := func(at time.Time) bool {
		var applied bool
		if err := e.db.Transaction(func(tx *gorm.DB) error {
			applied, err = e.s.PutPrice(ctx, tx, p, ReadWrite("reconcile:run1", at, false))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return applied
	}
	if put(t0.Add(400 * time.Millisecond)) {
		t.Fatal("a read of the event's second replaced the event")
	}
	if !put(t0.Add(time.Second)) {
		t.Fatal("a read of a later second did not apply")
	}
	if got := e.prices(t, ""); *got[0].UnitAmount != 9999 {
		t.Fatalf("prices %+v", got)
	}
}

func TestAProductEventQueuesItsFeaturesReadAndTheReadStoresThem(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	// Stripe's 404 cancels the job: no retry can find the product.
	if _, err := e.s.ReadFeatures(ctx, "prod_pro"); !errors.As(err, new(*river.JobCancelError)) {
		t.Fatalf("read of a product Stripe does not know: %v, want the job cancelled", err)
	}
	var want []string
	for i := range 130 {
		want = append(want, fmt.Sprintf("feature_%03d", i))
	}
	e.stripe.PutProduct(pro())
	e.stripe.SetProductFeatures("prod_pro", want...)
	// The read of a product the local catalog does not know yet stores nothing.
	if stored, err := e.s.ReadFeatures(ctx, "prod_pro"); err != nil || stored {
		t.Fatalf("read of a product unknown here: stored=%v %v", stored, err)
	}
	e.deliver(t, stripeevents.ProductEvent(evID(), EventProductCreated, t0, false, pro()))
	if len(e.jobs.args) != 1 {
		t.Fatalf("jobs %+v, want the features read", e.jobs.args)
	}
	a, ok := e.jobs.args[0].(FeaturesReadArgs)
	if !ok || a.ProductID != "prod_pro" || a.Livemode {
		t.Fatalf("job %+v", e.jobs.args[0])
	}
	// What Stripe lists for the product, every page of it, is what the read stores.
	if stored, err := e.s.ReadFeatures(ctx, "prod_pro"); err != nil || !stored {
		t.Fatalf("read: stored=%v %v", stored, err)
	}
	products, err := e.s.Products(ctx, false)
	if err != nil || len(products) != 1 || fmt.Sprint(products[0].Features) != fmt.Sprint(want) {
		t.Fatalf("products %+v %v, want features %v", products, err, want)
	}
	// An older read (begun before the stored one) does not replace it.
	if err := e.db.Transaction(func(tx *gorm.DB) error {
		stored, err := e.s.PutFeatures(ctx, tx, false, "prod_pro", []string{"old"}, t0.Add(-time.Hour))
		if stored {
			return errors.New("an older read replaced the features")
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	// A deleted product queues no read.
	e.deliver(t, stripeevents.ProductEvent(evID(), EventProductDeleted, t0.Add(time.Minute), false, pro()))
	if len(e.jobs.args) != 1 {
		t.Fatalf("jobs %+v after the deletion", e.jobs.args)
	}
}

func TestAnEventThatIsNotACatalogObjectIsRefusedForGood(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	payload := stripeevents.Event(evID(), EventPriceCreated, t0, false, map[string]any{"id": "price_1", "object": "product"}, nil)
	ev, err := webhooks.DecodeStored("evt_bad", EventPriceCreated, false, stripeevents.APIVersion, payload)
	if err != nil {
		t.Fatal(err)
	}
	h, _ := e.reg.Lookup(EventPriceCreated)
	err = e.db.Transaction(func(tx *gorm.DB) error { return h.HandleEvent(context.Background(), tx, ev) })
	if !webhooks.IsPermanent(err) {
		t.Fatalf("err %v, want a permanent error", err)
	}
}

func expectCode(t *testing.T, s *Service, priceID, lookupKey *string, code apierr.Code) {
	t.Helper()
	_, err := s.PriceOf(context.Background(), priceID, lookupKey)
	var ae *apierr.Error
	if !errors.As(err, &ae) || ae.Code != code {
		t.Fatalf("PriceOf(%v, %v) = %v, want %s", deref(priceID), deref(lookupKey), err, code)
	}
}

func ptr(s string) *string { return &s }

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Each replica keeps its own copy of the answer; a write through another replica makes it stale.
func TestAnotherReplicasWriteRefreshesTheCopy(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.deliver(t, stripeevents.PriceEvent(evID(), EventPriceCreated, t0, false, proMonthly(2000)))
	if got := e.prices(t, ""); *got[0].UnitAmount != 2000 {
		t.Fatalf("prices %+v", got)
	}
	other := New(Deps{DB: e.db, Now: func() time.Time { return t0 }})
	p, err := DecodePrice(mustJSON(t, proMonthly(2500).Object(false)))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.db.Transaction(func(tx *gorm.DB) error {
		_, err := other.PutPrice(context.Background(), tx, p, Write{Source: "evt_other", Created: t0.Add(time.Minute), Rank: 1})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if got := e.prices(t, ""); *got[0].UnitAmount != 2500 {
		t.Fatalf("prices %+v after another replica's write, want 2500", got)
	}
	// A write that changes nothing (an older event) leaves the version, and the copy, as they are.
	var before, after int64
	e.db.Raw(`SELECT version FROM catalog_versions WHERE livemode = false`).Scan(&before)
	e.deliver(t, stripeevents.PriceEvent(evID(), EventPriceCreated, t0, false, proMonthly(1)))
	e.db.Raw(`SELECT version FROM catalog_versions WHERE livemode = false`).Scan(&after)
	if before == 0 || after != before {
		t.Fatalf("version %d then %d: a stale event moved it", before, after)
	}
}

func TestALargeAnswerIsSentGzippedToWhoAsks(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for i := range 20 {
		p := proMonthly(int64(1000 + i))
		p.ID, p.LookupKey = fmt.Sprintf("price_g%02d", i), fmt.Sprintf("plan_%02d", i)
		e.deliver(t, stripeevents.PriceEvent(evID(), EventPriceCreated, t0, false, p))
	}
	plain := apitest.Do(t, e.http, apitest.AppToken, http.MethodGet, "/v1/prices", nil)
	if plain.Header().Get("Content-Encoding") != "" || plain.Body.Len() < minGzip {
		t.Fatalf("plain answer: encoding %q, %d bytes", plain.Header().Get("Content-Encoding"), plain.Body.Len())
	}
	for _, accept := range []string{"gzip", "br, gzip;q=0.8", "gzip;q=0"} {
		req := httptest.NewRequest(http.MethodGet, "/v1/prices", nil)
		req.Header.Set("Authorization", "Bearer "+apitest.AppToken)
		req.Header.Set("Accept-Encoding", accept)
		rec := httptest.NewRecorder()
		e.http.ServeHTTP(rec, req)
		apitest.ExpectStatus(t, rec, http.StatusOK)
		if accept == "gzip;q=0" {
			if rec.Header().Get("Content-Encoding") != "" || rec.Body.String() != plain.Body.String() {
				t.Fatalf("gzip refused with q=0, answered %q", rec.Header().Get("Content-Encoding"))
			}
			continue
		}
		if rec.Header().Get("Content-Encoding") != "gzip" {
			t.Fatalf("Accept-Encoding %q: Content-Encoding %q", accept, rec.Header().Get("Content-Encoding"))
		}
		zr, err := gzip.NewReader(rec.Body)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(zr)
		if err != nil || string(body) != plain.Body.String() {
			t.Fatalf("gzipped answer differs from the plain one (%v)", err)
		}
	}
}

// A deletion whose object is the stub a DELETE answers still deletes what the catalog has.
func TestADeletedStubDeletesTheRow(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.deliver(t, stripeevents.ProductEvent(evID(), EventProductCreated, t0, false, pro()))
	e.deliver(t, stripeevents.PriceEvent(evID(), EventPriceCreated, t0, false, proMonthly(2000)))
	e.deliver(t, stripeevents.Event(evID(), EventPriceDeleted, t0.Add(time.Minute), false,
		map[string]any{"id": "price_pro_m", "object": "price", "deleted": true}, nil))
	e.deliver(t, stripeevents.Event(evID(), EventProductDeleted, t0.Add(time.Minute), false,
		map[string]any{"id": "prod_pro", "object": "product", "deleted": true}, nil))
	got := e.prices(t, "")
	if len(got) != 1 || got[0].Active || !got[0].Deleted {
		t.Fatalf("prices %+v, want the price kept, deleted", got)
	}
	products, err := e.s.Products(context.Background(), false)
	if err != nil || len(products) != 1 || !products[0].Deleted || products[0].Active || products[0].Name != "Pro" {
		t.Fatalf("products %+v %v, want Pro kept, deleted", products, err)
	}
	// A stub of an object the catalog never had is acknowledged and changes nothing.
	e.deliver(t, stripeevents.Event(evID(), EventPriceDeleted, t0.Add(time.Minute), false,
		map[string]any{"id": "price_never", "object": "price", "deleted": true}, nil))
	if got := e.prices(t, ""); len(got) != 1 {
		t.Fatalf("prices %+v", got)
	}
}
