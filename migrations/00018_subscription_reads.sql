-- +goose Up
-- Reads of a subscription from Stripe that were applied as snapshots (billing.ApplySnapshot: by
-- reconcile, by the renewal re-read, by Checkout's sync), kept with the object that was read. They
-- are the part of the state's history that is not in the event log: `billing verify` replays the
-- stored events and these reads together, in the ordering guard's order, to recompute the state.
-- A row is written in the transaction that applies the read, so it exists iff the read was applied.
CREATE TABLE subscription_reads (
  id bigserial PRIMARY KEY,
  livemode boolean NOT NULL,
  subscription_id text NOT NULL,
  -- What the row's sub_event_id / inv_event_id names when this read wrote it ("reconcile:RUN",
  -- "reread:SUBSCRIPTION", "checkout:SESSION:SOURCE").
  source text NOT NULL,
  -- When Stripe answered (full precision; the guard uses it floored to the second).
  fetched_at timestamptz NOT NULL,
  subscription jsonb NOT NULL,
  latest_invoice jsonb,
  created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX subscription_reads_fetched_idx ON subscription_reads (livemode, fetched_at);
CREATE INDEX subscription_reads_subscription_idx ON subscription_reads (subscription_id, livemode);

-- +goose Down
DROP TABLE subscription_reads;
