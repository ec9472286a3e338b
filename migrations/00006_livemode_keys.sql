-- +goose Up
-- Test and live are separate worlds: every row of Stripe state says its mode, and the keys that
-- join or reference such rows include it, so that no read, lock or join can reach a row of the
-- other mode by id alone. Stripe ids themselves stay the primary keys (an id belongs to one mode
-- at Stripe); the code compares the stored mode with the event's and refuses a mismatch.

-- A customer is referenced with its mode.
ALTER TABLE customers ADD CONSTRAINT customers_stripe_customer_mode_key UNIQUE (stripe_customer_id, livemode);

-- Subscriptions join their customer on (stripe_customer_id, livemode).
DROP INDEX subscriptions_customer_idx;
CREATE INDEX subscriptions_customer_idx ON subscriptions (stripe_customer_id, livemode);

-- A refund carries the mode of its charge, and the foreign key makes them agree.
ALTER TABLE charges ADD CONSTRAINT charges_order_mode_key UNIQUE (order_id, livemode);
ALTER TABLE refunds ADD COLUMN livemode boolean;
UPDATE refunds r SET livemode = c.livemode FROM charges c WHERE c.order_id = r.order_id;
ALTER TABLE refunds ALTER COLUMN livemode SET NOT NULL;
ALTER TABLE refunds DROP CONSTRAINT refunds_order_id_fkey;
ALTER TABLE refunds ADD CONSTRAINT refunds_charge_mode_fkey FOREIGN KEY (order_id, livemode) REFERENCES charges (order_id, livemode);

-- Notices look their recipient up by customer and mode.
CREATE INDEX notices_customer_idx ON notices (stripe_customer_id, livemode);

-- +goose Down
DROP INDEX notices_customer_idx;
ALTER TABLE refunds DROP CONSTRAINT refunds_charge_mode_fkey;
ALTER TABLE refunds ADD CONSTRAINT refunds_order_id_fkey FOREIGN KEY (order_id) REFERENCES charges (order_id);
ALTER TABLE refunds DROP COLUMN livemode;
ALTER TABLE charges DROP CONSTRAINT charges_order_mode_key;
DROP INDEX subscriptions_customer_idx;
CREATE INDEX subscriptions_customer_idx ON subscriptions (stripe_customer_id);
ALTER TABLE customers DROP CONSTRAINT customers_stripe_customer_mode_key;
