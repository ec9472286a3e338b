package reconcile

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/form"
)

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
