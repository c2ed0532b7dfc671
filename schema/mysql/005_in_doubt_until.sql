-- in_doubt_until_us: until when a call downstream whose outcome was unknown
-- (an attempt held in doubt) may still land, database clock, microseconds;
-- NULL when no attempt of the record was in doubt. Nobody parks, resolves or
-- cancels the record before it (docs/state-machine.md): a person who checks
-- downstream sooner could miss a charge that lands later. It outlives the
-- attempt (a later attempt that fails safely does not end it) and is set
-- for records without a handler too, where next_attempt_us stays NULL.
-- ADD COLUMN is instant on MariaDB 10.3+. One statement: all of it or nothing.
ALTER TABLE orpheus_records ADD COLUMN in_doubt_until_us BIGINT NULL;
