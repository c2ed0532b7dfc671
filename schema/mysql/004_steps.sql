-- Multi-step requests (docs/steps.md): `steps` holds a request's recovery
-- point (its steps, the pivot, the finished steps' results), which does not
-- fit in the 255 bytes of the unused `recovery_point` column. A new column
-- instead of widening that one: ADD COLUMN is instant on MariaDB 10.3+ (no
-- table copy, on a table of any size), where MODIFY would copy the table.
-- One statement: all of it or nothing.
ALTER TABLE orpheus_records ADD COLUMN steps MEDIUMBLOB NULL;
