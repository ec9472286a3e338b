package reconcile

// The catalog pass: after the subscriptions, a run reads the mode's whole catalog from Stripe —
// every page of the products and of the prices, active and archived alike, and each product's
// features — then the local catalog, compares them object by object, and repairs what differs
// by applying what was read through the writes the catalog's events use, as reads
// (catalog.ReadWrite: a read loses its second's ties to events, so an event of that second or
// later keeps the row). The lists are read whole before the local state is (a catalog is
// thousands of objects, not millions), so that an event applied while they were on their way is
// seen as newer than them. Drift rows name the object in reconcile_drift.subscription_id and the
// field as product.* or price.*.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v79"
	"gorm.io/gorm"

	"billing/catalog"
)

// Catalog is the local catalog: catalog.Service.
type Catalog interface {
	Products(ctx context.Context, livemode bool) ([]catalog.ProductView, error)
	AllPrices(ctx context.Context, livemode bool) ([]catalog.PriceView, error)
	PutProduct(ctx context.Context, tx *gorm.DB, p catalog.Product, w catalog.Write) (bool, error)
	PutPrice(ctx context.Context, tx *gorm.DB, p catalog.Price, w catalog.Write) (bool, error)
	PutFeatures(ctx context.Context, tx *gorm.DB, livemode bool, productID string, keys []string, readAt time.Time) (bool, error)
}

// SetCatalog sets the local catalog the runs compare with and repair; nil (the default) skips
// the catalog.
func (s *Service) SetCatalog(c Catalog) { s.catalog = c }

// Drift fields of the catalog.
const (
	FieldProductMissingLocally  = "product.missing_locally"
	FieldProductMissingAtStripe = "product.missing_at_stripe"
	FieldProductName            = "product.name"
	FieldProductDescription     = "product.description"
	FieldProductActive          = "product.active"
	// FieldProductFeatures: the lookup keys of the product's features, sorted, comma separated.
	FieldProductFeatures = "product.features"

	FieldPriceMissingLocally  = "price.missing_locally"
	FieldPriceMissingAtStripe = "price.missing_at_stripe"
	FieldPriceProduct         = "price.product"
	FieldPriceLookupKey       = "price.lookup_key"
	FieldPriceNickname        = "price.nickname"
	FieldPriceCurrency        = "price.currency"
	FieldPriceUnitAmount      = "price.unit_amount"
	FieldPriceBillingScheme   = "price.billing_scheme"
	FieldPriceTiersMode       = "price.tiers_mode"
	// FieldPriceTiers: the tiers as JSON ([{"up_to","unit_amount","flat_amount"}]).
	FieldPriceTiers                  = "price.tiers"
	FieldPriceRecurringInterval      = "price.recurring_interval"
	FieldPriceRecurringIntervalCount = "price.recurring_interval_count"
	FieldPriceRecurringUsageType     = "price.recurring_usage_type"
	FieldPriceRecurringMeter         = "price.recurring_meter"
	// FieldPriceActive: the price's own flag (not whether it can be sold, which its product's
	// flag joins in).
	FieldPriceActive = "price.active"
)

const (
	kindProduct = "product"
	kindPrice   = "price"
)

// catObject is a product or a price as Stripe answered it.
type catObject struct {
	kind      string
	id        string
	product   catalog.Product // kindProduct
	price     catalog.Price   // kindPrice
	fetchedAt time.Time
	// A product's features (sorted) and when their read began; featuresRead is zero when they
	// were not read (the product was gone by then, or it was not listed but retrieved).
	features     []string
	featuresRead time.Time
	// gone: Stripe did not list it and its retrieve answered 404 (only for a local object).
	gone bool
}

// catPage is what a run examines, records and reports at once: a page of a list, or the local
// objects that the lists did not hold.
type catPage struct {
	what string
	objs []*catObject
	// ids are every object the page listed, read or not.
	ids []string
	// missing are local objects of the mode that Stripe did not list ("kind:id").
	missing []string
	// unreadable counts the listed objects that the catalog cannot keep (errors about them).
	unreadable int
}

