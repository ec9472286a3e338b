-- +goose Up
-- A stored event's payload (3.5 KB of JSON, over the TOAST threshold) is compressed on every
-- insert; lz4 does it for a fraction of the CPU of pglz, the default, on the path of every
-- webhook. A server built without lz4 keeps pglz: the statement is skipped, not failed.
-- +goose StatementBegin
DO $$
BEGIN
  ALTER TABLE webhook_events ALTER COLUMN payload SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported THEN
  RAISE NOTICE 'lz4 is not available in this server: webhook_events.payload keeps pglz';
END $$;
-- +goose StatementEnd

-- +goose Down
ALTER TABLE webhook_events ALTER COLUMN payload SET COMPRESSION pglz;
