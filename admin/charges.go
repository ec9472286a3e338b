package admin

import (
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"billing/internal/database"
	"billing/ledger"
)

// chargesPerPage is the charges page's page size.
const chargesPerPage = 50

// chargeStatuses are the statuses the filter offers: Stripe's PaymentIntent statuses, the
// ledger's own answers for a refused call, and the rows still waiting for Stripe.
var chargeStatuses = []string{"succeeded", "processing", "requires_action", "requires_payment_method", "requires_capture",
	"canceled", "declined", "failed", "error", ledger.StatusPending}

type chargesPage struct {
	Status, Mode, From, To, Q     string
	Statuses                      []string
	Rows                          []ledger.ChargeRow
	NewestURL, NewerURL, OlderURL string
}

// getCharges lists the charges of one mode (the deployment's unless asked), filtered and
// searched, keyset-paged like the event log.
func (c *Console) getCharges(ec echo.Context) error {
	if c.d.Charges == nil {
		return c.unavailable(ec, "charges", "The charges page")
	}
	p := ec.QueryParams()
	v := &chargesPage{Status: p.Get("status"), Mode: p.Get("mode"), From: p.Get("from"), To: p.Get("to"),
		Q: strings.TrimSpace(p.Get("q")), Statuses: chargeStatuses}
	live := c.d.Livemode
	if m := modeParam(v.Mode); m != nil {
		live = *m
	}
	v.Mode = modeName(live)
	q := ledger.ChargeQuery{Livemode: live, Search: v.Q, Limit: chargesPerPage}
	var problems []string
	if v.Status != "" {
		known := false
		for _, s := range chargeStatuses {
			known = known || s == v.Status
		}
		if !known {
			problems = append(problems, "Unknown status "+v.Status+": not filtered by status.")
			v.Status = ""
		}
		q.Status = v.Status
	}
	if d, ok := parseDay(v.From); ok {
		q.CreatedFrom = d
	} else if v.From != "" {
		problems = append(problems, "From is not a date (YYYY-MM-DD): not filtered by it.")
	}
	if d, ok := parseDay(v.To); ok {
		q.CreatedTo = d.Add(24 * time.Hour)
	} else if v.To != "" {
		problems = append(problems, "To is not a date (YYYY-MM-DD): not filtered by it.")
	}
	for key, dst := range map[string]**ledger.ChargeCursor{"before": &q.Before, "after": &q.After} {
		if s := p.Get(key); s != "" && q.Before == nil && q.After == nil {
			cur, err := ledger.ParseChargeCursor(s)
			if err != nil {
				problems = append(problems, "The page link is damaged: showing the newest charges.")
				continue
			}
			*dst = &cur
		}
	}
	page, err := c.d.Charges.SearchCharges(ec.Request().Context(), q)
	if err != nil {
		return database.APIError(err, "search charges")
	}
	v.Rows = page.Charges
	filters := url.Values{"status": {v.Status}, "mode": {v.Mode}, "from": {v.From}, "to": {v.To}, "q": {v.Q}}
	var first, last string
	if n := len(v.Rows); n > 0 {
		first = ledger.ChargeCursor{CreatedAt: v.Rows[0].CreatedAt, OrderID: v.Rows[0].OrderID}.String()
		last = ledger.ChargeCursor{CreatedAt: v.Rows[n-1].CreatedAt, OrderID: v.Rows[n-1].OrderID}.String()
	}
	v.NewestURL, v.NewerURL, v.OlderURL = keysetLinks(pathCharges, filters, first, last, page.HasNewer, page.HasOlder,
		q.Before != nil || q.After != nil)
	return c.render(ec, http.StatusOK, "charges", "charges", "Charges", v, "", strings.Join(problems, " "))
}

type chargePage struct {
	C       *ledger.ChargeRow
	Refunds []ledger.RefundRow
}

// getCharge is one charge of the deployment's mode (or ?mode=), with its refunds.
func (c *Console) getCharge(ec echo.Context) error {
	if c.d.Charges == nil {
		return c.unavailable(ec, "charges", "The charges page")
	}
	ctx := ec.Request().Context()
	id, ok := idParam(ec)
	if !ok {
		return c.message(ec, http.StatusNotFound, "charges", "Not found", "That is not an order id.")
	}
	live := c.d.Livemode
	if m := modeParam(ec.QueryParam("mode")); m != nil {
		live = *m
	}
	ch, err := c.d.Charges.Charge(ctx, id, live)
	if err != nil {
		return database.APIError(err, "load charge")
	}
	if ch == nil {
		return c.message(ec, http.StatusNotFound, "charges", "Not found",
			"No "+modeName(live)+"-mode charge has the order id "+id+".")
	}
	refunds, err := c.d.Charges.ChargeRefunds(ctx, id, live)
	if err != nil {
		return database.APIError(err, "load refunds")
	}
	return c.render(ec, http.StatusOK, "charge", "charges", "Charge "+id, &chargePage{C: ch, Refunds: refunds}, "", "")
}

func chargeURL(orderID string, live bool) string {
	return pathCharges + "/" + url.PathEscape(orderID) + "?mode=" + modeName(live)
}
