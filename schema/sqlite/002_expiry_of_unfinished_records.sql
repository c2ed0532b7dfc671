-- Records that never finish (abandoned in progress or retryable) expire too:
-- insert sets expires_us to the end of the retry window plus the retention,
-- and purge deletes by expires_us in any state, so it needs this index.
-- Records written before this version have no expires_us until they finish.
CREATE INDEX orpheus_records_expires_us ON orpheus_records (expires_us);
