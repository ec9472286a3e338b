package admin

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"

	"billing/billing"
	"billing/internal/database"
)

// holdsPerPage is the holds page's page size.
const holdsPerPage = 50

func (c *Console) getHolds(ec echo.Context) error {
	holds, err := c.d.Holds.Holds(ec.Request().Context())
	if err != nil {
		return database.APIError(err, "list holds")
	}
	return ec.JSON(http.StatusOK, map[string]any{"holds": holds})
}

type holdsPage struct {
	Reason, Status, Mode, Q string
	Reasons, Statuses       []string
	Total, Matching         int
	Rows                    []holdRow
	Page, Pages             int
	PrevURL, NextURL        string
}

// getHoldsPage filters the holds in memory: Holds reads only the few rows on hold (a partial
// index), all of which the policy must see anyway to decide each one's reason.
func (c *Console) getHoldsPage(ec echo.Context) error {
	holds, err := c.d.Holds.Holds(ec.Request().Context())
	if err != nil {
		return database.APIError(err, "list holds")
	}
	q := ec.QueryParams()
	v := &holdsPage{
		Reason: q.Get("reason"), Status: q.Get("status"), Mode: q.Get("mode"), Q: strings.TrimSpace(q.Get("q")),
		Reasons: []string{billing.HoldPaymentFailed, billing.HoldPastDue, billing.HoldUnpaid},
		Total:   len(holds),
	}
	statuses := map[string]bool{}
	mode := modeParam(v.Mode)
	var matching []billing.HoldView
	for _, h := range holds {
		statuses[h.Status] = true
		switch {
		case v.Reason != "" && h.HoldReason != v.Reason,
			v.Status != "" && h.Status != v.Status,
			mode != nil && h.Livemode != *mode,
			v.Q != "" && !strings.Contains(h.SubscriptionID, v.Q) && !strings.Contains(h.StripeCustomerID, v.Q) &&
				!strings.Contains(deref(h.UserID), v.Q):
			continue
		}
		matching = append(matching, h)
	}
	v.Statuses = sortedKeys(statuses)
	v.Matching = len(matching)
	v.Pages = max(1, (len(matching)+holdsPerPage-1)/holdsPerPage)
	v.Page = 1
	if p, err := strconv.Atoi(q.Get("page")); err == nil && p >= 1 && p <= v.Pages {
		v.Page = p
	}
	for _, h := range matching[min((v.Page-1)*holdsPerPage, len(matching)):min(v.Page*holdsPerPage, len(matching))] {
		v.Rows = append(v.Rows, holdRowOf(h))
	}
	link := func(page int) string {
		return withQuery(pathHolds, url.Values{"reason": {v.Reason}, "status": {v.Status}, "mode": {v.Mode}, "q": {v.Q},
			"page": {strconv.Itoa(page)}})
	}
	if v.Page > 1 {
		v.PrevURL = link(v.Page - 1)
	}
	if v.Page < v.Pages {
		v.NextURL = link(v.Page + 1)
	}
	return c.render(ec, http.StatusOK, "holds", "holds", "Holds", v, "", "")
}
