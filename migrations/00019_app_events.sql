-- +goose Up
-- App events: the news the app is told (pushed to app_events.url, listed by GET /v1/app-events).
-- An event is written in the transaction of the change it reports (appevents.Tell).

-- One row per user of a mode: the lock that orders the user's events, and their push.
CREATE TABLE app_event_users (
  user_id text NOT NULL,
  livemode boolean NOT NULL,
  -- The sequence of the user's last event (1, 2, 3, … without gaps).
  last_sequence bigint NOT NULL DEFAULT 0,
  -- When time alone changes the user's entitlement answer (a period or grace ends with no
  -- renewal, a trial ends): the sweeper tells it then. NULL: nothing pending.
  next_change_at timestamptz,
  -- When the user's head is due to be pushed (NULL: nothing pending). Set by the writer of a
  -- pending event, moved by each push to the next head's time or to the retry.
  push_due_at timestamptz,
  -- Bumped by whatever makes an event pending (a new event, a redelivery), under this row's
  -- lock: a push clears push_due_at only while the wakes it read with "nothing pending" hold.
  wakes bigint NOT NULL DEFAULT 0,
  -- Until when one process holds the user's push (replicas never push one user at once).
  push_lease_until timestamptz,
  push_lease_owner bigint,
  PRIMARY KEY (user_id, livemode)
);
CREATE INDEX app_event_users_next_change_idx ON app_event_users (next_change_at) WHERE next_change_at IS NOT NULL;
CREATE INDEX app_event_users_push_due_idx ON app_event_users (livemode, push_due_at) WHERE push_due_at IS NOT NULL;

-- The answer last told about each subject of a user: "entitlement", "charge:ORDER",
-- "usage:USAGE". A change is an answer that differs from it.
CREATE TABLE app_event_answers (
  user_id text NOT NULL,
  livemode boolean NOT NULL,
  subject text NOT NULL,
  answer jsonb NOT NULL,
  PRIMARY KEY (user_id, livemode, subject)
);

CREATE TABLE app_events (
  id text PRIMARY KEY,
  -- Write order: within a user, the order of sequence (both are taken under the user's lock).
  n bigserial UNIQUE,
  -- The event's place in the feed, given once its transaction is visible (appevents.Feed): the
  -- feed pages by it, so an event that commits late is placed late instead of being skipped.
  feed_pos bigint,
  user_id text NOT NULL,
  livemode boolean NOT NULL,
  sequence bigint NOT NULL,
  type text NOT NULL,
  subject text NOT NULL,
  created_at timestamptz NOT NULL,
  data jsonb NOT NULL,
  status text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'failed')),
  attempts integer NOT NULL DEFAULT 0,
  first_attempt_at timestamptz,
  last_attempt_at timestamptz,
  next_at timestamptz,
  last_error text,
  delivered_at timestamptz,
  failed_at timestamptz,
  UNIQUE (user_id, livemode, sequence),
  UNIQUE (livemode, feed_pos)
);
-- No index names a push column: recording an attempt is a HOT update of the row.
ALTER TABLE app_events SET (fillfactor = 80);
CREATE INDEX app_events_unplaced_idx ON app_events (livemode, n) WHERE feed_pos IS NULL;

-- The events waiting for their push, per user in sequence order: a row from the event's write
-- until it is delivered or given up (a redelivery adds it again). Narrow and with one index, so
-- that the push's writes cost little beside the event's own.
CREATE TABLE app_event_queue (
  livemode boolean NOT NULL,
  user_id text NOT NULL,
  sequence bigint NOT NULL,
  id text NOT NULL,
  created_at timestamptz NOT NULL,
  PRIMARY KEY (livemode, user_id, sequence)
);

-- The feed's last position given, per mode: its row lock serializes the placing.
CREATE TABLE app_event_feed (
  livemode boolean PRIMARY KEY,
  last_pos bigint NOT NULL DEFAULT 0
);
INSERT INTO app_event_feed (livemode) VALUES (false), (true);

-- +goose Down
DROP TABLE app_event_feed;
DROP TABLE app_event_queue;
DROP TABLE app_events;
DROP TABLE app_event_answers;
DROP TABLE app_event_users;