// catRow is a local row's own columns that the views do not carry.
type catRow struct {
	Kind          string     `gorm:"column:kind"`
	ID            string     `gorm:"column:id"`
	Active        bool       `gorm:"column:active"`
	Deleted       bool       `gorm:"column:deleted"`
	EventCreated  time.Time  `gorm:"column:event_created"`
	StripeCreated *time.Time `gorm:"column:stripe_created"`
}

// catLocal is the local catalog of the mode, read once after the lists.
type catLocal struct {
	products map[string]*catalog.ProductView
	prices   map[string]*catalog.PriceView
	rows     map[string]catRow // by "kind:id"
}

// catItem is an object that differs, on its way through the repair.
type catItem struct {
	obj      *catObject
	diffs    []diff
	features *diff
	// write is what the repair applies: Stripe's object, or for one gone at Stripe the local
	// object, deleted.
	product catalog.Product
	price   catalog.Price
	w       catalog.Write
	// deletedLocally: the local row is deleted, and a deleted row takes no write.
	deletedLocally bool

	applied, featuresApplied bool
	out                      []outcome
}

// catalogPass reads, compares and repairs the catalog; nothing without a catalog. Only an error
// that must stop the run is returned.
func (r *run) catalogPass(ctx context.Context) error {
	if r.s.catalog == nil {
		return nil
	}
	products, productsFrom, err := r.listCatalog(ctx, kindProduct)
	if err != nil {
		return err
	}
	read := 0
	for _, pg := range products {
		for _, o := range pg.objs {
			if err := r.readFeatures(ctx, o); err != nil {
				return err
			}
			read++
		}
	}
	if read > 0 {
		r.progress("reconcile: catalog: read the features of %d products", read)
	}
	prices, pricesFrom, err := r.listCatalog(ctx, kindPrice)
	if err != nil {
		return err
	}
	listed := map[string]bool{}
	for _, pg := range slices.Concat(products, prices) {
		for _, id := range pg.ids {
			listed[id] = true
		}
	}
	local, err := r.loadCatalog(ctx)
	if err != nil {
		return err
	}
	// Local objects the lists did not hold. Those whose news is from the list's first second or
	// later are left out: they may be newer than the list (created while it was read).
	var missing []string
	for key, row := range local.rows {
		from := productsFrom
		if row.Kind == kindPrice {
			from = pricesFrom
		}
		if !listed[key] && !row.Deleted && row.EventCreated.Before(from.UTC().Truncate(time.Second)) {
			missing = append(missing, key)
		}
	}
	slices.Sort(missing)
	pages := slices.Concat(products, prices)
	if len(missing) > 0 {
		pages = append(pages, catPage{what: "not listed", missing: missing})
	}
	for _, pg := range pages {
		if err := r.catalogPage(ctx, pg, local); err != nil {
			return err
		}
	}
	return nil
}

