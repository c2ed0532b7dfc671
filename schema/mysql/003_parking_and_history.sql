-- Parking and attempt history (docs/operations.md).
--
-- state 5, parked: out of attempts or out of its retry window, waiting for a
-- person (state is a TINYINT with no CHECK here: nothing to widen).
-- attempts_before_requeue: the attempts made before the last requeue, which
-- do not count against the attempt cap any more; handler and handler_version:
-- the registered handler that can finish the request without its client
-- (NULL: only its client can); next_attempt_us: when the completer may try it
-- next (NULL: never), indexed for the completer's claim; retention_us: the
-- request's own retention, for a completer that finishes it.
--
-- MySQL commits each DDL statement on its own: one change per statement, so
-- that a run stopped part way goes on past each statement whose work it
-- finds done (a duplicate column or index: store::migrate(),
-- store_backend::already_applied()), and does the rest. (It used to be one
-- ALTER; a store migrated by it has the same columns and index.)
CREATE TABLE IF NOT EXISTS orpheus_attempts (
  id       BIGINT         NOT NULL AUTO_INCREMENT,
  scope    VARBINARY(255) NOT NULL,
  idem_key VARBINARY(255) NOT NULL,
  attempt  INT            NOT NULL,
  at_us    BIGINT         NOT NULL,
  outcome  VARCHAR(16) CHARACTER SET ascii NOT NULL,
  runner   VARCHAR(16) CHARACTER SET ascii NOT NULL,
  step     VARBINARY(255) NULL,
  error    BLOB           NULL,
  PRIMARY KEY (id),
  KEY orpheus_attempts_key (scope, idem_key, id)
) ENGINE=InnoDB ROW_FORMAT=DYNAMIC;
ALTER TABLE orpheus_records ADD COLUMN attempts_before_requeue INT NOT NULL DEFAULT 0;
ALTER TABLE orpheus_records ADD COLUMN handler VARBINARY(64) NULL;
ALTER TABLE orpheus_records ADD COLUMN handler_version INT NULL;
ALTER TABLE orpheus_records ADD COLUMN next_attempt_us BIGINT NULL;
ALTER TABLE orpheus_records ADD COLUMN retention_us BIGINT NULL;
ALTER TABLE orpheus_records ADD INDEX orpheus_records_next_attempt (next_attempt_us);
