package admin

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"billing/appevents"
	"billing/billing"
	"billing/customers"
	"billing/entitlements"
	"billing/internal/database"
	"billing/ledger"
	"billing/usage"
)

// How much of each list the customer page shows at once; each pages on by its own link.
const (
	customerInvoices = 20
	customerCharges  = 20
	customerNotices  = 20
	customerEvents   = 20
)

type customerPage struct {
	UserID string
	// Worlds are the user's links, the deployment's mode first: each mode is a world of its own
	// (its customer, subscriptions and money), shown apart.
	Worlds []*world
}

// world is a user's link in one mode and everything hanging from it.
type world struct {
	Livemode bool
	// Current says this is the deployment's mode (stripe.mode).
	Current  bool
	Person   *customers.Person
	Account  *entitlements.Account
	Problems []string
	// PriceNames are the catalog's names of the subscriptions' prices (by id; unknown ones absent).
	PriceNames map[string]string

	Invoices []billing.InvoiceRow
	Charges  []chargeWithRefunds
	Notices  []billing.NoticeRow
	// AppEvents are the newest events the app was told about the user (the deployment's mode
	// only: the other mode has no app).
	AppEvents []appevents.AdminEvent
	// Usage is per meter over UsagePeriod, the entitled subscription's current period (nil: no
	// such period, the sums are of every record).
	Usage                                  []usage.MeterTotal
	UsagePeriod                            *usage.Period
	InvoicesMore, ChargesMore, NoticesMore string
	// Paged says a section starts below its newest rows: the link back to the newest.
	FirstURL string
}

type chargeWithRefunds struct {
	ledger.ChargeRow
	Refunds []ledger.RefundRow
}

// getCustomer is one user across both modes. A user linked in no mode is not found; a linked
// user without any subscription is a page that says so.
func (c *Console) getCustomer(ec echo.Context) error {
	if c.d.People == nil {
		return c.unavailable(ec, "customers", "The customer page")
	}
	ctx := ec.Request().Context()
	userID, ok := idParam(ec)
	if !ok {
		return c.message(ec, http.StatusNotFound, "customers", "Not found", "That is not a user id.")
	}
	v := &customerPage{UserID: userID}
	q := ec.QueryParams()
	for _, live := range []bool{c.d.Livemode, !c.d.Livemode} {
		p, err := c.d.People.Person(ctx, userID, live)
		if err != nil {
			return database.APIError(err, "load customer")
		}
		if p == nil {
			continue
		}
		w := &world{Livemode: live, Current: live == c.d.Livemode, Person: p}
		c.fillWorld(ctx, w, q)
		v.Worlds = append(v.Worlds, w)
	}
	if len(v.Worlds) == 0 {
		return c.message(ec, http.StatusNotFound, "customers", "Not found",
			"No user "+userID+" is linked to a Stripe customer in either mode. The find box also takes an email or a name.")
	}
	return c.render(ec, http.StatusOK, "customer", "customers", "Customer "+userID, v, "", "")
}