// listCatalog reads every page of a list with stripe-go's iterator, a page per call under the
// run's limits (a failed page is tried again from where it stopped), and decodes each object
// as the catalog's events are decoded. An object that does not decode is an error about it
// alone. It returns the pages and when the first was asked for.
func (r *run) listCatalog(ctx context.Context, kind string) ([]catPage, time.Time, error) {
	var pages []catPage
	var first time.Time
	after := ""
	total := 0
	for n := 1; ; n++ {
		what := fmt.Sprintf("list %ss (page %d)", kind, n)
		var raws []json.RawMessage
		var more bool
		fetchedAt, err := r.s.call(ctx, what, func(ctx context.Context) error {
			lp := stripe.ListParams{Context: ctx, Limit: stripe.Int64(pageSize), Single: true}
			if after != "" {
				lp.StartingAfter = stripe.String(after)
			}
			var it *stripe.Iter
			var resp func() *stripe.APIResponse
			if kind == kindProduct {
				// No active filter: archived products are listed too.
				pit := r.s.stripe.Products.List(&stripe.ProductListParams{ListParams: lp})
				it, resp = pit.Iter, func() *stripe.APIResponse { return pit.ProductList().LastResponse }
			} else {
				params := &stripe.PriceListParams{ListParams: lp}
				params.AddExpand("data.tiers")
				pit := r.s.stripe.Prices.List(params)
				it, resp = pit.Iter, func() *stripe.APIResponse { return pit.PriceList().LastResponse }
			}
			for it.Next() {
			}
			if err := it.Err(); err != nil {
				return err
			}
			// The objects as Stripe sent them: decoded by the catalog's own decoder, as events.
			var list rawPage
			if last := resp(); last == nil || json.Unmarshal(last.RawJSON, &list) != nil {
				return fmt.Errorf("%s: no list in the answer", what)
			}
			raws, more = list.Data, list.HasMore
			return nil
		})
		if err != nil {
			return nil, time.Time{}, err
		}
		if n == 1 {
			first = fetchedAt
		}
		pg := catPage{what: fmt.Sprintf("%ss page %d", kind, n)}
		for i, raw := range raws {
			id := idOf(raw)
			if id == "" {
				return nil, time.Time{}, fmt.Errorf("%s: object %d has no id", what, i+1)
			}
			pg.ids = append(pg.ids, kind+":"+id)
			o, err := decodeCatalog(kind, raw, fetchedAt)
			if err != nil {
				// Listed all the same: it is not missing at Stripe.
				r.catalogError(kind, id, err)
				pg.unreadable++
				continue
			}
			pg.objs = append(pg.objs, o)
		}
		total += len(raws)
		pages = append(pages, pg)
		r.progress("reconcile: catalog: listed %ss page %d (%d so far)", kind, n, total)
		if !more || len(raws) == 0 {
			return pages, first, nil
		}
		after = idOf(raws[len(raws)-1])
	}
}

func idOf(raw json.RawMessage) string {
	var o struct {
		ID string `json:"id"`
	}
	if json.Unmarshal(raw, &o) != nil {
		return ""
	}
	return o.ID
}

// unreadable is an object Stripe sent that the catalog cannot keep: an error about it alone.
type unreadable struct{ err error }

func (u unreadable) Error() string { return u.err.Error() }
func (u unreadable) Unwrap() error { return u.err }

func decodeCatalog(kind string, raw json.RawMessage, fetchedAt time.Time) (*catObject, error) {
	o := &catObject{kind: kind, fetchedAt: fetchedAt}
	var err error
	if kind == kindProduct {
		o.product, err = catalog.DecodeProduct(raw)
		o.id = o.product.ID
	} else {
		o.price, err = catalog.DecodePrice(raw)
		o.id = o.price.ID
	}
	if err != nil {
		return nil, unreadable{err}
	}
	return o, nil
}

// readFeatures reads every page of a product's features, as one call under the run's limits
// (a product has a handful; a failure reads them again from the start). A product gone at
// Stripe meanwhile keeps its features unread: its deletion is news of its own.
func (r *run) readFeatures(ctx context.Context, o *catObject) error {
	var keys []string
	var readAt time.Time
	var gone404 bool
	_, err := r.s.call(ctx, "list the features of product "+o.id, func(ctx context.Context) error {
		var err error
		keys, readAt, err = catalog.ListFeatures(ctx, r.s.stripe.ProductFeatures, o.id, r.s.now)
		// Seen here: the call's error no longer carries Stripe's status.
		if gone404 = gone(err); gone404 {
			return nil
		}
		return err
	})
	if err != nil || gone404 {
		return err
	}
	o.features, o.featuresRead = sortedUnique(keys), readAt
	return nil
}

