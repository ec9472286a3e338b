-- +goose Up
-- The ledger of our own money-moving calls to Stripe (billing/ledger). A row is written and
-- committed, state 'pending', before the Stripe call and completed after it, so that:
--   * a repeat of a completed request answers from `answer` without calling Stripe (also after
--     Stripe's 24-hour idempotency-key window);
--   * a row left pending by a crash or an outage is finished by repeating the call with the same
--     idempotency_key (see billing/ledger for what happens beyond the key window);
--   * the same business id with another request (request_hash) is refused.
-- `state` says whether we have Stripe's final answer; `status` is that answer (Stripe's own status
-- of the object, or 'declined' / 'failed' / 'error' when Stripe refused the call).
CREATE TABLE charges (
  order_id text PRIMARY KEY,
  user_id text NOT NULL,
  stripe_customer_id text NOT NULL,
  amount bigint NOT NULL CHECK (amount > 0),
  currency text NOT NULL,
  description text,
  -- sha256 of the canonical request: the same order_id with other values is a conflict.
  request_hash text NOT NULL,
  idempotency_key text NOT NULL UNIQUE,
  livemode boolean NOT NULL,
  state text NOT NULL CHECK (state IN ('pending', 'completed')),
  status text,
  payment_intent_id text,
  -- The payment method chosen for the first attempt ('' = none, Stripe falls back to the
  -- customer's default source); NULL until resolved. Kept so that every retry sends the same
  -- parameters under the same key.
  payment_method_id text,
  -- {"body": <exact JSON answered>} or {"error": {"code", "message", "details"}}; NULL while pending.
  answer jsonb,
  error_code text,
  decline_code text,
  attempts integer NOT NULL DEFAULT 0,
  last_attempt_at timestamptz,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(),
  completed_at timestamptz,
  CHECK (state = 'pending' OR (status IS NOT NULL AND answer IS NOT NULL))
);
CREATE INDEX charges_user_idx ON charges (user_id, created_at DESC);
CREATE INDEX charges_payment_intent_idx ON charges (payment_intent_id) WHERE payment_intent_id IS NOT NULL;
-- Operators look for rows stuck pending (an outage that no client retried).
CREATE INDEX charges_pending_idx ON charges (created_at) WHERE state = 'pending';

CREATE TABLE refunds (
  order_id text NOT NULL REFERENCES charges (order_id),
  refund_id text NOT NULL,
  -- The amount reserved at insert time (the request's, or the whole remainder when omitted).
  amount bigint NOT NULL CHECK (amount > 0),
  reason text,
  request_hash text NOT NULL,
  -- UNIQUE also catches the ambiguity of the contract's key format: refund-{a-b}-{c} and
  -- refund-{a}-{b-c} are the same string.
  idempotency_key text NOT NULL UNIQUE,
  state text NOT NULL CHECK (state IN ('pending', 'completed')),
  status text,
  stripe_refund_id text,
  answer jsonb,
  error_code text,
  attempts integer NOT NULL DEFAULT 0,
  last_attempt_at timestamptz,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(),
  completed_at timestamptz,
  PRIMARY KEY (order_id, refund_id),
  CHECK (state = 'pending' OR (status IS NOT NULL AND answer IS NOT NULL))
);
CREATE INDEX refunds_stripe_refund_idx ON refunds (stripe_refund_id) WHERE stripe_refund_id IS NOT NULL;
CREATE INDEX refunds_pending_idx ON refunds (created_at) WHERE state = 'pending';

-- +goose Down
DROP TABLE refunds;
DROP TABLE charges;
