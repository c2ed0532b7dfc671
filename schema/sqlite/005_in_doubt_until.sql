-- in_doubt_until_us: until when a call downstream whose outcome was unknown
-- (in doubt, or an attempt that never finished) may still land, database
-- clock, microseconds (config::in_doubt_window after it); NULL while every
-- attempt finished with a known outcome. A spent budget does not park the
-- record before it, and nobody resolves or cancels it
-- (docs/operations.md). The same column as on MySQL.
ALTER TABLE orpheus_records ADD COLUMN in_doubt_until_us INTEGER;