// retrieve reads one product or price again; gone when Stripe answers 404.
func (r *run) retrieve(ctx context.Context, kind, id string) (*catObject, error) {
	var raw json.RawMessage
	var gone404 bool
	fetchedAt, err := r.s.call(ctx, "read "+kind+" "+id, func(ctx context.Context) error {
		var resp *stripe.APIResponse
		var err error
		if kind == kindProduct {
			params := &stripe.ProductParams{}
			params.Context = ctx
			var p *stripe.Product
			if p, err = r.s.stripe.Products.Get(id, params); err == nil {
				resp = p.LastResponse
			}
		} else {
			params := &stripe.PriceParams{}
			params.Context = ctx
			params.AddExpand("tiers")
			var p *stripe.Price
			if p, err = r.s.stripe.Prices.Get(id, params); err == nil {
				resp = p.LastResponse
			}
		}
		if gone404 = gone(err); gone404 {
			return nil
		}
		if err != nil {
			return err
		}
		if resp == nil {
			return fmt.Errorf("read %s %s: no response recorded", kind, id)
		}
		raw = resp.RawJSON
		return nil
	})
	if err != nil {
		return nil, err
	}
	if gone404 {
		return &catObject{kind: kind, id: id, fetchedAt: fetchedAt, gone: true}, nil
	}
	return decodeCatalog(kind, raw, fetchedAt)
}

// loadCatalog reads the mode's local catalog: the catalog's views, and the rows' own flags and
// times (a price view's active is whether it can be sold, its product's flag joined in).
func (r *run) loadCatalog(ctx context.Context) (*catLocal, error) {
	products, err := r.s.catalog.Products(ctx, r.s.livemode)
	if err != nil {
		return nil, fmt.Errorf("load the local products: %w", err)
	}
	prices, err := r.s.catalog.AllPrices(ctx, r.s.livemode)
	if err != nil {
		return nil, fmt.Errorf("load the local prices: %w", err)
	}
	var rows []catRow
	if err := r.s.db.WithContext(ctx).Raw(`
		SELECT 'product' AS kind, product_id AS id, active, deleted, event_created, stripe_created
		FROM catalog_products WHERE livemode = $1
		UNION ALL
		SELECT 'price', price_id, active, deleted, event_created, stripe_created
		FROM catalog_prices WHERE livemode = $1`, r.s.livemode).Scan(&rows).Error; err != nil {
		return nil, fmt.Errorf("load the local catalog: %w", err)
	}
	l := &catLocal{products: map[string]*catalog.ProductView{}, prices: map[string]*catalog.PriceView{}, rows: map[string]catRow{}}
	for i := range products {
		l.products[products[i].ProductID] = &products[i]
	}
	for i := range prices {
		l.prices[prices[i].PriceID] = &prices[i]
	}
	for _, row := range rows {
		l.rows[row.Kind+":"+row.ID] = row
	}
	return l, nil
}

