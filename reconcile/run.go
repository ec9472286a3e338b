package reconcile

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/form"
	"gorm.io/gorm"

	"billing/billing"
	"billing/internal/audit"
	"billing/internal/database"
	"billing/internal/ids"
	"billing/webhooks"
)

// pageSize is Stripe's largest page.
const pageSize = 100

// remote is one subscription as Stripe answered it, with its latest invoice and customer
// expanded, and when it was read.
type remote struct {
	sub       *stripe.Subscription
	raw       json.RawMessage
	invoice   json.RawMessage
	fetchedAt time.Time
}

// run is one reconciliation in progress.
type run struct {
	s       *Service
	lk      *runLock
	opts    RunOptions
	started time.Time
	sum     Summary
	pages   int // the last page recorded
}

// begin records a new run; the caller holds the mode's lock. Runs left unfinished by a process
// that died (no lock held, since this one got it) are marked interrupted first.
func (s *Service) begin(ctx context.Context, lk *runLock, opts RunOptions) (*run, error) {
	if s.billing == nil {
		return nil, errors.New("reconcile: no local state to reconcile (SetBilling not called)")
	}
	if opts.Trigger == "" {
		opts.Trigger = TriggerCommand
	}
	now := s.now().UTC()
	r := &run{s: s, lk: lk, opts: opts, started: now, sum: Summary{RunID: newRunID(now), DryRun: opts.DryRun, Catalog: s.catalog != nil}}
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Exec(`
			UPDATE reconcile_runs SET finished_at = $1, errors = errors + 1,
			  error = 'interrupted: the process running it stopped before the end'
			WHERE livemode = $2 AND finished_at IS NULL`, now, s.livemode).Error; err != nil {
			return err
		}
		if err := tx.Exec(`
			INSERT INTO reconcile_runs (run_id, livemode, dry_run, trigger, started_at) VALUES ($1, $2, $3, $4, $5)`,
			r.sum.RunID, s.livemode, opts.DryRun, opts.Trigger, now).Error; err != nil {
			return err
		}
		if opts.Actor == "" {
			return nil
		}
		result := "started"
		if opts.DryRun {
			result = "started (dry run)"
		}
		return audit.RecordBy(ctx, tx, opts.Actor, audit.ActionReconcileStart, r.sum.RunID, s.livemode, result)
	})
	if err != nil {
		return nil, fmt.Errorf("reconcile: record the run: %w", err)
	}
	// The ids Stripe listed, for the subscriptions it did not: in the lock's session, so that a
	// huge account costs disk, not memory.
	if _, err := lk.conn.ExecContext(ctx, `
		CREATE TEMP TABLE IF NOT EXISTS reconcile_seen (subscription_id text PRIMARY KEY);
		TRUNCATE pg_temp.reconcile_seen`); err != nil {
		r.finish(ctx, fmt.Errorf("create the table of listed ids: %w", err))
		return nil, fmt.Errorf("reconcile: %w", err)
	}
	s.log.InfoContext(ctx, "reconcile run started", "run_id", r.sum.RunID, "dry_run", opts.DryRun,
		"trigger", opts.Trigger, "mode", modeName(s.livemode))
	return r, nil
}

// execute lists, compares and repairs, then records the outcome.
func (r *run) execute(ctx context.Context) Summary {
	err := r.list(ctx)
	if err == nil {
		err = r.missingAtStripe(ctx)
	}
	if err == nil {
		err = r.catalogPass(ctx)
	}
	if err != nil && ctx.Err() != nil {
		err = fmt.Errorf("interrupted: %w", context.Cause(ctx))
	}
	r.finish(ctx, err)
	return r.sum
}

// page is one page of the listing.
type page struct {
	n         int
	raws      []json.RawMessage
	fetchedAt time.Time
	more      bool
	err       error
}

// pagesInFlight is how many pages are compared and repaired at once. Repairing a page is a
// chain of round trips (each waits for the one before), so a second page in its own
// transaction keeps both the database and this process busy meanwhile; pages that share a
// customer or a user never run together.
const pagesInFlight = 2

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

