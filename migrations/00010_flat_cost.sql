-- +goose NO TRANSACTION
-- +goose Up
-- Reads whose cost must not grow with the stored history (a million events, a hundred thousand
-- subscriptions). CONCURRENTLY, outside a transaction: on a big inbox the builds take a minute or
-- more, and a plain CREATE INDEX would block receipt for that long. (It waits for every older
-- snapshot, so replicas waiting for the migration lock poll for it rather than block.) Each
-- object is dropped first: a run cut short (a replica killed mid-build) leaves an invalid index
-- and no goose version, so the next run builds everything again.

-- The event log's search and the subscription page find the events naming an object (its id, or
-- the object's subscription or customer). One GIN index over the three ids: one expression per
-- written row instead of three B-trees, each of which would detoast the payload again.
DROP INDEX CONCURRENTLY IF EXISTS webhook_events_object_ids_idx;
CREATE INDEX CONCURRENTLY webhook_events_object_ids_idx ON webhook_events USING gin
  ((ARRAY[payload->'data'->'object'->>'id', payload->'data'->'object'->>'subscription', payload->'data'->'object'->>'customer']));
-- Without statistics on the expression the planner assumes that 0.5% of the rows match and walks
-- the received_at index through every payload for a page of 50; with them it takes the index.
DROP STATISTICS IF EXISTS webhook_events_object_ids_stats;
CREATE STATISTICS webhook_events_object_ids_stats
  ON (ARRAY[payload->'data'->'object'->>'id', payload->'data'->'object'->>'subscription', payload->'data'->'object'->>'customer'])
  FROM webhook_events;

-- The log filtered by a rare type otherwise reads the whole table.
DROP INDEX CONCURRENTLY IF EXISTS webhook_events_type_received_idx;
CREATE INDEX CONCURRENTLY webhook_events_type_received_idx ON webhook_events (type, received_at DESC);

-- The newest dead letters, without joining all of them first.
DROP INDEX CONCURRENTLY IF EXISTS webhook_dead_letters_dead_at_idx;
CREATE INDEX CONCURRENTLY webhook_dead_letters_dead_at_idx ON webhook_dead_letters (dead_at DESC, event_id DESC);

-- The subscription page's invoices.
DROP INDEX CONCURRENTLY IF EXISTS invoices_subscription_created_idx;
CREATE INDEX CONCURRENTLY invoices_subscription_created_idx ON invoices (subscription_id, livemode, created DESC, invoice_id DESC);

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS invoices_subscription_created_idx;
DROP INDEX CONCURRENTLY IF EXISTS webhook_dead_letters_dead_at_idx;
DROP INDEX CONCURRENTLY IF EXISTS webhook_events_type_received_idx;
DROP STATISTICS IF EXISTS webhook_events_object_ids_stats;
DROP INDEX CONCURRENTLY IF EXISTS webhook_events_object_ids_idx;
