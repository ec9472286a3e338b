-- +goose Up
-- Usage records (usage package): the outbox of meter events. A row is inserted, pending, in the
-- request's transaction and answered 202; the reporter sends it to Stripe as one meter event
-- (identifier usage-{user_id}-{usage_id}) and marks it reported in the transaction that records
-- Stripe's answer. usage_id is the app's, unique per user and mode.
CREATE TABLE usage_records (
  livemode boolean NOT NULL,
  user_id text NOT NULL,
  usage_id text NOT NULL,
  meter text NOT NULL,
  value bigint NOT NULL,
  -- The usage's own time (whole seconds, Stripe's timestamp): which period it counts in.
  occurred_at timestamptz NOT NULL,
  stripe_customer_id text NOT NULL,
  -- The meter event's identifier, also its idempotency key. Unique per mode: two users' ids may
  -- spell the same identifier ("a-b"+"c", "a"+"b-c"), and Stripe would drop the second as a repeat.
  identifier text NOT NULL,
  status text NOT NULL CHECK (status IN ('pending', 'reported', 'needs_review', 'refused')),
  attempts integer NOT NULL DEFAULT 0,
  -- Committed before the first call to Stripe: the identifier's window is counted from it.
  first_attempt_at timestamptz,
  last_attempt_at timestamptz,
  next_attempt_at timestamptz NOT NULL,
  error_code text,
  error_message text,
  reported_at timestamptz,
  review_since timestamptz,
  created_at timestamptz NOT NULL,
  updated_at timestamptz NOT NULL,
  PRIMARY KEY (livemode, user_id, usage_id)
);
CREATE UNIQUE INDEX usage_records_identifier_idx ON usage_records (livemode, identifier);
-- The reporter's queue: only the rows still to send.
CREATE INDEX usage_records_due_idx ON usage_records (livemode, next_attempt_at) WHERE status = 'pending';
-- GET …/usage sums one user's meter over a period.
CREATE INDEX usage_records_period_idx ON usage_records (livemode, user_id, meter, occurred_at);
-- Operators look at what needs review.
CREATE INDEX usage_records_review_idx ON usage_records (livemode, review_since) WHERE status = 'needs_review';

-- +goose Down
DROP TABLE usage_records;
