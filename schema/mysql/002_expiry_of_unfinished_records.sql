-- Records that never finish (abandoned in progress or retryable) expire too:
-- insert sets expires_us to the end of the retry window plus the retention,
-- and purge deletes by expires_us in any state (never under a live lease), so
-- it wants an index on expires_us alone; (state, expires_us) served only the
-- old terminal-only purge. Records written before this version have no
-- expires_us until they finish.
ALTER TABLE orpheus_records DROP INDEX orpheus_records_expiry,
  ADD INDEX orpheus_records_expires_us (expires_us);
