-- +goose Up
-- Checkout sessions (checkout package). Two ways in, one row per session:
--   * POST /v1/customers/{user_id}/checkout-sessions: the row is written and committed, state
--     'pending', with the request's values and hash, before Stripe is called with the key
--     checkout-{user_id}-{request_id}; the call completes it with Stripe's answer, so that a
--     repeat answers from `answer` without calling Stripe and the same request_id with other
--     values is refused. request_id, request_hash and the request's values are set.
--   * a checkout.session.* event, or the success page reading a session that was not made here:
--     the row is recorded from Stripe's object, completed at once; request_id is NULL.
-- The session's own fields (session_status, payment_status, subscription_id) are Stripe's and
-- move forward only (open → complete or expired; unpaid → paid), whichever event or read brings
-- them.
CREATE TABLE checkout_sessions (
  id bigserial PRIMARY KEY,
  livemode boolean NOT NULL,
  -- NULL when Stripe's session names no user we could recognise.
  user_id text,
  stripe_customer_id text,

  -- The request (NULL for sessions not made through the API).
  request_id text,
  request_hash text,
  idempotency_key text UNIQUE,
  price_id text,
  quantity bigint,
  trial_period_days bigint,
  success_url text,
  cancel_url text,

  state text NOT NULL CHECK (state IN ('pending', 'completed')),
  -- {"body": <exact JSON answered>} or {"error": {"code", "message"}}; NULL while pending and
  -- for sessions not made through the API.
  answer jsonb,
  attempts integer NOT NULL DEFAULT 0,
  last_attempt_at timestamptz,
  error_code text,

  -- Stripe's session, once known. An id belongs to one mode at Stripe; the code compares the
  -- stored mode with the event's and refuses a mismatch.
  session_id text UNIQUE,
  session_status text,
  payment_status text,
  subscription_id text,
  url text,
  expires_at timestamptz,

  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(),
  completed_at timestamptz,
  UNIQUE (user_id, request_id),
  CHECK (request_id IS NULL OR (user_id IS NOT NULL AND request_hash IS NOT NULL AND idempotency_key IS NOT NULL)),
  CHECK (state = 'pending' OR request_id IS NULL OR answer IS NOT NULL)
);
CREATE INDEX checkout_sessions_subscription_idx ON checkout_sessions (subscription_id) WHERE subscription_id IS NOT NULL;
-- Operators look for rows stuck pending (an outage that no client retried).
CREATE INDEX checkout_sessions_pending_idx ON checkout_sessions (created_at) WHERE state = 'pending';

-- +goose Down
DROP TABLE checkout_sessions;
