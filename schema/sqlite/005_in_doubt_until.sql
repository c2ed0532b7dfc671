-- in_doubt_until_us: until when a call downstream whose outcome was unknown
-- (an attempt held in doubt) may still land, database clock, microseconds;
-- NULL when no attempt of the record was in doubt. Nobody parks, resolves or
-- cancels the record before it (docs/state-machine.md). The same column as
-- on MySQL.
ALTER TABLE orpheus_records ADD COLUMN in_doubt_until_us INTEGER;
