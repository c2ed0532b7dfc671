-- The shard map this database belongs to: it is shard shard_index of
-- shard_count (a SQLite store has one shard: 0 of 1). The same table as on
-- MySQL (docs/sharding.md).
CREATE TABLE IF NOT EXISTS orpheus_shard_map (
  id          INTEGER NOT NULL PRIMARY KEY CHECK (id = 1),
  shard_index INTEGER NOT NULL,
  shard_count INTEGER NOT NULL,
  set_us      INTEGER NOT NULL
);
