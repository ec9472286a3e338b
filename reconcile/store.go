package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// RunView is one run in GET /admin/reconcile/runs.
type RunView struct {
	RunID           string     `json:"run_id" gorm:"column:run_id"`
	Livemode        bool       `json:"livemode" gorm:"column:livemode"`
	DryRun          bool       `json:"dry_run" gorm:"column:dry_run"`
	Trigger         string     `json:"trigger" gorm:"column:trigger"`
	StartedAt       time.Time  `json:"started_at" gorm:"column:started_at"`
	FinishedAt      *time.Time `json:"finished_at" gorm:"column:finished_at"`
	Objects         int        `json:"objects" gorm:"column:objects"`
	Drifted         int        `json:"drifted" gorm:"column:drifted"`
	Repaired        int        `json:"repaired" gorm:"column:repaired"`
	MissingAtStripe int        `json:"missing_at_stripe" gorm:"column:missing_at_stripe"`
	Errors          int        `json:"errors" gorm:"column:errors"`
	Error           *string    `json:"error" gorm:"column:error"`
}

// DriftView is one row of GET /admin/reconcile/drift.
type DriftView struct {
	// ID orders a run's drift (the order found) and pages it.
	ID             int64     `json:"-" gorm:"column:id"`
	RunID          string    `json:"run_id" gorm:"column:run_id"`
	SubscriptionID string    `json:"subscription_id" gorm:"column:subscription_id"`
	Livemode       bool      `json:"livemode" gorm:"column:livemode"`
	Field          string    `json:"field" gorm:"column:field"`
	Local          string    `json:"local" gorm:"column:local"`
	Stripe         string    `json:"stripe" gorm:"column:stripe"`
	Repaired       bool      `json:"repaired" gorm:"column:repaired"`
	Reason         *string   `json:"reason" gorm:"column:reason"`
	CreatedAt      time.Time `json:"created_at" gorm:"column:created_at"`
}

// Runs returns the latest runs of both modes, newest first.
func (s *Service) Runs(ctx context.Context, limit int) ([]RunView, error) {
	runs := []RunView{}
	err := s.db.WithContext(ctx).Raw(`/* all modes: the admin's list, each run with its mode */
		SELECT run_id, livemode, dry_run, trigger, started_at, finished_at, objects, drifted, repaired,
		  missing_at_stripe, errors, error
		FROM reconcile_runs ORDER BY started_at DESC, run_id DESC LIMIT $1`, limit).Scan(&runs).Error
	if err != nil {
		return nil, fmt.Errorf("list reconcile runs: %w", err)
	}
	return runs, nil
}

// RunByID returns one run, nil when unknown.
func (s *Service) RunByID(ctx context.Context, runID string) (*RunView, error) {
	var runs []RunView
	err := s.db.WithContext(ctx).Raw(`/* all modes: a run id names one run */
		SELECT run_id, livemode, dry_run, trigger, started_at, finished_at, objects, drifted, repaired,
		  missing_at_stripe, errors, error
		FROM reconcile_runs WHERE run_id = $1`, runID).Scan(&runs).Error
	if err != nil || len(runs) == 0 {
		return nil, err
	}
	return &runs[0], nil
}

// Drift returns up to limit drift rows of a run in the order they were found, and whether there
// are more.
func (s *Service) Drift(ctx context.Context, runID string, limit int) ([]DriftView, bool, error) {
	drift := []DriftView{}
	err := s.db.WithContext(ctx).Raw(`/* all modes: a run id names one run */
		SELECT run_id, subscription_id, livemode, field, local, stripe, repaired, reason, created_at
		FROM reconcile_drift WHERE run_id = $1 ORDER BY id LIMIT $2`, runID, limit+1).Scan(&drift).Error
	if err != nil {
		return nil, false, fmt.Errorf("list drift of run %s: %w", runID, err)
	}
	more := len(drift) > limit
	if more {
		drift = drift[:limit]
	}
	return drift, more, nil
}

// latestRunID is the newest run of the service's mode, "" when none.
func (s *Service) latestRunID(ctx context.Context) (string, error) {
	var ids []string
	err := s.db.WithContext(ctx).Raw(
		`SELECT run_id FROM reconcile_runs WHERE livemode = $1 ORDER BY started_at DESC, run_id DESC LIMIT 1`, s.livemode).
		Scan(&ids).Error
	if err != nil || len(ids) == 0 {
		return "", err
	}
	return ids[0], nil
}

