-- +goose Up
-- Local mirror of Stripe subscriptions, driven by webhook events (billing package). Two column
-- groups, each with its own ordering guard: subscription events write the snapshot group only,
-- invoice events write the payment-hold group only, so neither can undo the other's update
-- whatever order Stripe delivers them in.
--
-- Ordering: an event is applied to a group only when its key (event created, rank, event id) is
-- greater than the key stored with the group; the rank breaks ties within Stripe's one-second
-- clock (see billing/lifecycle.go). A row whose sub_event_created is NULL is a placeholder made by
-- an invoice event that arrived before any subscription event: any subscription event overwrites it.
--
-- Subscriptions are keyed by Stripe's id and carry the Stripe customer id, not a user id: rows of
-- customers the service does not know yet are kept and join customers.stripe_customer_id at read time.
CREATE TABLE subscriptions (
  subscription_id text PRIMARY KEY,
  stripe_customer_id text NOT NULL,
  livemode boolean NOT NULL DEFAULT false,

  -- Snapshot group: written only by customer.subscription.* events.
  -- Stripe's status as text, unknown future values kept as they come (no CHECK on purpose).
  status text NOT NULL,
  price_id text,
  current_period_start timestamptz,
  current_period_end timestamptz,
  cancel_at_period_end boolean NOT NULL DEFAULT false,
  cancel_at timestamptz,
  canceled_at timestamptz,
  ended_at timestamptz,
  trial_start timestamptz,
  trial_end timestamptz,
  -- When the current status was first seen (the created time of the event that set it).
  status_since timestamptz,
  sub_event_id text,
  sub_event_type text,
  sub_event_created timestamptz,
  sub_event_rank integer,
  -- Newest customer.subscription.trial_will_end seen (monotonic, outside the ordering guard).
  trial_will_end_at timestamptz,

  -- Payment-hold group: written only by invoice.payment_failed / invoice.payment_succeeded.
  payment_hold boolean NOT NULL DEFAULT false,
  payment_hold_since timestamptz,
  latest_invoice_id text,
  attempt_count integer,
  next_payment_attempt timestamptz,
  amount_due bigint,
  currency text,
  hosted_invoice_url text,
  inv_event_id text,
  inv_event_type text,
  inv_event_created timestamptz,
  inv_event_rank integer,

  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX subscriptions_customer_idx ON subscriptions (stripe_customer_id);
-- /admin/holds reads only the few candidate rows; the exact hold rule is applied in Go.
CREATE INDEX subscriptions_hold_candidates_idx ON subscriptions (subscription_id)
  WHERE status NOT IN ('canceled', 'incomplete_expired') AND (payment_hold OR status IN ('past_due', 'unpaid'));

-- +goose Down
DROP TABLE subscriptions;
