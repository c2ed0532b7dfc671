-- One row per (scope, idempotency key). Times are microseconds since the Unix
-- epoch on the database's clock. state: 1 in_progress, 2 retryable,
-- 3 succeeded, 4 failed (see docs/state-machine.md). Keys and scopes are
-- compared byte for byte (VARBINARY): "Key" and "key" are two keys.
CREATE TABLE orpheus_records (
  scope            VARBINARY(255) NOT NULL,
  idem_key         VARBINARY(255) NOT NULL,
  fingerprint      CHAR(64) CHARACTER SET ascii NOT NULL,
  state            TINYINT  NOT NULL,
  attempts         INT      NOT NULL,
  lease_owner      CHAR(32) CHARACTER SET ascii NULL,
  lease_expires_us BIGINT   NULL,
  pre_state        MEDIUMBLOB NULL,
  recovery_point   VARBINARY(255) NULL,
  status           SMALLINT NULL,
  headers          MEDIUMBLOB NULL,
  body             MEDIUMBLOB NULL,
  last_error       BLOB     NULL,
  created_us       BIGINT   NOT NULL,
  updated_us       BIGINT   NOT NULL,
  retry_until_us   BIGINT   NOT NULL,
  expires_us       BIGINT   NULL,
  PRIMARY KEY (scope, idem_key),
  KEY orpheus_records_expiry (state, expires_us)
) ENGINE=InnoDB ROW_FORMAT=DYNAMIC;