// list walks every page of the mode's subscriptions, newest first. The next page is read while
// the current ones are compared and repaired, so that Stripe's answer time and the database's
// work overlap; up to pagesInFlight pages are repaired at once, each in its own goroutine, and
// recorded in page order. When a page fails, the pages in flight finish and are recorded (what
// they repaired is committed), then the run stops with the first failure.
func (r *run) list(ctx context.Context) error {
	// The pages are read one after the other (each starts after the last id of the one before)
	// by a goroutine of their own, a page ahead of the one handed over; it is gone when list
	// returns.
	fetchCtx, cancel := context.WithCancel(ctx)
	pages := make(chan page, 1)
	stopped := make(chan struct{})
	defer func() {
		cancel()
		<-stopped
	}()
	go func() {
		defer close(stopped)
		defer close(pages)
		after := ""
		for n := 1; ; n++ {
			raws, more, last, fetchedAt, err := r.page(fetchCtx, n, after)
			pg := page{n: n, raws: raws, fetchedAt: fetchedAt, more: more && len(raws) > 0, err: err}
			select {
			case pages <- pg:
			case <-fetchCtx.Done():
				return
			}
			if pg.err != nil || !pg.more {
				return
			}
			after = last
		}
	}()
	var flight []*pageWork
	var failed error
	// settleOldest waits for the oldest page in flight and records it.
	settleOldest := func() {
		w := flight[0]
		flight = flight[1:]
		<-w.done
		if failed != nil {
			if w.err == nil {
				// Its repairs are committed: its drift is recorded all the same.
				if err := r.record(ctx, w); err != nil {
					failed = errors.Join(failed, err)
				}
			}
			return
		}
		if failed = w.err; failed == nil {
			failed = r.record(ctx, w)
		}
	}
	for failed == nil {
		pg, ok := <-pages
		if !ok { // the reader saw the context end before it could hand a page over
			failed = cmp.Or(ctx.Err(), errors.New("the listing stopped"))
			break
		}
		if pg.err != nil {
			failed = pg.err
			break
		}
		subs, err := decodePage(pg.n, pg.raws, pg.fetchedAt)
		if err != nil {
			failed = err
			break
		}
		w := newPageWork(pg.n, subs)
		for len(flight) > 0 && (len(flight) >= pagesInFlight || slices.ContainsFunc(flight, w.shares)) {
			settleOldest()
		}
		if failed != nil {
			break
		}
		flight = append(flight, w)
		go func() {
			defer close(w.done)
			w.err = r.process(ctx, w)
		}()
		if !pg.more {
			break
		}
	}
	for len(flight) > 0 {
		settleOldest()
	}
	return failed
}

// rawPage is a list page as Stripe answered it. Its objects are decoded by the loop that hands
// pages to their workers, not by the reader, so that the next page is asked for as soon as this
// one has arrived.
type rawPage struct {
	stripe.APIResource
	HasMore bool              `json:"has_more"`
	Data    []json.RawMessage `json:"data"`
}

// page reads page n, the subscriptions after the id after ("" for the first), one call under the
// run's limits (a failed page is tried again from where it stopped). It returns the page's
// objects undecoded, whether there are more, and the last id, where the next page starts.
func (r *run) page(ctx context.Context, n int, after string) (raws []json.RawMessage, more bool, last string, fetchedAt time.Time, err error) {
	what := fmt.Sprintf("list subscriptions (page %d)", n)
	fetchedAt, err = r.s.call(ctx, what, func(ctx context.Context) error {
		params := &stripe.SubscriptionListParams{Status: stripe.String("all")}
		params.Context = ctx
		params.Limit = stripe.Int64(pageSize)
		if after != "" {
			params.StartingAfter = stripe.String(after)
		}
		params.AddExpand("data.latest_invoice")
		params.AddExpand("data.customer")
		// The request stripe-go's list iterator would make (the same parameters, encoded by
		// the same code), decoded only as far as the list.
		q := &form.Values{}
		form.AppendTo(q, params)
		sc := r.s.stripe.Subscriptions
		var list rawPage
		if err := sc.B.CallRaw(http.MethodGet, "/v1/subscriptions", sc.Key, q, params.GetParams(), &list); err != nil {
			return err
		}
		raws, more = list.Data, list.HasMore
		return nil
	})
	if err != nil || len(raws) == 0 {
		return nil, false, "", fetchedAt, err
	}
	var end struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(raws[len(raws)-1], &end); err != nil || end.ID == "" {
		return nil, false, "", fetchedAt, fmt.Errorf("%s: the last object has no id", what)
	}
	return raws, more, end.ID, fetchedAt, nil
}

