package reconcile

import (
	"context"
	"fmt"
	"strings"

	"github.com/stripe/stripe-go/v79"
	"gorm.io/gorm"

	"billing/billing"
	"billing/webhooks"
)

// pageWork is a page being compared and repaired, with what it found; its counts join the run's
// when it is recorded, in page order.
type pageWork struct {
	n    int
	subs []remote
	// keys are the page's customers and the users their metadata names: a page waits for any
	// earlier page in flight that shares one, so that a link or a list of features is compared
	// after an earlier page's repair of it, as one page at a time would.
	keys map[string]bool
	// linked are the customers of the page whose link a subscription already carries: one
	// subscription of a page reports and repairs its customer's link, the others would only
	// repeat it (a customer's subscriptions usually sit together, and the set stays small);
	// features are the page's customers whose features differ, until a subscription of theirs
	// carries the drift.
	linked   map[string]bool
	features map[string]*featureDrift

	items                              []*item
	objects, drifted, repaired, errors int
	err                                error // what must stop the run
	done                               chan struct{}
}

func newPageWork(n int, subs []remote) *pageWork {
	w := &pageWork{n: n, subs: subs, keys: map[string]bool{}, linked: map[string]bool{}, done: make(chan struct{})}
	for _, rem := range subs {
		if c := rem.sub.Customer; c != nil {
			w.keys["customer:"+c.ID] = true
			if u := c.Metadata["user_id"]; u != "" {
				w.keys["user:"+u] = true
			}
		}
	}
	return w
}

// shares reports whether two pages name a customer or a user in common.
func (w *pageWork) shares(o *pageWork) bool {
	for k := range w.keys {
		if o.keys[k] {
			return true
		}
	}
	return false
}

// item is a subscription that differs, on its way through the page's repair.
type item struct {
	rem   remote
	diffs []diff
	link  *linkDrift
	// features is its customer's list of features when it differs.
	features *featureDrift
	// out are its drift rows once decided; set early for what no repair can change.
	out []outcome
	// err is why its repair failed (an error about this subscription only).
	err error
}

// process compares a page's subscriptions with the local state and repairs what differs: one
// query reads the page's local rows and one its customers' links, the repairs
// share one transaction (each in a savepoint, so that one subscription's failure leaves the
// others), one query reads the repaired rows back, and the page's drift rows and counts are one
// more transaction. Per subscription, only the apply itself talks to the database. Only an error
// that must stop the run is returned.
func (r *run) process(ctx context.Context, w *pageWork) error {
	subs := w.subs
	ids := make([]string, len(subs))
	customers := make([]*stripe.Customer, len(subs))
	for i, rem := range subs {
		ids[i], customers[i] = rem.sub.ID, rem.sub.Customer
	}
	locals, err := r.s.billing.Subscriptions(ctx, ids, r.s.livemode)
	if err != nil {
		return fmt.Errorf("load the page's subscriptions: %w", err)
	}
	links, err := r.loadLinks(ctx, customers)
	if err != nil {
		return err
	}
	if w.features, err = r.pageFeatures(ctx, subs); err != nil {
		return err
	}
	for _, rem := range subs {
		it, err := r.examine(ctx, w, rem, locals[rem.sub.ID], links)
		if err != nil {
			return err
		}
		if it != nil {
			w.items = append(w.items, it)
		}
	}
	w.drifted = len(w.items)
	if len(w.items) > 0 && !r.opts.DryRun {
		if err := r.repair(ctx, w); err != nil {
			return err
		}
		if err := r.settle(ctx, w); err != nil {
			return err
		}
	}
	return nil
}

// record keeps a processed page: its listed ids (in the lock's session), its drift rows and the
// run's counts with its own.
func (r *run) record(ctx context.Context, w *pageWork) error {
	ids := make([]string, len(w.subs))
	for i, rem := range w.subs {
		ids[i] = rem.sub.ID
	}
	if _, err := r.lk.conn.ExecContext(ctx,
		`INSERT INTO pg_temp.reconcile_seen (subscription_id) SELECT unnest(CAST($1 AS text[])) ON CONFLICT DO NOTHING`, ids); err != nil {
		return fmt.Errorf("record the listed ids: %w", err)
	}
	r.pages = w.n
	r.sum.Objects += w.objects
	r.sum.Drifted += w.drifted
	r.sum.Repaired += w.repaired
	r.sum.Errors += w.errors
	return r.flush(ctx, w.items)
}

