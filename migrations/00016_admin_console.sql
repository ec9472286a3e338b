-- +goose NO TRANSACTION
-- +goose Up
-- The admin console finds people and money, and keeps who did what. Indexes CONCURRENTLY, as in
-- 00010: customers and charges may be big, and a plain build would block sign-ups and charges.

-- Every admin action (replay, replay all of a type, start a reconcile run, …), written in the
-- action's own transaction so that an action and its record commit or roll back together; a
-- refused action is recorded alone. actor is the admin token's configured name, else its
-- fingerprint (never the token); livemode is the mode of the world acted on.
CREATE TABLE IF NOT EXISTS admin_audit (
  id bigserial PRIMARY KEY,
  at timestamptz NOT NULL DEFAULT now(),
  actor text NOT NULL,
  action text NOT NULL,
  target text NOT NULL,
  livemode boolean NOT NULL,
  result text NOT NULL
);
CREATE INDEX IF NOT EXISTS admin_audit_id_idx ON admin_audit (livemode, id DESC);

-- Find by email or name: a case-insensitive prefix, per mode. text_pattern_ops compares bytes, so
-- a prefix is one index range whatever the database's collation.
DROP INDEX CONCURRENTLY IF EXISTS customers_email_prefix_idx;
CREATE INDEX CONCURRENTLY customers_email_prefix_idx ON customers (livemode, lower(email) text_pattern_ops);
DROP INDEX CONCURRENTLY IF EXISTS customers_name_prefix_idx;
CREATE INDEX CONCURRENTLY customers_name_prefix_idx ON customers (livemode, lower(name) text_pattern_ops);

-- The charges page: newest first per mode, with or without a status filter, paged by
-- (created_at, order_id).
DROP INDEX CONCURRENTLY IF EXISTS charges_mode_created_idx;
CREATE INDEX CONCURRENTLY charges_mode_created_idx ON charges (livemode, created_at DESC, order_id DESC);
DROP INDEX CONCURRENTLY IF EXISTS charges_mode_status_created_idx;
CREATE INDEX CONCURRENTLY charges_mode_status_created_idx ON charges (livemode, status, created_at DESC, order_id DESC);

-- The subscription page's charges of its customer (without it, a scan of every charge).
DROP INDEX CONCURRENTLY IF EXISTS charges_customer_created_idx;
CREATE INDEX CONCURRENTLY charges_customer_created_idx ON charges (stripe_customer_id, livemode, created_at DESC, order_id DESC);

-- Find by the app's refund id (unique per order only).
DROP INDEX CONCURRENTLY IF EXISTS refunds_refund_id_idx;
CREATE INDEX CONCURRENTLY refunds_refund_id_idx ON refunds (refund_id, livemode);

-- The customer page's notices (notices_customer_idx orders nothing).
DROP INDEX CONCURRENTLY IF EXISTS notices_customer_created_idx;
CREATE INDEX CONCURRENTLY notices_customer_created_idx ON notices (stripe_customer_id, livemode, created_at DESC, id DESC);

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS notices_customer_created_idx;
DROP INDEX CONCURRENTLY IF EXISTS refunds_refund_id_idx;
DROP INDEX CONCURRENTLY IF EXISTS charges_customer_created_idx;
DROP INDEX CONCURRENTLY IF EXISTS charges_mode_status_created_idx;
DROP INDEX CONCURRENTLY IF EXISTS charges_mode_created_idx;
DROP INDEX CONCURRENTLY IF EXISTS customers_name_prefix_idx;
DROP INDEX CONCURRENTLY IF EXISTS customers_email_prefix_idx;
DROP TABLE IF EXISTS admin_audit;
