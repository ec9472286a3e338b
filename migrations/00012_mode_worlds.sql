-- +goose Up
-- Test and live are separate worlds: every Stripe id and every link of a user is keyed with its
-- mode (00006 only compared modes, and kept the ids alone as keys), so an event signed with one mode's secret can create or change rows of its own world only,
-- and never squats, blocks or answers for an id of the other.

-- A user may be linked in both worlds (a test deployment and a live one on one database, or a
-- test-mode event naming a live user): one row per mode.
ALTER TABLE customers DROP CONSTRAINT customers_pkey;
ALTER TABLE customers ADD PRIMARY KEY (user_id, livemode);
-- (stripe_customer_id, livemode) is unique already; the id alone no longer is.
ALTER TABLE customers DROP CONSTRAINT customers_stripe_customer_id_key;

ALTER TABLE subscriptions DROP CONSTRAINT subscriptions_pkey;
ALTER TABLE subscriptions ADD PRIMARY KEY (subscription_id, livemode);

ALTER TABLE invoices DROP CONSTRAINT invoices_pkey;
ALTER TABLE invoices ADD PRIMARY KEY (invoice_id, livemode);

ALTER TABLE checkout_sessions DROP CONSTRAINT checkout_sessions_session_id_key;
ALTER TABLE checkout_sessions ADD CONSTRAINT checkout_sessions_session_mode_key UNIQUE (session_id, livemode);

-- Event ids per mode: a test-signed event can no longer make a live event with its id a duplicate.
ALTER TABLE webhook_dead_letters ADD COLUMN livemode boolean;
UPDATE webhook_dead_letters d SET livemode = e.livemode FROM webhook_events e WHERE e.event_id = d.event_id;
ALTER TABLE webhook_dead_letters ALTER COLUMN livemode SET NOT NULL;
ALTER TABLE webhook_dead_letters DROP CONSTRAINT webhook_dead_letters_event_id_fkey;
ALTER TABLE webhook_dead_letters DROP CONSTRAINT webhook_dead_letters_pkey;
ALTER TABLE webhook_events DROP CONSTRAINT webhook_events_pkey;
ALTER TABLE webhook_events ADD PRIMARY KEY (event_id, livemode);
ALTER TABLE webhook_dead_letters ADD PRIMARY KEY (event_id, livemode);
ALTER TABLE webhook_dead_letters ADD CONSTRAINT webhook_dead_letters_event_fkey
  FOREIGN KEY (event_id, livemode) REFERENCES webhook_events (event_id, livemode) ON DELETE CASCADE;

ALTER TABLE notices DROP CONSTRAINT notices_event_id_kind_key;
ALTER TABLE notices ADD CONSTRAINT notices_event_mode_kind_key UNIQUE (event_id, livemode, kind);

-- +goose Down
ALTER TABLE notices DROP CONSTRAINT notices_event_mode_kind_key;
ALTER TABLE notices ADD CONSTRAINT notices_event_id_kind_key UNIQUE (event_id, kind);

ALTER TABLE webhook_dead_letters DROP CONSTRAINT webhook_dead_letters_event_fkey;
ALTER TABLE webhook_dead_letters DROP CONSTRAINT webhook_dead_letters_pkey;
ALTER TABLE webhook_events DROP CONSTRAINT webhook_events_pkey;
ALTER TABLE webhook_events ADD PRIMARY KEY (event_id);
ALTER TABLE webhook_dead_letters ADD PRIMARY KEY (event_id);
ALTER TABLE webhook_dead_letters ADD CONSTRAINT webhook_dead_letters_event_id_fkey
  FOREIGN KEY (event_id) REFERENCES webhook_events (event_id) ON DELETE CASCADE;
ALTER TABLE webhook_dead_letters DROP COLUMN livemode;

ALTER TABLE checkout_sessions DROP CONSTRAINT checkout_sessions_session_mode_key;
ALTER TABLE checkout_sessions ADD CONSTRAINT checkout_sessions_session_id_key UNIQUE (session_id);

ALTER TABLE invoices DROP CONSTRAINT invoices_pkey;
ALTER TABLE invoices ADD PRIMARY KEY (invoice_id);

ALTER TABLE subscriptions DROP CONSTRAINT subscriptions_pkey;
ALTER TABLE subscriptions ADD PRIMARY KEY (subscription_id);

ALTER TABLE customers ADD CONSTRAINT customers_stripe_customer_id_key UNIQUE (stripe_customer_id);
ALTER TABLE customers DROP CONSTRAINT customers_pkey;
ALTER TABLE customers ADD PRIMARY KEY (user_id);