// catalogPage compares a page's objects with the local catalog, repairs what differs (one
// transaction), records the drift rows and the run's counts, and writes the progress line.
func (r *run) catalogPage(ctx context.Context, pg catPage, local *catLocal) error {
	var items []*catItem
	objects, errs := pg.unreadable, pg.unreadable
	r.s.metrics.catalogObjects.Add(float64(pg.unreadable))
	// unread counts an object the catalog cannot keep as an error about it alone; any other
	// error stops the run.
	unread := func(kind, id string, err error) error {
		var u unreadable
		if !errors.As(err, &u) {
			return err
		}
		r.catalogError(kind, id, err)
		errs++
		return nil
	}
	examine := func(o *catObject) error {
		objects++
		r.s.metrics.catalogObjects.Inc()
		it, err := r.examineCatalog(ctx, o, local)
		if err != nil {
			return unread(o.kind, o.id, err)
		}
		if it != nil {
			items = append(items, it)
		}
		return nil
	}
	for _, o := range pg.objs {
		if err := examine(o); err != nil {
			return err
		}
	}
	for _, key := range pg.missing {
		kind, id, _ := strings.Cut(key, ":")
		// Stripe did not list it: a retrieve says whether it is gone, or was only not listed
		// (then it is compared as a listed one).
		o, err := r.retrieve(ctx, kind, id)
		if err != nil {
			if err := unread(kind, id, err); err != nil {
				return err
			}
			objects++
			continue
		}
		if !o.gone {
			if err := examine(o); err != nil {
				return err
			}
			continue
		}
		if it := r.goneAtStripe(o, local); it != nil {
			items = append(items, it)
		}
	}
	if len(items) > 0 && !r.opts.DryRun {
		if err := r.repairCatalog(ctx, items); err != nil {
			return err
		}
	}
	drifted, repaired := len(items), 0
	var rows []newDrift
	for _, it := range items {
		if !r.opts.DryRun {
			it.settle()
		}
		all := true
		for _, o := range it.out {
			rows = append(rows, newDrift{subscriptionID: it.obj.id, outcome: o})
			all = all && o.repaired
		}
		if all && !r.opts.DryRun {
			repaired++
		}
	}
	r.sum.CatalogObjects += objects
	r.sum.CatalogDrifted += drifted
	r.sum.CatalogRepaired += repaired
	r.sum.Drifted += drifted
	r.sum.Repaired += repaired
	r.sum.Errors += errs
	return r.flushCatalog(ctx, pg.what, rows)
}

// examineCatalog compares one object Stripe answered with its local row; nil when nothing
// differs.
func (r *run) examineCatalog(ctx context.Context, o *catObject, local *catLocal) (*catItem, error) {
	key := o.kind + ":" + o.id
	diffs := local.compare(o)
	if row, ok := local.rows[key]; ok && len(diffs) > 0 && !row.EventCreated.Before(o.fetchedAt.UTC().Truncate(time.Second)) {
		// The row has news from the read's second or later (an event that arrived while the
		// lists were on their way): the read cannot tell whether the row is wrong, a fresh one
		// can.
		fresh, err := r.retrieve(ctx, o.kind, o.id)
		if err != nil {
			return nil, err
		}
		if fresh.gone {
			return nil, nil // deleted meanwhile: its event says so, or the next run's check
		}
		fresh.features, fresh.featuresRead = o.features, o.featuresRead
		o = fresh
		diffs = local.compare(o)
	}
	var features *diff
	if o.kind == kindProduct && !o.featuresRead.IsZero() {
		features = local.featuresDiff(o)
	}
	if len(diffs) == 0 && features == nil {
		return nil, nil
	}
	it := &catItem{obj: o, diffs: diffs, features: features, product: o.product, price: o.price,
		w: catalog.ReadWrite("reconcile:"+r.sum.RunID, o.fetchedAt, r.s.livemode), deletedLocally: local.rows[key].Deleted}
	if r.opts.DryRun {
		it.dryRun()
	}
	return it, nil
}

// goneAtStripe is the drift of a local object that Stripe no longer has. Its repair is the
// write of its deletion event (the row stays, inactive and deleted), only on Stripe's 404 for
// that very id in the key's mode: the answer is Stripe's own word that the object is gone, which
// is what the lost event said. An object merely not listed is retrieved and compared instead.
func (r *run) goneAtStripe(o *catObject, local *catLocal) *catItem {
	key := o.kind + ":" + o.id
	row, ok := local.rows[key]
	if !ok {
		return nil
	}
	state := "active"
	if !row.Active {
		state = "inactive"
	}
	field := FieldProductMissingAtStripe
	w := catalog.ReadWrite("reconcile:"+r.sum.RunID, o.fetchedAt, r.s.livemode)
	w.Deleted = true
	it := &catItem{obj: o, w: w}
	var created time.Time
	if row.StripeCreated != nil {
		created = *row.StripeCreated
	}
	if o.kind == kindProduct {
		v := local.products[o.id]
		if v == nil {
			return nil
		}
		it.product = catalog.Product{ID: v.ProductID, Name: v.Name, Description: v.Description, Active: row.Active, Created: created}
	} else {
		field = FieldPriceMissingAtStripe
		v := local.prices[o.id]
		if v == nil {
			return nil
		}
		it.price = catalog.Price{ID: v.PriceID, ProductID: v.ProductID, LookupKey: v.LookupKey, Nickname: v.Nickname,
			Currency: v.Currency, UnitAmount: v.UnitAmount, BillingScheme: v.BillingScheme, TiersMode: v.TiersMode,
			Tiers: v.Tiers, Recurring: v.Recurring, Active: row.Active, Created: created}
	}
	it.diffs = []diff{{Field: field, Local: state}}
	if r.opts.DryRun {
		it.dryRun()
	}
	return it
}