// fillWorld reads one mode's sections; a section that cannot be read says so on the page.
func (c *Console) fillWorld(ctx context.Context, w *world, q url.Values) {
	mode := modeName(w.Livemode)
	fail := func(what string, err error) {
		c.log.ErrorContext(ctx, "customer page: load "+what, "error", err, "mode", mode)
		w.Problems = append(w.Problems, "Could not load the "+what+"; see the service log.")
	}
	self := pathCustomers + "/" + url.PathEscape(w.Person.UserID)
	link := func(key, cursor string) string {
		return self + "?" + url.Values{mode + "_" + key: {cursor}}.Encode() + "#" + mode
	}
	for _, key := range []string{"invoices", "charges", "notices"} {
		if q.Get(mode+"_"+key) != "" {
			w.FirstURL = self + "#" + mode
		}
	}
	cus := deref(w.Person.StripeCustomerID)
	if cus == "" {
		// A link still being made has no Stripe customer yet: nothing hangs from it.
		return
	}
	if c.d.Accounts != nil && c.d.Policy != nil {
		var err error
		if w.Account, err = c.d.Policy.CustomerAccount(ctx, w.Person.UserID, cus, w.Livemode); err != nil {
			fail("subscriptions", err)
		}
		if w.Account != nil {
			prices := make([]*string, len(w.Account.Subscriptions))
			for i, s := range w.Account.Subscriptions {
				prices[i] = s.PriceID
			}
			w.PriceNames = c.priceNames(ctx, w.Livemode, prices)
		}
		invBefore := pageCursor(q.Get(mode + "_invoices"))
		inv, err := c.d.Accounts.CustomerInvoices(ctx, cus, w.Livemode, invBefore, customerInvoices+1)
		if err != nil {
			fail("invoices", err)
		}
		if len(inv) > customerInvoices {
			inv = inv[:customerInvoices]
			last := inv[len(inv)-1]
			w.InvoicesMore = link("invoices", cursorString(last.Created, last.InvoiceID))
		}
		w.Invoices = inv
		notBefore := pageCursor(q.Get(mode + "_notices"))
		notices, err := c.d.Accounts.CustomerNotices(ctx, cus, w.Livemode, notBefore, customerNotices+1)
		if err != nil {
			fail("notices", err)
		}
		if len(notices) > customerNotices {
			notices = notices[:customerNotices]
			last := notices[len(notices)-1]
			w.NoticesMore = link("notices", cursorString(&last.CreatedAt, strconv.FormatInt(last.ID, 10)))
		}
		w.Notices = notices
	}
	if c.d.AppEvents != nil && w.Current {
		var err error
		if w.AppEvents, err = c.d.AppEvents.List(ctx, appevents.AdminQuery{UserID: w.Person.UserID, Limit: customerEvents}); err != nil {
			fail("app events", err)
		}
	}
	if c.d.Usage != nil {
		w.UsagePeriod = entitledPeriod(w.Account)
		var err error
		if w.Usage, err = c.d.Usage.MeterTotals(ctx, w.Person.UserID, w.Livemode, w.UsagePeriod); err != nil {
			fail("usage", err)
		}
	}
	if c.d.Charges != nil {
		var before *ledger.ChargeCursor
		if cur, err := ledger.ParseChargeCursor(q.Get(mode + "_charges")); err == nil {
			before = &cur
		}
		rows, err := c.d.Charges.UserCharges(ctx, w.Person.UserID, w.Livemode, before, customerCharges+1)
		if err != nil {
			fail("charges", err)
		}
		if len(rows) > customerCharges {
			rows = rows[:customerCharges]
			last := rows[len(rows)-1]
			w.ChargesMore = link("charges", ledger.ChargeCursor{CreatedAt: last.CreatedAt, OrderID: last.OrderID}.String())
		}
		ids := make([]string, len(rows))
		for i, r := range rows {
			ids[i] = r.OrderID
		}
		refunds, err := c.d.Charges.RefundsOf(ctx, ids, w.Livemode)
		if err != nil {
			fail("refunds", err)
		}
		byOrder := map[string][]ledger.RefundRow{}
		for _, r := range refunds {
			byOrder[r.OrderID] = append(byOrder[r.OrderID], r)
		}
		for _, r := range rows {
			w.Charges = append(w.Charges, chargeWithRefunds{ChargeRow: r, Refunds: byOrder[r.OrderID]})
		}
	}
}

// entitledPeriod is the current period of the subscription the entitlement reports, the span
// GET /v1/customers/{user_id}/usage sums; nil when there is none.
func entitledPeriod(a *entitlements.Account) *usage.Period {
	if a == nil || a.Entitlement.SubscriptionID == nil {
		return nil
	}
	for _, s := range a.Subscriptions {
		if s.SubscriptionID == *a.Entitlement.SubscriptionID && s.CurrentPeriodStart != nil && s.CurrentPeriodEnd != nil {
			return &usage.Period{Start: s.CurrentPeriodStart.UTC(), End: s.CurrentPeriodEnd.UTC()}
		}
	}
	return nil
}

func modeName(live bool) string {
	if live {
		return "live"
	}
	return "test"
}

// cursorString and pageCursor write and read a (time, id) position of a newest-first list.
func cursorString(at *time.Time, id string) string {
	if at == nil {
		return ""
	}
	return at.UTC().Format(time.RFC3339Nano) + "|" + id
}

func pageCursor(s string) *billing.PageCursor {
	ts, id, ok := strings.Cut(s, "|")
	if !ok {
		return nil
	}
	t, err := time.Parse(time.RFC3339Nano, ts)
	if err != nil {
		return nil
	}
	return &billing.PageCursor{At: t, ID: id}
}

func customerURL(userID string) string { return pathCustomers + "/" + url.PathEscape(userID) }
