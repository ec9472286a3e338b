-- +goose Up
-- Customer notices (trial ending, payment failed). A row is written in the transaction that
-- processes the event, together with the River job that sends it; UNIQUE (event_id, kind) makes
-- a re-applied event a no-op, so an event never yields two notices.
CREATE TABLE notices (
  id bigserial PRIMARY KEY,
  event_id text NOT NULL,
  kind text NOT NULL,
  subscription_id text,
  stripe_customer_id text,
  livemode boolean NOT NULL DEFAULT false,
  -- The address known when the event was processed; empty when none was (the job looks again).
  recipient text NOT NULL DEFAULT '',
  created_at timestamptz NOT NULL DEFAULT now(),
  -- Set by the job: how the notice went out ('smtp', 'log', 'no_recipient') and when.
  delivery text,
  sent_at timestamptz,
  UNIQUE (event_id, kind)
);
CREATE INDEX notices_subscription_idx ON notices (subscription_id);

-- +goose Down
DROP TABLE notices;
