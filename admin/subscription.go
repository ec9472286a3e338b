package admin

import (
	"context"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"billing/billing"
	"billing/customers"
	"billing/entitlements"
	"billing/internal/database"
	"billing/ledger"
)

// How much of a subscription's history its page lists.
const (
	timelineEvents = 200
	subNotices     = 50
	subInvoices    = 50
	subCharges     = 50
	findResults    = 50
)

type subscriptionPage struct {
	S *entitlements.SubscriptionState
	// PriceName is the catalog's name of the subscription's price; "" when it is not known.
	PriceName string
	// SubSource and InvSource name what set a column group when no event of the log did: a read
	// from Stripe (reconcile, re-read) or an event no longer kept.
	SubSource, InvSource string
	Timeline             []billing.TimelineEntry
	TimelineCapped       bool
	// Sections that could not be read say so instead of failing the page.
	Notices         []billing.NoticeRow
	NoticesError    string
	Invoices        []billing.InvoiceRow
	InvoicesError   string
	Charges         []ledger.ChargeRow
	ChargesError    string
	ChargesNotKnown bool
}

func (c *Console) getSubscription(ec echo.Context) error {
	if c.d.Subscriptions == nil || c.d.Policy == nil {
		return c.unavailable(ec, "subscriptions", "The subscription page")
	}
	ctx := ec.Request().Context()
	id, ok := idParam(ec)
	if !ok {
		return c.message(ec, http.StatusNotFound, "subscriptions", "Not found", "That is not a subscription id.")
	}
	st, err := c.d.Policy.SubscriptionState(ctx, id)
	if err != nil {
		return database.APIError(err, "load subscription")
	}
	if st == nil {
		return c.message(ec, http.StatusNotFound, "subscriptions", "Not found",
			"No subscription "+id+" is known here. Its events, if any arrived, are in the event log.")
	}
	v := &subscriptionPage{S: st}
	if st.PriceID != nil {
		v.PriceName = c.priceNames(ctx, st.Livemode, []*string{st.PriceID})[*st.PriceID]
	}
	if c.d.Events != nil {
		events, err := c.d.Events.EventsNaming(ctx, id, timelineEvents)
		if err != nil {
			return database.APIError(err, "load subscription events")
		}
		v.Timeline = billing.ExplainTimeline(&st.SubscriptionState, events)
		v.TimelineCapped = len(events) == timelineEvents
		v.SubSource = billing.StateSource(st.SubEventID, events)
		v.InvSource = billing.StateSource(st.InvEventID, events)
	}
	v.Notices, v.NoticesError = section(ctx, c, "notices", func(ctx context.Context) ([]billing.NoticeRow, error) {
		return c.d.Subscriptions.SubscriptionNotices(ctx, id, st.Livemode, subNotices)
	})
	v.Invoices, v.InvoicesError = section(ctx, c, "invoices", func(ctx context.Context) ([]billing.InvoiceRow, error) {
		return c.d.Subscriptions.SubscriptionInvoices(ctx, id, st.Livemode, subInvoices)
	})
	if c.d.Charges == nil {
		v.ChargesNotKnown = true
	} else {
		v.Charges, v.ChargesError = section(ctx, c, "charges", func(ctx context.Context) ([]ledger.ChargeRow, error) {
			return c.d.Charges.CustomerCharges(ctx, st.StripeCustomerID, st.Livemode, subCharges)
		})
	}
	return c.render(ec, http.StatusOK, "subscription", "subscriptions", "Subscription "+id, v, "", "")
}

// section reads one secondary part of a page; its failure is logged and said on the page.
func section[T any](ctx context.Context, c *Console, what string, read func(context.Context) ([]T, error)) ([]T, string) {
	rows, err := read(ctx)
	if err != nil {
		c.log.ErrorContext(ctx, "admin page: load "+what, "error", err)
		return nil, "Could not load the " + what + "; see the service log."
	}
	return rows, ""
}

type findPage struct {
	Q string
	// People are users whose id, Stripe customer id, email or name (a prefix) the text names.
	People []customers.Person
	// Charges are charges whose order id, PaymentIntent or refund the text names.
	Charges       []ledger.ChargeRow
	Subscriptions []billing.SubscriptionRef
	// More says a list was cut at findResults.
	More bool
}

// getFind leads from what an operator has in hand to its page: an event id to the event; a
// user id, a Stripe customer id, or an email or name (a case-insensitive prefix) to the user's
// customer page; an order id, PaymentIntent or refund id to the charge; a subscription id to
// the subscription. Several matches make a list; the deployment's mode comes first.
func (c *Console) getFind(ec echo.Context) error {
	ctx := ec.Request().Context()
	q := strings.TrimSpace(ec.QueryParam("q"))
	v := &findPage{Q: q}
	if q == "" {
		return c.render(ec, http.StatusOK, "find", "", "Find", v, "", "")
	}
	if c.d.Events != nil {
		ev, err := c.d.Events.EventDetail(ctx, q)
		if err != nil {
			return database.APIError(err, "find")
		}
		if ev != nil {
			return ec.Redirect(http.StatusSeeOther, eventURL(ev.EventID))
		}
	}
	users := map[string]bool{}
	for _, live := range []bool{c.d.Livemode, !c.d.Livemode} {
		if c.d.People != nil {
			people, err := c.d.People.Find(ctx, q, live, findResults+1)
			if err != nil {
				return database.APIError(err, "find")
			}
			if len(people) > findResults {
				people, v.More = people[:findResults], true
			}
			for _, p := range people {
				users[p.UserID] = true
			}
			v.People = append(v.People, people...)
		}
		if c.d.Charges != nil {
			charges, err := c.d.Charges.FindCharges(ctx, q, live, findResults+1)
			if err != nil {
				return database.APIError(err, "find")
			}
			if len(charges) > findResults {
				charges, v.More = charges[:findResults], true
			}
			v.Charges = append(v.Charges, charges...)
		}
	}
	if c.d.Subscriptions != nil {
		refs, err := c.d.Subscriptions.FindSubscriptions(ctx, q, findResults)
		if err != nil {
			return database.APIError(err, "find")
		}
		for _, r := range refs {
			if r.SubscriptionID == q {
				return ec.Redirect(http.StatusSeeOther, subURL(r.SubscriptionID))
			}
		}
		v.Subscriptions = refs
	}
	switch {
	case len(users) == 1 && len(v.Charges) == 0:
		return ec.Redirect(http.StatusSeeOther, customerURL(v.People[0].UserID))
	case len(users) == 0 && len(v.Charges) == 1:
		return ec.Redirect(http.StatusSeeOther, chargeURL(v.Charges[0].OrderID, v.Charges[0].Livemode))
	case len(users) == 0 && len(v.Charges) == 0 && len(v.Subscriptions) == 1:
		return ec.Redirect(http.StatusSeeOther, subURL(v.Subscriptions[0].SubscriptionID))
	}
	return c.render(ec, http.StatusOK, "find", "", "Find "+q, v, "", "")
}
