-- Parking and attempt history (docs/operations.md).
--
-- state 5, parked: out of attempts or out of its retry window, waiting for a
-- person. SQLite cannot change a CHECK constraint in place, so the records
-- table is rebuilt with the wider one (the whole migration is one
-- transaction on SQLite: all or nothing) and gains attempts_before_requeue:
-- the attempts made before the last requeue, which do not count against the
-- attempt cap any more; handler and handler_version: the registered handler
-- that can finish the request without its client (NULL: only its client can);
-- next_attempt_us: when the completer may try it next (NULL: never);
-- retention_us: the request's own retention, for a completer that finishes it.
CREATE TABLE orpheus_records_v3 (
  scope                   TEXT    NOT NULL,
  idem_key                TEXT    NOT NULL,
  fingerprint             TEXT    NOT NULL,
  state                   INTEGER NOT NULL CHECK (state BETWEEN 1 AND 5),
  attempts                INTEGER NOT NULL,
  lease_owner             TEXT,
  lease_expires_us        INTEGER,
  pre_state               TEXT,
  recovery_point          TEXT,
  status                  INTEGER,
  headers                 TEXT,
  body                    BLOB,
  last_error              TEXT,
  created_us              INTEGER NOT NULL,
  updated_us              INTEGER NOT NULL,
  retry_until_us          INTEGER NOT NULL,
  expires_us              INTEGER,
  attempts_before_requeue INTEGER NOT NULL DEFAULT 0,
  handler                 TEXT,
  handler_version         INTEGER,
  next_attempt_us         INTEGER,
  retention_us            INTEGER,
  PRIMARY KEY (scope, idem_key)
);
INSERT INTO orpheus_records_v3 (scope, idem_key, fingerprint, state, attempts, lease_owner,
  lease_expires_us, pre_state, recovery_point, status, headers, body, last_error, created_us,
  updated_us, retry_until_us, expires_us)
  SELECT scope, idem_key, fingerprint, state, attempts, lease_owner, lease_expires_us, pre_state,
    recovery_point, status, headers, body, last_error, created_us, updated_us, retry_until_us,
    expires_us FROM orpheus_records;
DROP TABLE orpheus_records;
ALTER TABLE orpheus_records_v3 RENAME TO orpheus_records;
CREATE INDEX orpheus_records_expiry ON orpheus_records (state, expires_us);
CREATE INDEX orpheus_records_expires_us ON orpheus_records (expires_us);
CREATE INDEX orpheus_records_next_attempt ON orpheus_records (next_attempt_us);
-- One row per attempt that did not finish its record (a retryable outcome, an
-- outcome in doubt, a lease that expired under it), and per parking, requeue
-- and resolution. The attempt that finishes a record is the record itself
-- (attempts, state, updated_us). Deleted with its record by the purge.
CREATE TABLE orpheus_attempts (
  id       INTEGER PRIMARY KEY,
  scope    TEXT    NOT NULL,
  idem_key TEXT    NOT NULL,
  attempt  INTEGER NOT NULL,
  at_us    INTEGER NOT NULL,
  outcome  TEXT    NOT NULL,
  runner   TEXT    NOT NULL,
  step     TEXT,
  error    TEXT
);
CREATE INDEX orpheus_attempts_key ON orpheus_attempts (scope, idem_key, id);
