-- Records that never finish (abandoned in progress or retryable) expire too:
-- insert sets expires_us to the end of the retry window plus the retention,
-- and purge deletes by expires_us in any state (never under a live lease), so
-- it wants an index on expires_us alone; (state, expires_us) served only the
-- old terminal-only purge. Records written before this version have no
-- expires_us until they finish.
--
-- One change per statement: MySQL commits each, and a run stopped part way
-- goes on past a statement whose work it finds done (store::migrate(),
-- store_backend::already_applied()); a statement of two changes could be
-- half done for another reason and be passed over whole.
ALTER TABLE orpheus_records DROP INDEX orpheus_records_expiry;
ALTER TABLE orpheus_records ADD INDEX orpheus_records_expires_us (expires_us);