// flush records a page's drift rows and the run's counts so far in one transaction, and writes
// the page's progress line.
func (r *run) flush(ctx context.Context, items []*item) error {
	now := r.s.now().UTC()
	var rows []newDrift
	for _, it := range items {
		for _, o := range it.out {
			rows = append(rows, newDrift{subscriptionID: it.rem.sub.ID, outcome: o})
		}
	}
	err := r.s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := r.insertDrift(tx, rows, now); err != nil {
			return err
		}
		return tx.Exec(`
			UPDATE reconcile_runs SET objects = $2, drifted = $3, repaired = $4, errors = $5 WHERE run_id = $1 AND livemode = $6`,
			r.sum.RunID, r.sum.Objects, r.sum.Drifted, r.sum.Repaired, r.sum.Errors, r.s.livemode).Error
	})
	if err != nil {
		return fmt.Errorf("record page %d: %w", r.pages, err)
	}
	for _, it := range items {
		for _, o := range it.out {
			r.s.metrics.drift.WithLabelValues(o.Field).Inc()
		}
	}
	line := fmt.Sprintf("reconcile: page %d: objects=%d drifted=%d repaired=%d errors=%d",
		r.pages, r.sum.Objects, r.sum.Drifted, r.sum.Repaired, r.sum.Errors)
	if r.opts.Progress != nil {
		fmt.Fprintln(r.opts.Progress, line)
	}
	r.s.log.DebugContext(ctx, "reconcile page", "run_id", r.sum.RunID, "page", r.pages, "objects", r.sum.Objects)
	return nil
}

// examine compares one subscription with its local row (nil when there is none); nil when
// nothing differs.
func (r *run) examine(ctx context.Context, w *pageWork, rem remote, local *billing.Subscription, links *linkSet) (*item, error) {
	w.objects++
	r.s.metrics.objects.Inc()
	id := rem.sub.ID
	diffs := compare(local, rem.sub)
	if len(diffs) > 0 && newerLocally(local, rem.fetchedAt) {
		// The row has news from the page's second or later (an event that arrived while the
		// page was on its way): the page cannot tell whether the row is wrong, a fresh read can.
		fresh, err := r.reread(ctx, id)
		switch {
		case err != nil && gone(err):
			it := &item{rem: rem, diffs: diffs}
			r.fail(w, it, fmt.Errorf("re-read: %w", err))
			return it, nil
		case err != nil:
			return nil, err
		}
		rem = *fresh
		diffs = compare(local, rem.sub)
	}
	var link *linkDrift
	if c := rem.sub.Customer; c != nil && !w.linked[c.ID] {
		var err error
		if link, err = r.linkDiff(ctx, c, links); err != nil {
			return nil, err
		}
		w.linked[c.ID] = true
	}
	var features *featureDrift
	if c := rem.sub.Customer; c != nil {
		features = w.features[c.ID]
		delete(w.features, c.ID)
	}
	if len(diffs) == 0 && link == nil && features == nil {
		return nil, nil
	}
	it := &item{rem: rem, diffs: diffs, link: link, features: features}
	if r.opts.DryRun {
		for _, d := range diffs {
			it.out = append(it.out, outcome{diff: d, reason: "dry run"})
		}
		if features != nil {
			it.out = append(it.out, outcome{diff: features.diff, reason: "dry run"})
		}
		if link != nil {
			reason := link.reason
			if reason == "" {
				reason = "dry run"
			}
			it.out = append(it.out, outcome{diff: link.diff, reason: reason})
		}
	}
	return it, nil
}

