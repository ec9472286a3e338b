package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/stripe/stripe-go/v79"
	"gorm.io/gorm"

	"billing/internal/audit"
	"billing/internal/database"
)

// pageSize is Stripe's largest page.
const pageSize = 100

// remote is one subscription as Stripe answered it, with its latest invoice and customer
// expanded, and when it was read.
type remote struct {
	sub       *stripe.Subscription
	raw       json.RawMessage
	invoice   json.RawMessage
	fetchedAt time.Time
}

// run is one reconciliation in progress.
type run struct {
	s       *Service
	lk      *runLock
	opts    RunOptions
	started time.Time
	sum     Summary
	pages   int // the last page recorded
}

// begin records a new run; the caller holds the mode's lock. Runs left unfinished by a process
// that died (no lock held, since this one got it) are marked interrupted first.
func (s *Service) begin(ctx context.Context, lk *runLock, opts RunOptions) (*run, error) {
	if s.billing == nil || s.features == nil {
		return nil, errors.New("reconcile: no local state to reconcile (SetBilling not called)")
	}
	if opts.Trigger == "" {
		opts.Trigger = TriggerCommand
	}
	now := s.now().UTC()
	r := &run{s: s, lk: lk, opts: opts, started: now, sum: Summary{RunID: newRunID(now), DryRun: opts.DryRun, Catalog: s.catalog != nil}}
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Exec(`
			UPDATE reconcile_runs SET finished_at = $1, errors = errors + 1,
			  error = 'interrupted: the process running it stopped before the end'
			WHERE livemode = $2 AND finished_at IS NULL`, now, s.livemode).Error; err != nil {
			return err
		}
		if err := tx.Exec(`
			INSERT INTO reconcile_runs (run_id, livemode, dry_run, trigger, started_at) VALUES ($1, $2, $3, $4, $5)`,
			r.sum.RunID, s.livemode, opts.DryRun, opts.Trigger, now).Error; err != nil {
			return err
		}
		if opts.Actor == "" {
			return nil
		}
		result := "started"
		if opts.DryRun {
			result = "started (dry run)"
		}
		return audit.RecordBy(ctx, tx, opts.Actor, audit.ActionReconcileStart, r.sum.RunID, s.livemode, result)
	})
	if err != nil {
		return nil, fmt.Errorf("reconcile: record the run: %w", err)
	}
	// The ids Stripe listed, for the subscriptions it did not: in the lock's session, so that a
	// huge account costs disk, not memory.
	if _, err := lk.conn.ExecContext(ctx, `
		CREATE TEMP TABLE IF NOT EXISTS reconcile_seen (subscription_id text PRIMARY KEY);
		TRUNCATE pg_temp.reconcile_seen`); err != nil {
		r.finish(ctx, fmt.Errorf("create the table of listed ids: %w", err))
		return nil, fmt.Errorf("reconcile: %w", err)
	}
	s.log.InfoContext(ctx, "reconcile run started", "run_id", r.sum.RunID, "dry_run", opts.DryRun,
		"trigger", opts.Trigger, "mode", modeName(s.livemode))
	return r, nil
}

// execute lists, compares and repairs, then records the outcome.
func (r *run) execute(ctx context.Context) Summary {
	err := r.list(ctx)
	if err == nil {
		err = r.missingAtStripe(ctx)
	}
	if err == nil {
		err = r.catalogPass(ctx)
	}
	if err != nil && ctx.Err() != nil {
		err = fmt.Errorf("interrupted: %w", context.Cause(ctx))
	}
	r.finish(ctx, err)
	return r.sum
}

// missingAtStripe records the local subscriptions of the mode that Stripe did not list. Rows
// created after the run started are left out: their subscription may be newer than the listing.
func (r *run) missingAtStripe(ctx context.Context) error {
	rows, err := r.lk.conn.QueryContext(ctx, `
		SELECT s.subscription_id, s.status FROM subscriptions s
		WHERE s.livemode = $1 AND s.created_at < $2
		  AND NOT EXISTS (SELECT 1 FROM pg_temp.reconcile_seen r WHERE r.subscription_id = s.subscription_id)
		ORDER BY s.subscription_id`, r.s.livemode, r.started)
	if err != nil {
		return fmt.Errorf("find subscriptions missing at Stripe: %w", err)
	}
	missing, err := database.ScanAll[struct {
		SubscriptionID string `gorm:"column:subscription_id"`
		Status         string `gorm:"column:status"`
	}](rows)
	if err != nil {
		return fmt.Errorf("find subscriptions missing at Stripe: %w", err)
	}
	if len(missing) == 0 {
		return nil
	}
	drift := make([]newDrift, len(missing))
	for i, m := range missing {
		drift[i] = newDrift{subscriptionID: m.SubscriptionID, outcome: outcome{diff: diff{Field: FieldMissingAtStripe, Local: m.Status},
			reason: "Stripe did not list it; local subscriptions are never deleted"}}
	}
	if err := r.insertDrift(r.s.db.WithContext(ctx), drift, r.s.now().UTC()); err != nil {
		return err
	}
	r.sum.MissingAtStripe = len(missing)
	r.s.metrics.drift.WithLabelValues(FieldMissingAtStripe).Add(float64(len(missing)))
	return nil
}

