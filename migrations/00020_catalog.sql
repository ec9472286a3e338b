-- +goose Up
-- What the app sells: Stripe's products, their prices and the features each product grants, kept
-- per mode from product.* and price.* events and from reads (billing reconcile, the features
-- read after a product event), so that GET /v1/prices answers without calling Stripe.
--
-- Each row's Stripe fields are one group with an ordering guard, like a subscription's: a write
-- replaces them only when its key (created, rank, source id) is above the stored one, so an older
-- event after a newer one changes nothing. A deleted object stays, inactive, with deleted = true.

CREATE TABLE catalog_products (
  product_id text NOT NULL,
  livemode boolean NOT NULL,
  name text NOT NULL DEFAULT '',
  description text,
  active boolean NOT NULL,
  deleted boolean NOT NULL DEFAULT false,
  -- The lookup keys of the features the product grants (Stripe's product features), sorted.
  features text[] NOT NULL DEFAULT '{}',
  -- When the features were read from Stripe (NULL: never read); a read replaces them only when
  -- it began after the stored one.
  features_read_at timestamptz,
  stripe_created timestamptz,
  event_id text NOT NULL,
  event_created timestamptz NOT NULL,
  event_rank integer NOT NULL,
  updated_at timestamptz NOT NULL,
  PRIMARY KEY (product_id, livemode)
);

CREATE TABLE catalog_prices (
  price_id text NOT NULL,
  livemode boolean NOT NULL,
  product_id text NOT NULL,
  lookup_key text,
  nickname text,
  currency text NOT NULL,
  unit_amount bigint,
  billing_scheme text NOT NULL,
  tiers_mode text,
  -- The tiers as Stripe gives them ([{"up_to", "unit_amount", "flat_amount"}]); NULL when per unit.
  tiers jsonb,
  recurring_interval text,
  recurring_interval_count integer,
  recurring_usage_type text,
  recurring_meter text,
  active boolean NOT NULL,
  deleted boolean NOT NULL DEFAULT false,
  stripe_created timestamptz,
  event_id text NOT NULL,
  event_created timestamptz NOT NULL,
  event_rank integer NOT NULL,
  updated_at timestamptz NOT NULL,
  PRIMARY KEY (price_id, livemode)
);
-- The pricing page lists a mode's prices by product; Checkout and change resolve a lookup key.
CREATE INDEX catalog_prices_product_idx ON catalog_prices (livemode, product_id);
CREATE INDEX catalog_prices_lookup_key_idx ON catalog_prices (livemode, lookup_key) WHERE lookup_key IS NOT NULL;

-- A mode's catalog version, bumped in the transaction of every write that changed the catalog:
-- GET /v1/prices answers from a copy in memory while the version it was made at is current, so a
-- pricing page on every request costs one primary-key read.
CREATE TABLE catalog_versions (
  livemode boolean PRIMARY KEY,
  version bigint NOT NULL
);

-- Checkout's promotion codes and tax, kept with the session's request so that a repeat of the
-- request is compared with what was asked (the idempotency fingerprint).
ALTER TABLE checkout_sessions ADD COLUMN promotion_code text;
ALTER TABLE checkout_sessions ADD COLUMN promotion_code_id text;
ALTER TABLE checkout_sessions ADD COLUMN allow_promotion_codes boolean NOT NULL DEFAULT false;
ALTER TABLE checkout_sessions ADD COLUMN automatic_tax boolean NOT NULL DEFAULT false;

-- +goose Down
ALTER TABLE checkout_sessions DROP COLUMN automatic_tax;
ALTER TABLE checkout_sessions DROP COLUMN allow_promotion_codes;
ALTER TABLE checkout_sessions DROP COLUMN promotion_code_id;
ALTER TABLE checkout_sessions DROP COLUMN promotion_code;
DROP TABLE catalog_versions;
DROP TABLE catalog_prices;
DROP TABLE catalog_products;