// lastSuccess is when the last run of the mode that went through (not a dry run) started and
// finished; zero times when there is none.
func (s *Service) lastSuccess(ctx context.Context) (started, finished time.Time, err error) {
	var rows []struct {
		StartedAt  time.Time `gorm:"column:started_at"`
		FinishedAt time.Time `gorm:"column:finished_at"`
	}
	err = s.db.WithContext(ctx).Raw(`
		SELECT started_at, finished_at FROM reconcile_runs
		WHERE livemode = $1 AND NOT dry_run AND finished_at IS NOT NULL AND error IS NULL
		ORDER BY started_at DESC LIMIT 1`, s.livemode).Scan(&rows).Error
	if err != nil {
		return time.Time{}, time.Time{}, fmt.Errorf("find the last reconcile run: %w", err)
	}
	if len(rows) == 0 {
		return time.Time{}, time.Time{}, nil
	}
	return rows[0].StartedAt, rows[0].FinishedAt, nil
}

// firstCheck is when the mode's periodic check first ran on this database (now, the first time).
func (s *Service) firstCheck(ctx context.Context) (time.Time, error) {
	var at []time.Time
	err := s.db.WithContext(ctx).Raw(`
		WITH ins AS (
		  INSERT INTO reconcile_schedule (livemode, first_check_at) VALUES ($1, $2)
		  ON CONFLICT (livemode) DO NOTHING RETURNING first_check_at
		)
		SELECT first_check_at FROM ins UNION ALL SELECT first_check_at FROM reconcile_schedule WHERE livemode = $1`,
		s.livemode, s.now().UTC()).Scan(&at).Error
	if err != nil {
		return time.Time{}, fmt.Errorf("read the reconcile schedule: %w", err)
	}
	if len(at) == 0 {
		return time.Time{}, fmt.Errorf("read the reconcile schedule: no row for %s mode", modeName(s.livemode))
	}
	return at[0], nil
}

// RunPage returns up to limit runs of the service's mode, newest first, those started before the
// run named by before when it is set (keyset on (started_at, run_id)), and whether there are more.
func (s *Service) RunPage(ctx context.Context, before string, limit int) ([]RunView, bool, error) {
	runs := []RunView{}
	q := `SELECT run_id, livemode, dry_run, trigger, started_at, finished_at, objects, drifted, repaired,
		  missing_at_stripe, errors, error
		FROM reconcile_runs WHERE livemode = $1`
	args := []any{s.livemode, limit + 1}
	if before != "" {
		q += ` AND (started_at, run_id) < (SELECT started_at, run_id FROM reconcile_runs WHERE run_id = $3 AND livemode = $1)`
		args = append(args, before)
	}
	if err := s.db.WithContext(ctx).Raw(q+` ORDER BY started_at DESC, run_id DESC LIMIT $2`, args...).Scan(&runs).Error; err != nil {
		return nil, false, fmt.Errorf("list reconcile runs: %w", err)
	}
	more := len(runs) > limit
	if more {
		runs = runs[:limit]
	}
	return runs, more, nil
}

// FieldCount is how many drift rows of a run name one field, and how many of them were repaired.
type FieldCount struct {
	Field    string `gorm:"column:field"`
	Count    int64  `gorm:"column:count"`
	Repaired int64  `gorm:"column:repaired"`
}

// DriftFields counts a run's drift by field, the most frequent first.
func (s *Service) DriftFields(ctx context.Context, runID string) ([]FieldCount, error) {
	out := []FieldCount{}
	err := s.db.WithContext(ctx).Raw(`
		SELECT field, count(*) AS count, count(*) FILTER (WHERE repaired) AS repaired
		FROM reconcile_drift WHERE run_id = $1 AND livemode = $2
		GROUP BY field ORDER BY count(*) DESC, field`, runID, s.livemode).Scan(&out).Error
	if err != nil {
		return nil, fmt.Errorf("count drift of run %s: %w", runID, err)
	}
	return out, nil
}

