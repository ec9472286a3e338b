package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"gorm.io/gorm"
)

// ErrReconcileUnavailable means this database has no reconciliation tables.
var ErrReconcileUnavailable = errors.New("reconcile not available")

// ReconcileRun is a reconciliation run as the overview shows it, with the first drift rows.
type ReconcileRun struct {
	RunID           string     `json:"run_id"`
	Livemode        *bool      `json:"livemode"`
	DryRun          bool       `json:"dry_run"`
	Trigger         string     `json:"trigger"`
	StartedAt       *time.Time `json:"started_at"`
	FinishedAt      *time.Time `json:"finished_at"`
	Objects         int64      `json:"objects"`
	Drifted         int64      `json:"drifted"`
	Repaired        int64      `json:"repaired"`
	MissingAtStripe int64      `json:"missing_at_stripe"`
	Errors          int64      `json:"errors"`
	Error           *string    `json:"error"`
	Drift           []DriftRow `json:"-"`
	// MoreDrift says there are drift rows past Drift.
	MoreDrift bool `json:"-"`
}

// DriftRow is one field that differed in a run.
type DriftRow struct {
	SubscriptionID string  `json:"subscription_id"`
	Field          string  `json:"field"`
	Local          string  `json:"local"`
	Stripe         string  `json:"stripe"`
	Repaired       bool    `json:"repaired"`
	Reason         *string `json:"reason"`
}

// driftShown is how many drift rows the overview lists.
const driftShown = 20

// ReconcileReader reads the reconciliation tables, which the reconcile package owns. It reads
// each row whole as JSON and takes the fields it knows, so that a column added or missing there
// costs a blank cell here, never the overview.
type ReconcileReader struct{ db *gorm.DB }

// NewReconcileReader reads the runs from db.
func NewReconcileReader(db *gorm.DB) *ReconcileReader { return &ReconcileReader{db: db} }

// LastRun returns the newest run of the mode (or of any mode, when the runs do not say), nil when
// there is none, or ErrReconcileUnavailable when the tables do not exist.
func (r *ReconcileReader) LastRun(ctx context.Context, livemode bool) (*ReconcileRun, error) {
	var present struct {
		Runs  bool `gorm:"column:runs"`
		Drift bool `gorm:"column:drift"`
	}
	if err := r.db.WithContext(ctx).Raw(`SELECT to_regclass('reconcile_runs') IS NOT NULL AS runs,
		to_regclass('reconcile_drift') IS NOT NULL AS drift`).Scan(&present).Error; err != nil {
		return nil, fmt.Errorf("look for reconcile tables: %w", err)
	}
	if !present.Runs {
		return nil, ErrReconcileUnavailable
	}
	var runs []string
	if err := r.db.WithContext(ctx).Raw(`/* all modes: the mode is chosen below, and the table may predate the column */
		SELECT to_jsonb(r)::text FROM reconcile_runs r ORDER BY r.started_at DESC LIMIT 20`).
		Scan(&runs).Error; err != nil {
		if schemaMismatch(err) {
			return nil, ErrReconcileUnavailable
		}
		return nil, fmt.Errorf("read reconcile runs: %w", err)
	}
	var run *ReconcileRun
	for _, raw := range runs {
		var candidate ReconcileRun
		if err := json.Unmarshal([]byte(raw), &candidate); err != nil {
			return nil, fmt.Errorf("decode reconcile run: %w", err)
		}
		if candidate.Livemode == nil || *candidate.Livemode == livemode {
			run = &candidate
			break
		}
	}
	if run == nil || !present.Drift {
		return run, nil
	}
	var drift []string
	if err := r.db.WithContext(ctx).Raw(`/* all modes: a run id names one run */ SELECT to_jsonb(d)::text FROM reconcile_drift d WHERE d.run_id = $1
		ORDER BY d.subscription_id, d.field LIMIT $2`, run.RunID, driftShown+1).Scan(&drift).Error; err != nil {
		if schemaMismatch(err) {
			return run, nil
		}
		return nil, fmt.Errorf("read reconcile drift: %w", err)
	}
	if len(drift) > driftShown {
		drift, run.MoreDrift = drift[:driftShown], true
	}
	for _, raw := range drift {
		var d DriftRow
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
