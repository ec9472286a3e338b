-- +goose Up
-- Reconciliation (package reconcile): every run compares Stripe's subscriptions of one mode with
-- the local state and repairs what differs through the event code. A run is a row here from its
-- start, so an admin sees it going; finished_at NULL with no process holding the run's advisory
-- lock means the process died, and the next run of that mode marks it interrupted.
CREATE TABLE reconcile_runs (
  run_id text PRIMARY KEY,
  livemode boolean NOT NULL,
  dry_run boolean NOT NULL,
  -- 'command', 'periodic' or 'admin': who started it.
  trigger text NOT NULL,
  started_at timestamptz NOT NULL,
  finished_at timestamptz,
  -- Subscriptions listed at Stripe, subscriptions that differed, of which repaired, local
  -- subscriptions Stripe did not list, errors (per object, and the one that stopped a run).
  objects integer NOT NULL DEFAULT 0,
  drifted integer NOT NULL DEFAULT 0,
  repaired integer NOT NULL DEFAULT 0,
  missing_at_stripe integer NOT NULL DEFAULT 0,
  errors integer NOT NULL DEFAULT 0,
  -- Why the run stopped before the end; NULL when it went through.
  error text
);
CREATE INDEX reconcile_runs_started_idx ON reconcile_runs (livemode, started_at DESC);

-- One row per field that differed: the local and Stripe values as text ('' for none), whether the
-- run repaired it, and if not, why.
CREATE TABLE reconcile_drift (
  id bigserial PRIMARY KEY,
  run_id text NOT NULL REFERENCES reconcile_runs (run_id) ON DELETE CASCADE,
  subscription_id text NOT NULL,
  livemode boolean NOT NULL,
  field text NOT NULL,
  local text NOT NULL DEFAULT '',
  stripe text NOT NULL DEFAULT '',
  repaired boolean NOT NULL DEFAULT false,
  reason text,
  created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX reconcile_drift_run_idx ON reconcile_drift (run_id, id);
CREATE INDEX reconcile_drift_subscription_idx ON reconcile_drift (subscription_id, livemode);

-- When serve first checked whether a periodic run of the mode is due: with no run yet, the first
-- periodic one comes an interval later (the backfill is the command's), whatever the restarts.
CREATE TABLE reconcile_schedule (
  livemode boolean PRIMARY KEY,
  first_check_at timestamptz NOT NULL
);

-- +goose Down
DROP TABLE reconcile_schedule;
DROP TABLE reconcile_drift;
DROP TABLE reconcile_runs;