// finish records the outcome. cause is what stopped the run, nil when it went through.
func (r *run) finish(ctx context.Context, cause error) {
	if cause != nil {
		r.sum.Err = cause
		r.sum.Errors++
	}
	// A fresh context: a run stopped by its context's end must still record that it stopped.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	var errText *string
	if cause != nil {
		t := cause.Error()
		errText = &t
	}
	finished := r.s.now().UTC()
	err := r.s.db.WithContext(ctx).Exec(`
		UPDATE reconcile_runs SET finished_at = $2, objects = $3, drifted = $4, repaired = $5,
		  missing_at_stripe = $6, errors = $7, error = $8
		WHERE run_id = $1 AND livemode = $9`,
		r.sum.RunID, finished, r.sum.Objects, r.sum.Drifted, r.sum.Repaired, r.sum.MissingAtStripe, r.sum.Errors, errText, r.s.livemode).Error
	if err != nil {
		r.s.log.ErrorContext(ctx, "reconcile: record the run's outcome", "run_id", r.sum.RunID, "error", err)
	}
	attrs := []any{"run_id", r.sum.RunID, "dry_run", r.opts.DryRun, "objects", r.sum.Objects, "drifted", r.sum.Drifted,
		"repaired", r.sum.Repaired, "missing_at_stripe", r.sum.MissingAtStripe, "errors", r.sum.Errors,
		"duration", finished.Sub(r.started)}
	if r.sum.Catalog {
		attrs = append(attrs, "catalog_objects", r.sum.CatalogObjects, "catalog_drifted", r.sum.CatalogDrifted,
			"catalog_repaired", r.sum.CatalogRepaired)
	}
	if cause != nil {
		r.s.log.ErrorContext(ctx, "reconcile run stopped before the end", append(attrs, "error", cause)...)
		return
	}
	level := slog.LevelInfo
	if r.sum.ExitCode() != ExitClean {
		level = slog.LevelWarn
	}
	r.s.log.Log(ctx, level, "reconcile run finished", attrs...)
	if !r.opts.DryRun {
		r.s.metrics.lastSuccess.Set(float64(finished.Unix()))
	}
}

// outcome is one drift row.
type outcome struct {
	diff
	repaired bool
	reason   string
}

// newDrift is a drift row on its way to reconcile_drift.
type newDrift struct {
	subscriptionID string
	outcome
}

// insertDrift stores drift rows in one statement, in their order (the order of the drift list).
func (r *run) insertDrift(tx *gorm.DB, rows []newDrift, now time.Time) error {
	if len(rows) == 0 {
		return nil
	}
	n := len(rows)
	subs, fields, locals, stripes := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	repaired, reasons := make([]bool, n), make([]*string, n)
	for i, d := range rows {
		subs[i], fields[i], locals[i], stripes[i], repaired[i] = d.subscriptionID, d.Field, d.Local, d.Stripe, d.repaired
		if d.reason != "" && !d.repaired {
			reasons[i] = &d.reason
		}
	}
	err := tx.Exec(`
		INSERT INTO reconcile_drift (run_id, subscription_id, livemode, field, local, stripe, repaired, reason, created_at)
		SELECT $1, d.subscription_id, $2, d.field, d.local, d.stripe, d.repaired, d.reason, $3
		FROM unnest(CAST($4 AS text[]), CAST($5 AS text[]), CAST($6 AS text[]), CAST($7 AS text[]), CAST($8 AS boolean[]), CAST($9 AS text[]))
		  WITH ORDINALITY AS d(subscription_id, field, local, stripe, repaired, reason, n)
		ORDER BY d.n`,
		r.sum.RunID, r.s.livemode, now, subs, fields, locals, stripes, repaired, reasons).Error
	if err != nil {
		return fmt.Errorf("record %d drift rows: %w", n, err)
	}
	return nil
}

// gone reports whether Stripe said the object does not exist (any more).
func gone(err error) bool {
	var se *stripe.Error
	return errors.As(err, &se) && se.HTTPStatusCode == http.StatusNotFound
}

func modeName(livemode bool) string {
	if livemode {
		return "live"
	}
	return "test"
}
