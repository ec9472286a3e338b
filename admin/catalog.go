package admin

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"

	"billing/catalog"
	"billing/internal/database"
	"billing/internal/display"
)

type catalogPage struct {
	Products []catalogProduct
	// Orphans are prices whose product no event or read has brought yet.
	Orphans priceTable
	Empty   bool
}

type catalogProduct struct {
	catalog.ProductView
	// EventURL links the event that set the product; "" when a read from Stripe (reconcile) did.
	EventURL string
	Prices   priceTable
}

// priceTable is one table of prices; the template that draws it sees only this.
type priceTable struct {
	ID   string
	Rows []catalogPrice
	// WithProduct adds the product column: the orphans' table, where no heading names it.
	WithProduct bool
}

// catalogPrice is a price with what the page says of it worked out here, where Go can format it.
type catalogPrice struct {
	catalog.PriceView
	// Amount is the unit amount with its currency; "" for a tiered price (Tiers) or none known.
	Amount string
	Tiers  []string
	// Period is "one-time", "every month", "every 3 months".
	Period string
	// ProductInactive: the price cannot be sold because its product is archived or deleted
	// (PriceView.Active is false for it whatever the price's own state).
	ProductInactive bool
	DashboardURL    string
}

// getCatalog lists the products of the console's mode, each with its features and its prices,
// and apart the prices whose product is not known yet. Local state only: what the product and
// price events and billing reconcile last brought.
func (c *Console) getCatalog(ec echo.Context) error {
	if c.d.Catalog == nil {
		return c.unavailable(ec, "catalog", "The catalog")
	}
	ctx := ec.Request().Context()
	products, err := c.d.Catalog.Products(ctx, c.d.Livemode)
	if err != nil {
		return database.APIError(err, "list products")
	}
	prices, err := c.d.Catalog.AllPrices(ctx, c.d.Livemode)
	if err != nil {
		return database.APIError(err, "list prices")
	}
	v := &catalogPage{Empty: len(products) == 0 && len(prices) == 0,
		Orphans: priceTable{ID: "orphan-prices", WithProduct: true}}
	index := make(map[string]int, len(products))
	for i, p := range products {
		index[p.ProductID] = i
		row := catalogProduct{ProductView: p, Prices: priceTable{ID: "prices-" + p.ProductID}}
		if strings.HasPrefix(p.EventID, "evt_") {
			row.EventURL = eventURL(p.EventID)
		}
		v.Products = append(v.Products, row)
	}
	for _, p := range prices {
		row := priceRow(p)
		row.DashboardURL = dashboardURL("prices", p.PriceID, c.d.Livemode)
		i, ok := index[p.ProductID]
		if !ok {
			v.Orphans.Rows = append(v.Orphans.Rows, row)
			continue
		}
		row.ProductInactive = !products[i].Active || products[i].Deleted
		v.Products[i].Prices.Rows = append(v.Products[i].Prices.Rows, row)
	}
	return c.render(ec, http.StatusOK, "catalog", "catalog", "Catalog", v, "", "")
}

func priceRow(p catalog.PriceView) catalogPrice {
	row := catalogPrice{PriceView: p, Amount: display.Amount(p.UnitAmount, p.Currency), Period: "one-time"}
	if len(p.Tiers) > 0 {
		row.Amount = ""
		row.Tiers = tierLines(p.Tiers, p.Currency)
	}
	if r := p.Recurring; r != nil {
		row.Period = "every " + r.Interval
		if r.IntervalCount > 1 {
			row.Period = fmt.Sprintf("every %d %ss", r.IntervalCount, r.Interval)
		}
	}
	return row
}

// tierLines says each tier as Stripe's dashboard does: its bound, its unit and flat amounts.
func tierLines(tiers []catalog.Tier, currency string) []string {
	out := make([]string, 0, len(tiers))
	var below *int64
	for _, t := range tiers {
		var bound string
		switch {
		case t.UpTo != nil:
			bound = "up to " + strconv.FormatInt(*t.UpTo, 10)
		case below != nil:
			bound = "above " + strconv.FormatInt(*below, 10)
		default:
			bound = "any quantity"
		}
		// Stripe sends both amounts of every tier; a zero one beside a charged one is noise.
		unit := t.UnitAmount != nil && *t.UnitAmount != 0
		flat := t.FlatAmount != nil && *t.FlatAmount != 0
		var parts []string
		if unit || (t.UnitAmount != nil && !flat) {
			parts = append(parts, display.Amount(t.UnitAmount, currency)+" per unit")
		}
		if flat {
			parts = append(parts, display.Amount(t.FlatAmount, currency)+" flat")
		}
		if len(parts) == 0 {
			parts = append(parts, "no amount")
		}
		out = append(out, bound+": "+strings.Join(parts, " + "))
		below = t.UpTo
	}
	return out
}

// priceNames names prices for the pages that show a subscription's price. A name only helps:
// without a catalog, or when it cannot be read (logged), the pages show the ids as before.
func (c *Console) priceNames(ctx context.Context, livemode bool, ids []*string) map[string]string {
	if c.d.Catalog == nil {
		return nil
	}
	var want []string
	for _, id := range ids {
		if id != nil && *id != "" {
			want = append(want, *id)
		}
	}
	if len(want) == 0 {
		return nil
	}
	names, err := c.d.Catalog.PriceNames(ctx, livemode, want)
	if err != nil {
		c.log.ErrorContext(ctx, "admin page: load price names", "error", err)
		return nil
	}
	return names
}