// DriftPage returns up to limit drift rows of a run in the order found, of one field when field is
// set, after the row id after (0: from the start), and whether there are more.
func (s *Service) DriftPage(ctx context.Context, runID, field string, after int64, limit int) ([]DriftView, bool, error) {
	drift := []DriftView{}
	q := `SELECT id, run_id, subscription_id, livemode, field, local, stripe, repaired, reason, created_at
		FROM reconcile_drift WHERE run_id = $1 AND livemode = $2 AND id > $3`
	args := []any{runID, s.livemode, after, limit + 1}
	if field != "" {
		q += ` AND field = $5`
		args = append(args, field)
	}
	if err := s.db.WithContext(ctx).Raw(q+` ORDER BY id LIMIT $4`, args...).Scan(&drift).Error; err != nil {
		return nil, false, fmt.Errorf("list drift of run %s: %w", runID, err)
	}
	more := len(drift) > limit
	if more {
		drift = drift[:limit]
	}
	return drift, more, nil
}

// Livemode is the mode the service reconciles.
func (s *Service) Livemode() bool { return s.livemode }

// ErrUnavailable means the database has no reconciliation tables (another version of the
// schema): the console's overview says so instead of failing.
var ErrUnavailable = errors.New("reconcile not available")

// LastRunView is the newest run of a mode with its first drift rows, as the console's overview
// shows it.
type LastRunView struct {
	RunView
	Drift []DriftView
	// MoreDrift says there are drift rows past Drift.
	MoreDrift bool
}

// LastRun returns the newest run of the mode with its first drift rows (at most drift), nil
// when there is none, or ErrUnavailable when the tables do not exist. It reads each row whole as
// JSON and takes the fields it knows, so that a column added or missing costs a blank cell on
// the overview, never the overview.
func (s *Service) LastRun(ctx context.Context, livemode bool, drift int) (*LastRunView, error) {
	var present struct {
		Runs  bool `gorm:"column:runs"`
		Drift bool `gorm:"column:drift"`
	}
	if err := s.db.WithContext(ctx).Raw(`SELECT to_regclass('reconcile_runs') IS NOT NULL AS runs,
		to_regclass('reconcile_drift') IS NOT NULL AS drift`).Scan(&present).Error; err != nil {
		return nil, fmt.Errorf("look for reconcile tables: %w", err)
	}
	if !present.Runs {
		return nil, ErrUnavailable
	}
	var runs []string
	if err := s.db.WithContext(ctx).Raw(`/* all modes: the mode is chosen below, and the table may predate the column */
		SELECT to_jsonb(r)::text FROM reconcile_runs r ORDER BY r.started_at DESC LIMIT 20`).
		Scan(&runs).Error; err != nil {
		if schemaMismatch(err) {
			return nil, ErrUnavailable
		}
		return nil, fmt.Errorf("read reconcile runs: %w", err)
	}
	var run *LastRunView
	for _, raw := range runs {
		var candidate struct {
			RunView
			Livemode *bool `json:"livemode"`
		}
		if err := json.Unmarshal([]byte(raw), &candidate); err != nil {
			return nil, fmt.Errorf("decode reconcile run: %w", err)
		}
		// A run that does not say its mode (a table from before modes) counts for either.
		if candidate.Livemode == nil || *candidate.Livemode == livemode {
			run = &LastRunView{RunView: candidate.RunView}
			run.RunView.Livemode = candidate.Livemode != nil && *candidate.Livemode
			break
		}
	}
	if run == nil || !present.Drift {
		return run, nil
	}
	var rows []string
	if err := s.db.WithContext(ctx).Raw(`/* all modes: a run id names one run */ SELECT to_jsonb(d)::text FROM reconcile_drift d WHERE d.run_id = $1
		ORDER BY d.subscription_id, d.field LIMIT $2`, run.RunID, drift+1).Scan(&rows).Error; err != nil {
		if schemaMismatch(err) {
			return run, nil
		}
		return nil, fmt.Errorf("read reconcile drift: %w", err)
	}
	if len(rows) > drift {
		rows, run.MoreDrift = rows[:drift], true
	}
	for _, raw := range rows {
		var d DriftView
		if err := json.Unmarshal([]byte(raw), &d); err != nil {
			return nil, fmt.Errorf("decode reconcile drift: %w", err)
		}
		run.Drift = append(run.Drift, d)
	}
	return run, nil
}

// schemaMismatch is a table or column that is not there (another version of the schema).
func schemaMismatch(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && (pg.Code == "42P01" || pg.Code == "42703")
}
