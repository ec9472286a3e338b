package reconcile

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v79"

	"billing/billing"
	"billing/entitlements"
)

// Features: a customer's active entitlements are read once per page of subscriptions for each
// customer with a subscription that Stripe does not show as ended (an ended customer's features
// are granted to no one, whatever they are), compared with the stored lists (one statement for
// the page, after the reads, so that an event that lands meanwhile is seen as newer than the
// read), and repaired by applying the read through the code that applies the job's reads
// (entitlements.Service.ApplyFeatureRead). Stripe lists them per customer only: one read (of every page) per
// such customer and run.

// featureDrift is a customer's list that differs.
type featureDrift struct {
	diff diff
	read entitlements.FeatureRead
}

// featureRead is what Stripe says of one customer's active entitlements.
type featureRead struct {
	customer  string
	keys      []string
	fetchedAt time.Time
}

// pageFeatures reads the active entitlements of the page's customers and compares them with the
// stored lists: the drifts by customer id.
func (r *run) pageFeatures(ctx context.Context, subs []remote) (map[string]*featureDrift, error) {
	seen := map[string]bool{}
	var reads []featureRead
	for _, rem := range subs {
		sub := rem.sub
		if sub.Customer == nil || sub.Customer.ID == "" || sub.Customer.Deleted || billing.IsTerminal(string(sub.Status)) || seen[sub.Customer.ID] {
			continue
		}
		id := sub.Customer.ID
		seen[id] = true
		keys, fetchedAt, err := r.activeEntitlements(ctx, id)
		if err != nil {
			if gone(err) {
				continue // the customer is gone at Stripe: the subscription's own drift says so
			}
			return nil, err
		}
		reads = append(reads, featureRead{customer: id, keys: sortedUnique(keys), fetchedAt: fetchedAt})
	}
	ids := make([]string, len(reads))
	for i, rd := range reads {
		ids[i] = rd.customer
	}
	locals, err := r.s.features.CustomerFeaturesOf(ctx, ids, r.s.livemode)
	if err != nil {
		return nil, err
	}
	drifts := map[string]*featureDrift{}
	for _, rd := range reads {
		if d := r.featuresDiff(rd, locals[rd.customer]); d != nil {
			drifts[rd.customer] = d
		}
	}
	return drifts, nil
}

// featuresDiff compares a customer's read with its stored list; nil when they agree or when the
// list has news from the read's second or later.
func (r *run) featuresDiff(rd featureRead, local entitlements.CustomerFeatures) *featureDrift {
	if slices.Equal(rd.keys, local.LookupKeys) || (!local.Found && len(rd.keys) == 0) {
		return nil
	}
	if sec := rd.fetchedAt.UTC().Truncate(time.Second); local.Found &&
		(local.EventCreated.After(sec) || (local.EventCreated.Equal(sec) && !local.FromRead())) {
		// An event from the read's second or later: the read cannot say the list is wrong. (An
		// earlier read of the same second is no fresher than this one.)
		return nil
	}
	return &featureDrift{
		diff: diff{Field: FieldFeatures, Local: strings.Join(local.LookupKeys, ","), Stripe: strings.Join(rd.keys, ",")},
		read: entitlements.FeatureRead{StripeCustomerID: rd.customer, Livemode: r.s.livemode, LookupKeys: rd.keys, FetchedAt: rd.fetchedAt,
			Source: "reconcile:" + r.sum.RunID},
	}
}

// activeEntitlements reads every page of a customer's active entitlements, each page a call of
// its own under the run's limits. The fetch time is the first page's.
func (r *run) activeEntitlements(ctx context.Context, customerID string) ([]string, time.Time, error) {
	var keys []string
	var first time.Time
	after := ""
	for n := 1; ; n++ {
		var more bool
		var last string
		fetchedAt, err := r.s.call(ctx, fmt.Sprintf("list the active entitlements of %s (page %d)", customerID, n), func(ctx context.Context) error {
			params := &stripe.EntitlementsActiveEntitlementListParams{Customer: stripe.String(customerID)}
			params.Context = ctx
			params.Limit = stripe.Int64(pageSize)
			params.Single = true
			if after != "" {
				params.StartingAfter = stripe.String(after)
			}
			it := r.s.stripe.EntitlementsActiveEntitlements.List(params)
			var page []string
			last = ""
			for it.Next() {
				e := it.EntitlementsActiveEntitlement()
				page, last = append(page, e.LookupKey), e.ID
			}
			if err := it.Err(); err != nil {
				return err
			}
			list := it.EntitlementsActiveEntitlementList()
			if list == nil {
				return errors.New("no list in the answer")
			}
			keys, more = append(keys, page...), list.HasMore && last != ""
			return nil
		})
		if err != nil {
			return nil, time.Time{}, err
		}
		if n == 1 {
			first = fetchedAt
		}
		if !more {
			return keys, first, nil
		}
		after = last
	}
}

func sortedUnique(keys []string) []string {
	keys = slices.Clone(keys)
	slices.Sort(keys)
	return slices.Compact(keys)
}
