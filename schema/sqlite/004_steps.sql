-- Multi-step requests (docs/steps.md): `steps` holds a request's recovery
-- point (its steps, the pivot, the finished steps' results). The unused
-- `recovery_point` column stays, as on MySQL, so both schemas have the same
-- columns.
ALTER TABLE orpheus_records ADD COLUMN steps TEXT;