func (it *catItem) dryRun() {
	for _, d := range it.diffs {
		it.out = append(it.out, outcome{diff: d, reason: "dry run"})
	}
	if it.features != nil {
		it.out = append(it.out, outcome{diff: *it.features, reason: "dry run"})
	}
}

// compare lists the fields in which the local object differs from Stripe's; a missing local
// object is one diff.
func (l *catLocal) compare(o *catObject) []diff {
	var out []diff
	add := func(field, local, stripe string) {
		if local != stripe {
			out = append(out, diff{Field: field, Local: local, Stripe: stripe})
		}
	}
	if o.kind == kindProduct {
		p, v := o.product, l.products[o.id]
		if v == nil {
			return []diff{{Field: FieldProductMissingLocally, Stripe: p.Name}}
		}
		add(FieldProductName, v.Name, p.Name)
		add(FieldProductDescription, deref(v.Description), deref(p.Description))
		add(FieldProductActive, strconv.FormatBool(l.rows[kindProduct+":"+o.id].Active), strconv.FormatBool(p.Active))
		return out
	}
	p, v := o.price, l.prices[o.id]
	if v == nil {
		return []diff{{Field: FieldPriceMissingLocally, Stripe: p.ProductID}}
	}
	add(FieldPriceProduct, v.ProductID, p.ProductID)
	add(FieldPriceLookupKey, deref(v.LookupKey), deref(p.LookupKey))
	add(FieldPriceNickname, deref(v.Nickname), deref(p.Nickname))
	add(FieldPriceCurrency, v.Currency, p.Currency)
	add(FieldPriceUnitAmount, quantityText(v.UnitAmount), quantityText(p.UnitAmount))
	add(FieldPriceBillingScheme, v.BillingScheme, p.BillingScheme)
	add(FieldPriceTiersMode, deref(v.TiersMode), deref(p.TiersMode))
	add(FieldPriceTiers, tiersText(v.Tiers), tiersText(p.Tiers))
	lr, sr := recurringText(v.Recurring), recurringText(p.Recurring)
	add(FieldPriceRecurringInterval, lr[0], sr[0])
	add(FieldPriceRecurringIntervalCount, lr[1], sr[1])
	add(FieldPriceRecurringUsageType, lr[2], sr[2])
	add(FieldPriceRecurringMeter, lr[3], sr[3])
	add(FieldPriceActive, strconv.FormatBool(l.rows[kindPrice+":"+o.id].Active), strconv.FormatBool(p.Active))
	return out
}

// featuresDiff compares a product's features as read with the stored ones; nil when they agree,
// or when a read that began later is stored (the features job's, after a product event).
func (l *catLocal) featuresDiff(o *catObject) *diff {
	v := l.products[o.id]
	var local []string
	if v != nil {
		if v.FeaturesReadAt != nil && !v.FeaturesReadAt.Before(o.featuresRead) {
			return nil
		}
		local = v.Features
	}
	lt, st := strings.Join(local, ","), strings.Join(o.features, ",")
	if lt == st {
		return nil
	}
	return &diff{Field: FieldProductFeatures, Local: lt, Stripe: st}
}

func tiersText(tiers []catalog.Tier) string {
	if len(tiers) == 0 {
		return ""
	}
	b, _ := json.Marshal(tiers)
	return string(b)
}

