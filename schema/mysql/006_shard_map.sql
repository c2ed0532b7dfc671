-- The shard map this database belongs to: it is shard shard_index of
-- shard_count. migrate() writes the row of the map it was given and refuses
-- a different one; the record statements of a store whose map says
-- otherwise are refused (retryable) before they reach the records. Two
-- processes that route a key to different shards would each run a retry of
-- it as a new request (docs/sharding.md). One row, id 1; set_us is the
-- database clock when it was written, microseconds. IF NOT EXISTS: MySQL
-- commits DDL by itself, so a run stopped before this file's version row
-- runs it again.
CREATE TABLE IF NOT EXISTS orpheus_shard_map (
  id          INT    NOT NULL PRIMARY KEY CHECK (id = 1),
  shard_index BIGINT NOT NULL,
  shard_count BIGINT NOT NULL,
  set_us      BIGINT NOT NULL
) ENGINE=InnoDB;
