package admin

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"

	"billing/internal/apierr"
	"billing/internal/audit"
	"billing/internal/database"
)

// auditPerPage is the audit page's page size; the JSON takes limit= up to auditMaxLimit.
const (
	auditPerPage  = 50
	auditMaxLimit = 1000
)

// auditQuery reads the filters both the page and the JSON take: actor, action, mode, before.
func auditQuery(ec echo.Context, limit int) (audit.Query, error) {
	p := ec.QueryParams()
	q := audit.Query{Actor: strings.TrimSpace(p.Get("actor")), Action: strings.TrimSpace(p.Get("action")),
		Livemode: modeParam(p.Get("mode")), Limit: limit}
	if s := p.Get("before"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 1 {
			return q, apierr.New(apierr.CodeInvalidRequest, "before must be the next_before of a previous page")
		}
		q.Before = n
	}
	return q, nil
}

// getAudit is GET /admin/audit?actor=&action=&mode=&limit=&before=: {"entries", "next_before"},
// newest first; next_before ("" on the last page) is the before= of the next page.
func (c *Console) getAudit(ec echo.Context) error {
	if c.d.Audit == nil {
		return apierr.New(apierr.CodeNotFound, "the audit log is not available in this deployment")
	}
	limit := 100
	if s := ec.QueryParam("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > auditMaxLimit {
			return apierr.New(apierr.CodeInvalidRequest, "limit must be an integer from 1 to %d", auditMaxLimit)
		}
		limit = n
	}
	q, err := auditQuery(ec, limit)
	if err != nil {
		return err
	}
	page, err := c.d.Audit.List(ec.Request().Context(), q)
	if err != nil {
		return database.APIError(err, "read the audit log")
	}
	return ec.JSON(http.StatusOK, page)
}

type auditPage struct {
	Actor, Action, Mode string
	Actions             []string
	Entries             []audit.Entry
	NewestURL, OlderURL string
}

func (c *Console) getAuditPage(ec echo.Context) error {
	if c.d.Audit == nil {
		return c.unavailable(ec, "audit", "The audit log")
	}
	q, err := auditQuery(ec, auditPerPage)
	problem := ""
	if err != nil {
		problem = "The page link is damaged: showing the newest entries."
		q.Before = 0
	}
	page, err := c.d.Audit.List(ec.Request().Context(), q)
	if err != nil {
		return database.APIError(err, "read the audit log")
	}
	v := &auditPage{Actor: q.Actor, Action: q.Action, Mode: ec.QueryParam("mode"), Entries: page.Entries,
		Actions: []string{audit.ActionReplay, audit.ActionReplayType, audit.ActionReconcileStart, audit.ActionUsageReview}}
	filters := url.Values{"actor": {v.Actor}, "action": {v.Action}, "mode": {v.Mode}}
	if q.Before > 0 {
		v.NewestURL = withQuery(pathAudit, filters)
	}
	if page.Next != "" {
		filters.Set("before", page.Next)
		v.OlderURL = withQuery(pathAudit, filters)
	}
	return c.render(ec, http.StatusOK, "audit", "audit", "Audit log", v, "", problem)
}

// targetURL leads from an audit entry's target to its page: an event, a reconcile run.
func targetURL(e audit.Entry) string {
	switch {
	case strings.HasPrefix(e.Target, "evt_"):
		return eventURL(e.Target)
	case strings.HasPrefix(e.Target, "rr_"):
		return runURL(e.Target)
	}
	return ""
}
