-- +goose NO TRANSACTION
-- +goose Up
-- The renewal's re-read is planned in the subscription's row: renewal_reread_due is the renewal
-- whose confirmation is pending, set by the UPDATE of the event that moves the renewal, and a
-- periodic sweep queues its River job once the check is due, then clears it. Before, every
-- event that moved a renewal inserted a River job for the future (a row and the indexes of
-- river_job): a third of the database's work on a burst of new subscriptions, for jobs that
-- mostly find their renewal confirmed by an event and do nothing. Jobs queued before this
-- migration still run as they are.
ALTER TABLE subscriptions ADD COLUMN IF NOT EXISTS renewal_reread_due timestamptz;
-- The sweep's queue: only the planned re-reads. CONCURRENTLY: subscriptions are written by
-- every event, and a plain build would block them.
CREATE INDEX CONCURRENTLY IF NOT EXISTS subscriptions_renewal_reread_idx ON subscriptions (renewal_reread_due)
  WHERE renewal_reread_due IS NOT NULL;

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS subscriptions_renewal_reread_idx;
ALTER TABLE subscriptions DROP COLUMN IF EXISTS renewal_reread_due;
