package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"gorm.io/gorm"

	"billing/catalog"
)

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

// goneAtStripe is the drift of a local object that Stripe no longer has, on Stripe's 404 for that
// very id in the key's mode (an object merely not listed is retrieved and compared instead). Its
// repair makes it inactive, not deleted: a run with another account's key answers 404 for every
// object, and a deleted row takes no write, so that mistake would stay; an inactive one sells
// nothing, and the next run with the right key reads it back.
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
		it.product = catalog.Product{ID: v.ProductID, Name: v.Name, Description: v.Description, Created: created}
	} else {
		field = FieldPriceMissingAtStripe
		v := local.prices[o.id]
		if v == nil {
			return nil
		}
		it.price = catalog.Price{ID: v.PriceID, ProductID: v.ProductID, LookupKey: v.LookupKey, Nickname: v.Nickname,
			Currency: v.Currency, UnitAmount: v.UnitAmount, BillingScheme: v.BillingScheme, TiersMode: v.TiersMode,
			Tiers: v.Tiers, Recurring: v.Recurring, Created: created}
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
