-- +goose NO TRANSACTION
-- +goose Up
-- A notice is its own queue entry: the row carries what the mail says (content, as of the event)
-- and when it is next due (next_attempt_at), and a loop in every replica sends the due rows,
-- instead of a River job per notice. One row per notice instead of a row, a River job and the
-- job's fetch and completion: the notice was a third of the database's work on a burst of
-- failed payments. Rows written before this migration keep next_attempt_at NULL: their River
-- jobs, already queued, still send them, and the loop never takes them.
ALTER TABLE notices ADD COLUMN IF NOT EXISTS content jsonb;
ALTER TABLE notices ADD COLUMN IF NOT EXISTS next_attempt_at timestamptz;
ALTER TABLE notices ADD COLUMN IF NOT EXISTS attempts integer NOT NULL DEFAULT 0;
ALTER TABLE notices ADD COLUMN IF NOT EXISTS last_error text;
-- The loop's queue: only the notices still to send, so it stays as small as the backlog.
-- CONCURRENTLY, as in 00016: notices may be big, and a plain build would block the events
-- that write them.
CREATE INDEX CONCURRENTLY IF NOT EXISTS notices_due_idx ON notices (next_attempt_at)
  WHERE delivery IS NULL AND next_attempt_at IS NOT NULL;

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS notices_due_idx;
ALTER TABLE notices DROP COLUMN IF EXISTS last_error;
ALTER TABLE notices DROP COLUMN IF EXISTS attempts;
ALTER TABLE notices DROP COLUMN IF EXISTS next_attempt_at;
ALTER TABLE notices DROP COLUMN IF EXISTS content;