// repair applies each item's subscription as a snapshot and links its customer, in one
// transaction with a savepoint per subscription.
func (r *run) repair(ctx context.Context, w *pageWork) error {
	return r.s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		for _, it := range w.items {
			if it.out != nil {
				continue // decided already: nothing to apply
			}
			err := tx.Transaction(func(tx *gorm.DB) error {
				if len(it.diffs) > 0 {
					if _, err := r.s.billing.ApplySnapshot(ctx, tx, billing.Snapshot{
						Livemode: r.s.livemode, Subscription: it.rem.raw, LatestInvoice: it.rem.invoice,
						FetchedAt: it.rem.fetchedAt, Source: "reconcile:" + r.sum.RunID,
					}); err != nil {
						return err
					}
				}
				if it.features != nil {
					if _, err := r.s.features.ApplyFeatureRead(ctx, tx, it.features.read); err != nil {
						return err
					}
				}
				if it.link != nil && it.link.repairable {
					return r.link(ctx, tx, it.rem.sub.Customer)
				}
				return nil
			})
			switch {
			case err != nil && webhooks.IsPermanent(err):
				r.fail(w, it, err)
			case err != nil:
				return fmt.Errorf("repair subscription %s: %w", it.rem.sub.ID, err)
			}
		}
		return nil
	})
}

// settle compares the repaired subscriptions again, read back in one query (and their links in
// another): a field counts as repaired only when the local state now says what Stripe said.
func (r *run) settle(ctx context.Context, w *pageWork) error {
	var ids, featured []string
	var customers []*stripe.Customer
	for _, it := range w.items {
		if it.out != nil {
			continue
		}
		ids = append(ids, it.rem.sub.ID)
		if it.link != nil && it.link.repairable {
			customers = append(customers, it.rem.sub.Customer)
		}
		if it.features != nil {
			featured = append(featured, it.features.read.StripeCustomerID)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	locals, err := r.s.billing.Subscriptions(ctx, ids, r.s.livemode)
	if err != nil {
		return fmt.Errorf("load the page's repaired subscriptions: %w", err)
	}
	links, err := r.loadLinks(ctx, customers)
	if err != nil {
		return err
	}
	features, err := r.s.features.CustomerFeaturesOf(ctx, featured, r.s.livemode)
	if err != nil {
		return err
	}
	for _, it := range w.items {
		if it.out != nil {
			continue
		}
		local := locals[it.rem.sub.ID]
		still := map[string]bool{}
		for _, d := range compare(local, it.rem.sub) {
			still[d.Field] = true
		}
		reason := "the snapshot was not applied: the local subscription is terminal, and Stripe never revives one"
		if newerLocally(local, it.rem.fetchedAt) {
			reason = "an event newer than Stripe's answer changed the subscription meanwhile; the next run compares again"
		}
		all := true
		for _, d := range it.diffs {
			o := outcome{diff: d, repaired: !still[d.Field]}
			if !o.repaired {
				o.reason, all = reason, false
			}
			it.out = append(it.out, o)
		}
		if f := it.features; f != nil {
			now := features[f.read.StripeCustomerID]
			o := outcome{diff: f.diff, repaired: strings.Join(now.LookupKeys, ",") == f.diff.Stripe}
			if !o.repaired {
				o.reason, all = "an event newer than Stripe's answer changed the features meanwhile; the next run compares again", false
			}
			it.out = append(it.out, o)
		}
		if link := it.link; link != nil {
			o := outcome{diff: link.diff, reason: link.reason}
			if link.repairable {
				after, err := r.linkDiff(ctx, it.rem.sub.Customer, links)
				if err != nil {
					return err
				}
				o.repaired = after == nil
				if after != nil {
					o.reason = "the customer was linked otherwise meanwhile: " + after.diff.Local
				}
			}
			all = all && o.repaired
			it.out = append(it.out, o)
		}
		if all {
			w.repaired++
		}
	}
	return nil
}

// fail counts an error that concerns one subscription only; its drift is recorded as not
// repaired.
func (r *run) fail(w *pageWork, it *item, cause error) {
	w.errors++
	r.s.log.Warn("reconcile: subscription not repaired", "run_id", r.sum.RunID, "subscription_id", it.rem.sub.ID, "error", cause)
	all := it.diffs
	if it.features != nil {
		all = append(all[:len(all):len(all)], it.features.diff)
	}
	if it.link != nil {
		all = append(all[:len(all):len(all)], it.link.diff)
	}
	it.out = it.out[:0]
	for _, d := range all {
		it.out = append(it.out, outcome{diff: d, reason: "error: " + cause.Error()})
	}
}
