// The embedded default store: one SQLite file in WAL mode.
//
//   orpheus::sqlite_store store({.path = "orpheus.db"});
//   store.migrate();
//   orpheus::manager m(store, cfg);
//
// For development, tests, single-node deployments and the demo. Durability:
// synchronous=FULL, so a committed record survives a crash of the process
// and of the machine. Writers are serialised by SQLite (BEGIN IMMEDIATE);
// readers run beside them. Timestamps come from SQLite's clock, which here is
// the host's clock: with one file there is only one host.
//
// Errors: SQLITE_BUSY/LOCKED (another writer past busy_timeout), I/O errors
// and a full disk are retryable storage_errors; SQL errors (bad statement,
// missing table) are not. A failed COMMIT is reported in doubt.
//
// Thread safety: the store is shared by all threads; it pools connections.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "orpheus/store.hpp"

namespace orpheus {

struct sqlite_options {
  std::string path;  ///< the database file; created if missing
  /// How long a writer waits for another writer before SQLITE_BUSY.
  std::chrono::milliseconds busy_timeout = std::chrono::milliseconds(5000);
  /// Connections kept open (callers beyond this wait for one).
  std::size_t max_connections = 16;
};

class sqlite_store final : public store {
 public:
  /// Opens (or creates) the file. Throws config_error when the path is empty
  /// or max_connections is 0, storage_error when the file cannot be opened.
  explicit sqlite_store(sqlite_options options);
  ~sqlite_store() override;

  [[nodiscard]] std::size_t shard_count() const override { return 1; }
  [[nodiscard]] std::size_t shard_of(const request_id&) const override { return 0; }
  std::optional<record> read(const request_id& id) override;
  std::optional<record> inspect(const request_id& id) override;
  std::unique_ptr<store_tx> begin(const request_id& id) override;
  std::unique_ptr<store_tx> begin_on_shard(std::size_t shard) override;
  std::size_t purge_expired(std::size_t shard, std::size_t limit) override;
  void migrate() override;
  int schema_version(std::size_t shard) override;

  struct impl;

 private:
  std::unique_ptr<impl> impl_;
};

}  // namespace orpheus
