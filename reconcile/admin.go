package reconcile

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"

	"billing/internal/apierr"
	"billing/internal/audit"
	"billing/internal/auth"
	"billing/internal/database"
	"billing/internal/ids"
)

// MountAdmin adds the reconcile routes to the /admin group (admin authentication applied by the
// caller):
//
//	GET  /admin/reconcile/runs?limit=          {"runs": [...]}, newest first
//	GET  /admin/reconcile/drift?run_id=&limit= {"drift": [...], "has_more"}; the latest run of the mode without run_id
//	POST /admin/reconcile?dry_run=             202 {"run_id"}; 409 reconcile_running while a run of the mode is going
func (s *Service) MountAdmin(admin *echo.Group) {
	admin.GET("/reconcile/runs", s.listRuns)
	admin.GET("/reconcile/drift", s.listDrift)
	admin.POST("/reconcile", s.startRun)
}

func (s *Service) listRuns(c echo.Context) error {
	limit, err := limitParam(c, 50, 500)
	if err != nil {
		return err
	}
	runs, err := s.Runs(c.Request().Context(), limit)
	if err != nil {
		return database.APIError(err, "list reconcile runs")
	}
	return c.JSON(http.StatusOK, map[string]any{"runs": runs})
}

func (s *Service) listDrift(c echo.Context) error {
	limit, err := limitParam(c, 1000, 10000)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	runID := c.QueryParam("run_id")
	if runID == "" {
		if runID, err = s.latestRunID(ctx); err != nil {
			return database.APIError(err, "find the latest reconcile run")
		}
		if runID == "" {
			return apierr.New(apierr.CodeNotFound, "no reconcile run yet")
		}
	} else if err := ids.Check(runID, "run_id", apierr.CodeInvalidRequest); err != nil {
		return err
	}
	run, err := s.RunByID(ctx, runID)
	if err != nil {
		return database.APIError(err, "load reconcile run")
	}
	if run == nil {
		return apierr.New(apierr.CodeNotFound, "no reconcile run %q", runID)
	}
	drift, more, err := s.Drift(ctx, runID, limit)
	if err != nil {
		return database.APIError(err, "list drift")
	}
	return c.JSON(http.StatusOK, map[string]any{"run_id": runID, "drift": drift, "has_more": more})
}

func (s *Service) startRun(c echo.Context) error {
	dry := false
	if v := c.QueryParam("dry_run"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return apierr.New(apierr.CodeInvalidRequest, "dry_run must be true or false")
		}
		dry = b
	}
	runID, err := s.Start(RunOptions{DryRun: dry, Trigger: TriggerAdmin, Actor: adminActor(c)})
	switch {
	case errors.Is(err, ErrRunning):
		return apierr.New(apierr.CodeReconcileRunning, "a reconcile run of %s mode is going; try again when it has finished", modeName(s.livemode))
	case err != nil:
		return database.APIError(err, "start a reconcile run")
	}
	return c.JSON(http.StatusAccepted, map[string]string{"run_id": runID})
}

func limitParam(c echo.Context, def, maxLimit int) (int, error) {
	s := c.QueryParam("limit")
	if s == "" {
		return def, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > maxLimit {
		return 0, apierr.New(apierr.CodeInvalidRequest, "limit must be an integer from 1 to %d", maxLimit)
	}
	return n, nil
}

// adminActor is who made the request, for the audit log: never empty, since an admin route always
// has one (auth.Require).
func adminActor(c echo.Context) string {
	if a := auth.Actor(c.Request().Context()); a != "" {
		return a
	}
	return audit.SystemActor
}
