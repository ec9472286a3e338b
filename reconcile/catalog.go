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
	"fmt"
	"slices"
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
	// Local objects the lists did not hold that the catalog still sells. Those whose news is from
	// the list's first second or later are left out: they may be newer than the list (created
	// while it was read). An inactive or deleted one sells nothing, whatever Stripe says.
	var missing []string
	for key, row := range local.rows {
		from := productsFrom
		if row.Kind == kindPrice {
			from = pricesFrom
		}
		if !listed[key] && row.Active && !row.Deleted && row.EventCreated.Before(from.UTC().Truncate(time.Second)) {
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

// catalogError counts an object Stripe sent that the catalog cannot keep.
func (r *run) catalogError(kind, id string, err error) {
	r.s.log.Warn("reconcile: catalog object not read", "run_id", r.sum.RunID, "kind", kind, "id", id, "error", err)
}

// progress writes a progress line (the command's stderr) and logs it at debug.
func (r *run) progress(format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	if r.opts.Progress != nil {
		fmt.Fprintln(r.opts.Progress, line)
	}
	r.s.log.Debug(line, "run_id", r.sum.RunID)
}
