-- +goose Up
-- The whole customer journey: which invoice a payment hold is about, collection pauses, the
-- customer's own events, invoices kept locally, and ledger rows settled by Stripe's events.

-- Payment hold (invoice group): the invoice that caused it. A payment lifts the hold only when it
-- is for that invoice or a newer one (created at or after it); the hold's kind says whether the
-- card was refused (payment_failed) or the customer must authenticate (authentication_required);
-- the billing reason tells a subscription's first invoice (subscription_create) from renewals.
ALTER TABLE subscriptions
  ADD COLUMN payment_hold_invoice_created timestamptz,
  ADD COLUMN payment_hold_kind text,
  ADD COLUMN payment_hold_billing_reason text,
  -- Snapshot group: the newest event time at which the subscription is known to have had another
  -- status than its current one. status_since is never moved to or before it by an older event
  -- of the current status (that event belongs to an earlier stint of the status).
  ADD COLUMN status_other_at timestamptz,
  -- pause_collection of the snapshot: collection paused while the status stays what it is.
  ADD COLUMN pause_collection_behavior text,
  ADD COLUMN pause_collection_resumes_at timestamptz;
-- Ranks of the invoice group are now payment_failed 0, payment_action_required 1, success 2.
UPDATE subscriptions SET inv_event_rank = 2 WHERE inv_event_rank = 1;

-- customer.updated / customer.deleted: ordered like the subscription groups, and a deleted
-- Stripe customer is no longer a link that calls out (its row stays, marked).
ALTER TABLE customers
  ADD COLUMN cus_event_id text,
  ADD COLUMN cus_event_created timestamptz,
  ADD COLUMN cus_event_rank integer,
  ADD COLUMN deleted_at timestamptz;

-- Charges and refunds settled by payment_intent.*, charge.refund*, refund.* events: the status
-- column is the current truth (the answer stays what POST answered), ordered by the event key.
ALTER TABLE charges
  ADD COLUMN pi_event_id text,
  ADD COLUMN pi_event_created timestamptz,
  ADD COLUMN pi_event_rank integer,
  ADD COLUMN amount_refunded bigint;
ALTER TABLE refunds
  ADD COLUMN re_event_id text,
  ADD COLUMN re_event_created timestamptz,
  ADD COLUMN re_event_rank integer,
  ADD COLUMN failure_reason text;

-- Invoices, kept from the invoice.* events (billing package), read by
-- GET /v1/customers/{user_id}/invoices newest first.
CREATE TABLE invoices (
  invoice_id text PRIMARY KEY,
  livemode boolean NOT NULL,
  stripe_customer_id text NOT NULL,
  subscription_id text,
  number text,
  -- Stripe's status as text (draft, open, paid, uncollectible, void, or a future one).
  status text,
  billing_reason text,
  amount_due bigint,
  amount_paid bigint,
  currency text,
  period_start timestamptz,
  period_end timestamptz,
  hosted_invoice_url text,
  invoice_pdf text,
  -- The invoice's own creation time (Stripe's clock): the list's order.
  created timestamptz NOT NULL,
  inv_event_id text,
  inv_event_type text,
  inv_event_created timestamptz,
  inv_event_rank integer,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now()
);
-- Pages are ordered by (created, invoice_id byte-wise), newest first.
CREATE INDEX invoices_customer_created_idx ON invoices (stripe_customer_id, livemode, created DESC, invoice_id COLLATE "C" DESC);

-- +goose Down
DROP TABLE invoices;
ALTER TABLE refunds DROP COLUMN re_event_id, DROP COLUMN re_event_created, DROP COLUMN re_event_rank, DROP COLUMN failure_reason;
ALTER TABLE charges DROP COLUMN pi_event_id, DROP COLUMN pi_event_created, DROP COLUMN pi_event_rank, DROP COLUMN amount_refunded;
ALTER TABLE customers DROP COLUMN cus_event_id, DROP COLUMN cus_event_created, DROP COLUMN cus_event_rank, DROP COLUMN deleted_at;
UPDATE subscriptions SET inv_event_rank = 1 WHERE inv_event_rank = 2;
ALTER TABLE subscriptions
  DROP COLUMN payment_hold_invoice_created,
  DROP COLUMN payment_hold_kind,
  DROP COLUMN payment_hold_billing_reason,
  DROP COLUMN status_other_at,
  DROP COLUMN pause_collection_behavior,
  DROP COLUMN pause_collection_resumes_at;
