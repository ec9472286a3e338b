-- +goose NO TRANSACTION
-- +goose Up
-- The renewal's re-read is planned in the subscription's row: renewal_reread_due is the renewal
-- the subscription waits for, set by the UPDATE of every event, and a periodic sweep queues its
-- River job once the check is due and marks it queued (renewal_reread_queued, made false again
-- when an event moves the renewal). Before, every event that moved a renewal inserted a River
-- job for the future (a row and the indexes of river_job): a third of the database's work on a
-- burst of new subscriptions, for jobs that mostly find their renewal confirmed by an event and
-- do nothing. Jobs queued before this migration still run as they are.
ALTER TABLE subscriptions ADD COLUMN IF NOT EXISTS renewal_reread_due timestamptz;
ALTER TABLE subscriptions ADD COLUMN IF NOT EXISTS renewal_reread_queued boolean NOT NULL DEFAULT false;
-- The sweep's queue: only the re-reads still to queue. CONCURRENTLY: subscriptions are written by
-- every event, and a plain build would block them.
CREATE INDEX CONCURRENTLY IF NOT EXISTS subscriptions_renewal_reread_idx ON subscriptions (renewal_reread_due)
  WHERE renewal_reread_due IS NOT NULL AND NOT renewal_reread_queued;

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS subscriptions_renewal_reread_idx;
ALTER TABLE subscriptions DROP COLUMN IF EXISTS renewal_reread_queued;
ALTER TABLE subscriptions DROP COLUMN IF EXISTS renewal_reread_due;