// decodePage decodes a page's subscriptions, each with its expanded invoice and the page's
// fetch time.
func decodePage(n int, raws []json.RawMessage, fetchedAt time.Time) ([]remote, error) {
	subs := make([]remote, len(raws))
	for i, raw := range raws {
		var sub stripe.Subscription
		if err := json.Unmarshal(raw, &sub); err != nil {
			return nil, fmt.Errorf("decode subscription %d of page %d: %w", i+1, n, err)
		}
		subs[i] = remote{sub: &sub, raw: raw, invoice: expandedInvoice(raw), fetchedAt: fetchedAt}
	}
	return subs, nil
}

// reread reads one subscription again, with the same expansions as the list.
func (r *run) reread(ctx context.Context, id string) (*remote, error) {
	var rem remote
	fetchedAt, err := r.s.call(ctx, "read subscription "+id, func(ctx context.Context) error {
		params := &stripe.SubscriptionParams{}
		params.Context = ctx
		params.AddExpand("latest_invoice")
		params.AddExpand("customer")
		sub, err := r.s.stripe.Subscriptions.Get(id, params)
		if err != nil {
			return err
		}
		if sub.LastResponse == nil {
			return errors.New("no response recorded")
		}
		rem = remote{sub: sub, raw: sub.LastResponse.RawJSON, invoice: expandedInvoice(sub.LastResponse.RawJSON)}
		return nil
	})
	if err != nil {
		return nil, err
	}
	rem.fetchedAt = fetchedAt
	return &rem, nil
}

