package admin

import (
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"

	"billing/internal/auth"
	"billing/internal/database"
	"billing/reconcile"
)

// Page sizes of the reconciliation pages.
const (
	runsPerPage  = 50
	driftPerPage = 100
)

type runsPage struct {
	Runs                []reconcile.RunView
	NewestURL, OlderURL string
}

// getRuns lists the reconcile runs of the deployment's mode, newest first, with the button that
// starts one.
func (c *Console) getRuns(ec echo.Context) error {
	if c.d.Runs == nil {
		return c.unavailable(ec, "reconcile", "Reconciliation")
	}
	flash := ""
	if id := ec.QueryParam("started"); id != "" {
		flash = "Run " + id + " started: it lists every subscription at Stripe; reload to follow it."
	}
	return c.renderRuns(ec, http.StatusOK, flash, "")
}

func (c *Console) renderRuns(ec echo.Context, status int, flash, problem string) error {
	before := strings.TrimSpace(ec.QueryParam("before"))
	runs, more, err := c.d.Runs.RunPage(ec.Request().Context(), before, runsPerPage)
	if err != nil {
		return database.APIError(err, "list reconcile runs")
	}
	v := &runsPage{Runs: runs}
	if before != "" {
		v.NewestURL = pathReconcile
	}
	if more && len(runs) > 0 {
		v.OlderURL = pathReconcile + "?before=" + url.QueryEscape(runs[len(runs)-1].RunID)
	}
	return c.render(ec, status, "runs", "reconcile", "Reconciliation", v, flash, problem)
}

type runPage struct {
	Run    *reconcile.RunView
	Fields []reconcile.FieldCount
	Field  string
	Drift  []reconcile.DriftView
	// FirstURL leads back to the first drift rows, NextURL on.
	FirstURL, NextURL string
}

// getRun is one run with its drift by field and its drift rows, paged in the order found.
func (c *Console) getRun(ec echo.Context) error {
	if c.d.Runs == nil {
		return c.unavailable(ec, "reconcile", "Reconciliation")
	}
	ctx := ec.Request().Context()
	id, ok := idParam(ec)
	if !ok {
		return c.message(ec, http.StatusNotFound, "reconcile", "Not found", "That is not a run id.")
	}
	run, err := c.d.Runs.RunByID(ctx, id)
	if err != nil {
		return database.APIError(err, "load reconcile run")
	}
	if run == nil || run.Livemode != c.d.Livemode {
		return c.message(ec, http.StatusNotFound, "reconcile", "Not found", "No reconcile run "+id+" of this mode is recorded.")
	}
	v := &runPage{Run: run, Field: strings.TrimSpace(ec.QueryParam("field"))}
	if v.Fields, err = c.d.Runs.DriftFields(ctx, id); err != nil {
		return database.APIError(err, "count drift")
	}
	after, _ := strconv.ParseInt(ec.QueryParam("after"), 10, 64)
	drift, more, err := c.d.Runs.DriftPage(ctx, id, v.Field, after, driftPerPage)
	if err != nil {
		return database.APIError(err, "list drift")
	}
	v.Drift = drift
	self := pathReconcile + "/" + url.PathEscape(id)
	if after > 0 {
		v.FirstURL = withQuery(self, url.Values{"field": {v.Field}})
	}
	if more && len(drift) > 0 {
		v.NextURL = withQuery(self, url.Values{"field": {v.Field}, "after": {strconv.FormatInt(drift[len(drift)-1].ID, 10)}})
	}
	return c.render(ec, http.StatusOK, "run", "reconcile", "Reconcile run "+id, v, "", "")
}

// postReconcile starts a run of the deployment's mode; the audit log records who did.
func (c *Console) postReconcile(ec echo.Context) error {
	if c.d.Runs == nil {
		return c.unavailable(ec, "reconcile", "Reconciliation")
	}
	dry := ec.FormValue("dry_run") == "1"
	runID, err := c.d.Runs.Start(reconcile.RunOptions{DryRun: dry, Trigger: reconcile.TriggerAdmin,
		Actor: auth.Actor(ec.Request().Context())})
	switch {
	case errors.Is(err, reconcile.ErrRunning):
		return c.renderRuns(ec, http.StatusConflict, "",
			"A run is going: one run of a mode at a time. Wait for it to finish (reload this page), then start another.")
	case err != nil:
		return database.APIError(err, "start a reconcile run")
	}
	return ec.Redirect(http.StatusSeeOther, pathReconcile+"?started="+url.QueryEscape(runID))
}

func runURL(id string) string { return pathReconcile + "/" + url.PathEscape(id) }
