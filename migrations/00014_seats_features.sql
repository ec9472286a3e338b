-- +goose Up
-- What the user may do, not only whether: the seats of a subscription and the features of a
-- customer (Stripe Entitlements).

-- Snapshot group: the quantity of the subscription's licensed item (its seats), written by the
-- customer.subscription.* events and snapshots like the other columns of the group. NULL until
-- an event or a snapshot brings it (rows from before this migration: the next reconcile fills it).
ALTER TABLE subscriptions ADD COLUMN quantity bigint;

-- A customer's active entitlements (the lookup keys of the features Stripe grants it), one row per
-- Stripe customer and mode, replaced whole by each entitlements.active_entitlement_summary.updated
-- and by each read of GET /v1/entitlements/active_entitlements (the job that reads every page
-- when the event's list has more, and reconcile). Keyed by the Stripe customer, like
-- subscriptions: rows of customers not linked yet join customers at read time.
--
-- Ordering: one group with its own guard, like the subscription groups. An event applies when its
-- key (event created, rank 0, event id) is above the stored one; a read applies when nothing newer
-- than its fetch second is stored (a read is fresher than every event of its second or before).
CREATE TABLE customer_features (
  stripe_customer_id text NOT NULL,
  livemode boolean NOT NULL,
  -- Sorted byte-wise, no duplicates.
  lookup_keys text[] NOT NULL DEFAULT '{}',
  -- false while an event's list had more than it carried and the read of every page is pending:
  -- the list then keeps what was granted before as well, so that no feature flickers off.
  complete boolean NOT NULL DEFAULT true,
  feat_event_id text NOT NULL,
  feat_event_type text NOT NULL,
  feat_event_created timestamptz NOT NULL,
  feat_event_rank integer NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (stripe_customer_id, livemode)
);

-- +goose Down
DROP TABLE customer_features;
ALTER TABLE subscriptions DROP COLUMN quantity;
