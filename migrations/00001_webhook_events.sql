-- +goose Up
-- The webhook inbox. Its columns are part of the outside contract (INTERFACE §4).
CREATE TABLE webhook_events (
  event_id text PRIMARY KEY,
  source text NOT NULL,
  type text NOT NULL,
  livemode boolean NOT NULL,
  api_version text,
  status text NOT NULL CHECK (status IN ('received', 'processed', 'failed', 'ignored')),
  payload jsonb NOT NULL,
  attempts integer NOT NULL DEFAULT 0,
  received_at timestamptz NOT NULL DEFAULT now(),
  processed_at timestamptz,
  failure_reason text,
  -- The event's own `created` (Stripe's clock), kept for ordering and investigation.
  event_created timestamptz
);
CREATE INDEX webhook_events_source_received_idx ON webhook_events (source, received_at DESC);
-- The admin list filters by status (failed, received) far more often than it scans everything.
CREATE INDEX webhook_events_status_received_idx ON webhook_events (status, received_at DESC);

CREATE TABLE webhook_dead_letters (
  event_id text PRIMARY KEY REFERENCES webhook_events (event_id) ON DELETE CASCADE,
  attempts integer NOT NULL,
  last_error text NOT NULL,
  dead_at timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE webhook_dead_letters;
DROP TABLE webhook_events;
