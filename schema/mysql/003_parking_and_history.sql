-- Parking and attempt history (docs/operations.md).
--
-- state 5, parked: out of attempts or out of its retry window, waiting for a
-- person (state is a TINYINT with no CHECK here: nothing to widen).
-- attempts_before_requeue: the attempts made before the last requeue, which
-- do not count against the attempt cap any more.
--
-- MySQL commits each DDL statement on its own. The table comes first and is
-- created only if missing; the ALTER is last, and the version row is written
-- right after it. A run stopped between the ALTER and that row leaves the
-- column in place, and the next run fails on it ("Duplicate column name"):
-- then DROP the column by hand and migrate again.
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