// recurringText is interval, interval count, usage type and meter ("" each for a one-time price).
func recurringText(rc *catalog.Recurring) [4]string {
	if rc == nil {
		return [4]string{}
	}
	return [4]string{rc.Interval, strconv.FormatInt(rc.IntervalCount, 10), rc.UsageType, deref(rc.Meter)}
}

// repairCatalog applies the page's objects that differ, and their features, in one
// transaction: products through PutProduct, prices through PutPrice, as the reads they are.
// Whether each write took the row is what the repair reports (a write that took it stored
// every compared field as read).
func (r *run) repairCatalog(ctx context.Context, items []*catItem) error {
	cat := r.s.catalog
	return r.s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		for _, it := range items {
			var err error
			switch {
			case len(it.diffs) == 0:
			case it.obj.kind == kindProduct:
				it.applied, err = cat.PutProduct(ctx, tx, it.product, it.w)
			default:
				it.applied, err = cat.PutPrice(ctx, tx, it.price, it.w)
			}
			if err == nil && it.features != nil {
				it.featuresApplied, err = cat.PutFeatures(ctx, tx, r.s.livemode, it.obj.id, it.obj.features, it.obj.featuresRead)
			}
			if err != nil {
				return fmt.Errorf("repair %s %s: %w", it.obj.kind, it.obj.id, err)
			}
		}
		return nil
	})
}

// settle decides the drift rows of a repaired item.
func (it *catItem) settle() {
	reason := "an event newer than Stripe's answer changed the " + it.obj.kind + " meanwhile; the next run compares again"
	if it.deletedLocally {
		reason = "the " + it.obj.kind + " is deleted locally, and a deleted " + it.obj.kind + " takes no write"
	}
	for _, d := range it.diffs {
		o := outcome{diff: d, repaired: it.applied}
		if !o.repaired {
			o.reason = reason
		}
		it.out = append(it.out, o)
	}
	if it.features != nil {
		o := outcome{diff: *it.features, repaired: it.featuresApplied}
		if !o.repaired {
			o.reason = "a later read of the product's features was stored meanwhile; the next run compares again"
		}
		it.out = append(it.out, o)
	}
}

// catalogError counts an object Stripe sent that the catalog cannot keep.
func (r *run) catalogError(kind, id string, err error) {
	r.s.log.Warn("reconcile: catalog object not read", "run_id", r.sum.RunID, "kind", kind, "id", id, "error", err)
}

// flushCatalog records a page's drift rows and the run's counts so far in one transaction, and
// writes the page's progress line.
func (r *run) flushCatalog(ctx context.Context, what string, rows []newDrift) error {
	err := r.s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := r.insertDrift(tx, rows, r.s.now().UTC()); err != nil {
			return err
		}
		return tx.Exec(`
			UPDATE reconcile_runs SET objects = $2, drifted = $3, repaired = $4, errors = $5 WHERE run_id = $1 AND livemode = $6`,
			r.sum.RunID, r.sum.Objects, r.sum.Drifted, r.sum.Repaired, r.sum.Errors, r.s.livemode).Error
	})
	if err != nil {
		return fmt.Errorf("record the catalog's %s: %w", what, err)
	}
	for _, d := range rows {
		r.s.metrics.drift.WithLabelValues(d.Field).Inc()
	}
	r.progress("reconcile: catalog %s: catalog_objects=%d catalog_drifted=%d catalog_repaired=%d errors=%d",
		what, r.sum.CatalogObjects, r.sum.CatalogDrifted, r.sum.CatalogRepaired, r.sum.Errors)
	return nil
}

// progress writes a progress line (the command's stderr) and logs it at debug.
func (r *run) progress(format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	if r.opts.Progress != nil {
		fmt.Fprintln(r.opts.Progress, line)
	}
	r.s.log.Debug(line, "run_id", r.sum.RunID)
}
