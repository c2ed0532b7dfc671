-- One row per (scope, idempotency key). Times are microseconds since the Unix
-- epoch on the database's clock. state: 1 in_progress, 2 retryable,
-- 3 succeeded, 4 failed (see docs/state-machine.md).
CREATE TABLE orpheus_records (
  scope            TEXT    NOT NULL,
  idem_key         TEXT    NOT NULL,
  fingerprint      TEXT    NOT NULL,
  state            INTEGER NOT NULL CHECK (state BETWEEN 1 AND 4),
  attempts         INTEGER NOT NULL,
  lease_owner      TEXT,
  lease_expires_us INTEGER,
  pre_state        TEXT,
  recovery_point   TEXT,
  status           INTEGER,
  headers          TEXT,
  body             BLOB,
  last_error       TEXT,
  created_us       INTEGER NOT NULL,
  updated_us       INTEGER NOT NULL,
  retry_until_us   INTEGER NOT NULL,
  expires_us       INTEGER,
  PRIMARY KEY (scope, idem_key)
);
CREATE INDEX orpheus_records_expiry ON orpheus_records (state, expires_us);