// expandedInvoice is the latest_invoice object of a subscription's JSON, nil when it is not
// expanded or there is none.
func expandedInvoice(raw json.RawMessage) json.RawMessage {
	var o struct {
		LatestInvoice json.RawMessage `json:"latest_invoice"`
	}
	if json.Unmarshal(raw, &o) != nil {
		return nil
	}
	if b := bytes.TrimSpace(o.LatestInvoice); len(b) > 0 && b[0] == '{' {
		return b
	}
	return nil
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
					if _, err := r.s.billing.ApplyFeatureRead(ctx, tx, it.features.read); err != nil {
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
	features, err := r.s.billing.CustomerFeaturesOf(ctx, featured, r.s.livemode)
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

// gone reports whether Stripe said the object does not exist (any more).
func gone(err error) bool {
	var se *stripe.Error
	return errors.As(err, &se) && se.HTTPStatusCode == http.StatusNotFound
}

// linkDrift is a customer link that differs.
type linkDrift struct {
	diff       diff
	repairable bool
	reason     string
}

// linkRow is a row of customers: a user's link, of either mode.
type linkRow struct {
	UserID           string  `gorm:"column:user_id"`
	StripeCustomerID *string `gorm:"column:stripe_customer_id"`
	Livemode         bool    `gorm:"column:livemode"`
}

// linkSet holds the customers rows of a page's users and customers, read in one query.
type linkSet struct {
	users, customers map[string]bool
	rows             []linkRow
}

// loadLinks reads the links of the users that the customers' metadata.user_id names, and of
// the customers themselves, in one query.
func (r *run) loadLinks(ctx context.Context, cs []*stripe.Customer) (*linkSet, error) {
	set := &linkSet{users: map[string]bool{}, customers: map[string]bool{}}
	for _, c := range cs {
		if c == nil || c.Deleted || !ids.Valid(c.Metadata["user_id"]) {
			continue
		}
		set.users[c.Metadata["user_id"]] = true
		set.customers[c.ID] = true
	}
	if len(set.users) == 0 {
		return set, nil
	}
	var err error
	set.rows, err = r.queryLinks(ctx, slices.Collect(maps.Keys(set.users)), slices.Collect(maps.Keys(set.customers)))
	if err != nil {
		return nil, fmt.Errorf("load the links of the page's customers: %w", err)
	}
	return set, nil
}

// queryLinks reads the rows of the users or the customers in the run's mode, ordered by user.
func (r *run) queryLinks(ctx context.Context, users, customers []string) ([]linkRow, error) {
	var rows []linkRow
	err := r.s.db.WithContext(ctx).Raw(
		`SELECT user_id, stripe_customer_id, livemode FROM customers
		WHERE livemode = $3 AND (user_id = ANY($1) OR stripe_customer_id = ANY($2)) ORDER BY user_id`,
		users, customers, r.s.livemode).Scan(&rows).Error
	return rows, err
}

// linksOf are the rows of the user or the customer, from the set when it holds both (else read:
// a re-read customer may name another user than the page did).
func (r *run) linksOf(ctx context.Context, set *linkSet, userID, customerID string) ([]linkRow, error) {
	if !set.users[userID] || !set.customers[customerID] {
		return r.queryLinks(ctx, []string{userID}, []string{customerID})
	}
	var out []linkRow
	for _, row := range set.rows {
		if row.UserID == userID || deref(row.StripeCustomerID) == customerID {
			out = append(out, row)
		}
	}
	return out, nil
}

// linkDiff checks that a customer whose metadata.user_id names a user is linked to that user in
// this mode. Nil when it is, or when the customer names no user.
func (r *run) linkDiff(ctx context.Context, c *stripe.Customer, links *linkSet) (*linkDrift, error) {
	if c == nil || c.Deleted || c.Metadata["user_id"] == "" {
		return nil, nil
	}
	userID := c.Metadata["user_id"]
	want := fmt.Sprintf("user %s → %s (%s)", userID, c.ID, modeName(r.s.livemode))
	if !ids.Valid(userID) {
		return &linkDrift{diff: diff{Field: FieldCustomerLink, Stripe: want},
			reason: "metadata.user_id is not a valid user id"}, nil
	}
	rows, err := r.linksOf(ctx, links, userID, c.ID)
	if err != nil {
		return nil, fmt.Errorf("load the link of customer %s: %w", c.ID, err)
	}
	if len(rows) == 0 {
		return &linkDrift{diff: diff{Field: FieldCustomerLink, Stripe: want}, repairable: true}, nil
	}
	if len(rows) == 1 && rows[0].UserID == userID && deref(rows[0].StripeCustomerID) == c.ID && rows[0].Livemode == r.s.livemode {
		return nil, nil
	}
	var local []string
	for _, row := range rows {
		cust := deref(row.StripeCustomerID)
		if cust == "" {
			cust = "a link still being made"
		}
		local = append(local, fmt.Sprintf("user %s → %s (%s)", row.UserID, cust, modeName(row.Livemode)))
	}
	return &linkDrift{diff: diff{Field: FieldCustomerLink, Local: strings.Join(local, "; "), Stripe: want},
		reason: "the user or the customer is linked otherwise; a link is never overwritten"}, nil
}

// link inserts the customer's link; a concurrent link of the user or the customer wins (the
// comparison after the repair reports it).
func (r *run) link(ctx context.Context, tx *gorm.DB, c *stripe.Customer) error {
	now := r.s.now().UTC()
	res := tx.WithContext(ctx).Exec(`
		INSERT INTO customers (user_id, stripe_customer_id, email, name, livemode, created_at, updated_at)
		VALUES ($1, $2, $3, $4, $5, $6, $6)
		ON CONFLICT DO NOTHING`,
		c.Metadata["user_id"], c.ID, c.Email, c.Name, r.s.livemode, now)
	if res.Error != nil {
		return fmt.Errorf("link customer %s: %w", c.ID, res.Error)
	}
	if res.RowsAffected == 0 {
		return nil
	}
	if err := r.s.billing.TellUser(ctx, tx, c.Metadata["user_id"]); err != nil {
		return err
	}
	r.s.log.InfoContext(ctx, "reconcile: customer linked", "run_id", r.sum.RunID, "user_id", c.Metadata["user_id"], "stripe_customer_id", c.ID)
	return nil
}

// missingAtStripe records the local subscriptions of the mode that Stripe did not list. Rows
// created after the run started are left out: their subscription may be newer than the listing.
func (r *run) missingAtStripe(ctx context.Context) error {
	rows, err := r.lk.conn.QueryContext(ctx, `
		SELECT s.subscription_id, s.status FROM subscriptions s
		WHERE s.livemode = $1 AND s.created_at < $2
		  AND NOT EXISTS (SELECT 1 FROM pg_temp.reconcile_seen r WHERE r.subscription_id = s.subscription_id)
		ORDER BY s.subscription_id`, r.s.livemode, r.started)
	if err != nil {
		return fmt.Errorf("find subscriptions missing at Stripe: %w", err)
	}
	missing, err := database.ScanAll[struct {
		SubscriptionID string `gorm:"column:subscription_id"`
		Status         string `gorm:"column:status"`
	}](rows)
	if err != nil {
		return fmt.Errorf("find subscriptions missing at Stripe: %w", err)
	}
	if len(missing) == 0 {
		return nil
	}
	drift := make([]newDrift, len(missing))
	for i, m := range missing {
		drift[i] = newDrift{subscriptionID: m.SubscriptionID, outcome: outcome{diff: diff{Field: FieldMissingAtStripe, Local: m.Status},
			reason: "Stripe did not list it; local subscriptions are never deleted"}}
	}
	if err := r.insertDrift(r.s.db.WithContext(ctx), drift, r.s.now().UTC()); err != nil {
		return err
	}
	r.sum.MissingAtStripe = len(missing)
	r.s.metrics.drift.WithLabelValues(FieldMissingAtStripe).Add(float64(len(missing)))
	return nil
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

// finish records the outcome. cause is what stopped the run, nil when it went through.
func (r *run) finish(ctx context.Context, cause error) {
	if cause != nil {
		r.sum.Err = cause
		r.sum.Errors++
	}
	// A fresh context: a run stopped by its context's end must still record that it stopped.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	var errText *string
	if cause != nil {
		t := cause.Error()
		errText = &t
	}
	finished := r.s.now().UTC()
	err := r.s.db.WithContext(ctx).Exec(`
		UPDATE reconcile_runs SET finished_at = $2, objects = $3, drifted = $4, repaired = $5,
		  missing_at_stripe = $6, errors = $7, error = $8
		WHERE run_id = $1 AND livemode = $9`,
		r.sum.RunID, finished, r.sum.Objects, r.sum.Drifted, r.sum.Repaired, r.sum.MissingAtStripe, r.sum.Errors, errText, r.s.livemode).Error
	if err != nil {
		r.s.log.ErrorContext(ctx, "reconcile: record the run's outcome", "run_id", r.sum.RunID, "error", err)
	}
	attrs := []any{"run_id", r.sum.RunID, "dry_run", r.opts.DryRun, "objects", r.sum.Objects, "drifted", r.sum.Drifted,
		"repaired", r.sum.Repaired, "missing_at_stripe", r.sum.MissingAtStripe, "errors", r.sum.Errors,
		"duration", finished.Sub(r.started)}
	if r.sum.Catalog {
		attrs = append(attrs, "catalog_objects", r.sum.CatalogObjects, "catalog_drifted", r.sum.CatalogDrifted,
			"catalog_repaired", r.sum.CatalogRepaired)
	}
	if cause != nil {
		r.s.log.ErrorContext(ctx, "reconcile run stopped before the end", append(attrs, "error", cause)...)
		return
	}
	level := slog.LevelInfo
	if r.sum.ExitCode() != ExitClean {
		level = slog.LevelWarn
	}
	r.s.log.Log(ctx, level, "reconcile run finished", attrs...)
	if !r.opts.DryRun {
		r.s.metrics.lastSuccess.Set(float64(finished.Unix()))
	}
}

// outcome is one drift row.
type outcome struct {
	diff
	repaired bool
	reason   string
}

// newDrift is a drift row on its way to reconcile_drift.
type newDrift struct {
	subscriptionID string
	outcome
}

// insertDrift stores drift rows in one statement, in their order (the order of the drift list).
func (r *run) insertDrift(tx *gorm.DB, rows []newDrift, now time.Time) error {
	if len(rows) == 0 {
		return nil
	}
	n := len(rows)
	subs, fields, locals, stripes := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	repaired, reasons := make([]bool, n), make([]*string, n)
	for i, d := range rows {
		subs[i], fields[i], locals[i], stripes[i], repaired[i] = d.subscriptionID, d.Field, d.Local, d.Stripe, d.repaired
		if d.reason != "" && !d.repaired {
			reasons[i] = &d.reason
		}
	}
	err := tx.Exec(`
		INSERT INTO reconcile_drift (run_id, subscription_id, livemode, field, local, stripe, repaired, reason, created_at)
		SELECT $1, d.subscription_id, $2, d.field, d.local, d.stripe, d.repaired, d.reason, $3
		FROM unnest(CAST($4 AS text[]), CAST($5 AS text[]), CAST($6 AS text[]), CAST($7 AS text[]), CAST($8 AS boolean[]), CAST($9 AS text[]))
		  WITH ORDINALITY AS d(subscription_id, field, local, stripe, repaired, reason, n)
		ORDER BY d.n`,
		r.sum.RunID, r.s.livemode, now, subs, fields, locals, stripes, repaired, reasons).Error
	if err != nil {
		return fmt.Errorf("record %d drift rows: %w", n, err)
	}
	return nil
}

func modeName(livemode bool) string {
	if livemode {
		return "live"
	}
	return "test"
}
