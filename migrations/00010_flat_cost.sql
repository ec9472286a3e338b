-- +goose Up
-- Reads whose cost must not grow with the stored history (a million events, a hundred thousand
-- subscriptions). Plain CREATE INDEX, in the migration's transaction: receipt waits while they
-- build (about a minute at a million events). CONCURRENTLY would not wait for receipt, but it
-- waits for every older snapshot, among them a replica's blocked pg_advisory_lock of the
-- migration lock, which waits for this migration: replicas starting together would hang.

-- The event log's search and the subscription page find the events naming an object (its id, or
-- the object's subscription or customer). One GIN index over the three ids: one expression per
-- written row instead of three B-trees, each of which would detoast the payload again.
CREATE INDEX webhook_events_object_ids_idx ON webhook_events USING gin
  ((ARRAY[payload->'data'->'object'->>'id', payload->'data'->'object'->>'subscription', payload->'data'->'object'->>'customer']));
-- Without statistics on the expression the planner assumes that 0.5% of the rows match and walks
-- the received_at index through every payload for a page of 50; with them it takes the index.
CREATE STATISTICS webhook_events_object_ids_stats
  ON (ARRAY[payload->'data'->'object'->>'id', payload->'data'->'object'->>'subscription', payload->'data'->'object'->>'customer'])
  FROM webhook_events;

-- The log filtered by a rare type otherwise reads the whole table.
CREATE INDEX webhook_events_type_received_idx ON webhook_events (type, received_at DESC);

-- The newest dead letters, without joining all of them first.
CREATE INDEX webhook_dead_letters_dead_at_idx ON webhook_dead_letters (dead_at DESC, event_id DESC);

-- The subscription page's invoices.
CREATE INDEX invoices_subscription_created_idx ON invoices (subscription_id, livemode, created DESC, invoice_id DESC);

-- +goose Down
DROP INDEX invoices_subscription_created_idx;
DROP INDEX webhook_dead_letters_dead_at_idx;
DROP INDEX webhook_events_type_received_idx;
DROP STATISTICS webhook_events_object_ids_stats;
DROP INDEX webhook_events_object_ids_idx;
