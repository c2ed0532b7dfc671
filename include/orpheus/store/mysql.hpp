// The production store: MySQL / MariaDB through mysql-connector-c++ 1.1,
// sharded over N masters.
//
//   orpheus::mysql_options o;
//   o.shards = {orpheus::parse_mysql_url("mysql://u:p@10.0.0.1:3306/payments"),
//               orpheus::parse_mysql_url("mysql://u:p@10.0.0.2:3306/payments")};
//   orpheus::mysql_store store(o);
//   store.migrate();
//
// A key lives on shard_for(scope, key, N) (see shard_map.hpp); all its reads
// and writes go to that shard's master, never a replica or a cache. Each
// shard has a bounded connection pool with connect/read/write timeouts; a
// connection that reports a lost link is discarded (never reconnected in
// place: OPT_RECONNECT would silently continue outside the transaction), and
// idle connections are pinged before reuse after a failure or a long idle.
// Sessions run READ COMMITTED with time_zone '+00:00'.
//
// Errors (one file maps them, src/store/mysql/errors.cpp): deadlock, lock wait
// timeout, statement timeout, lost connection, too many connections, server
// shutdown or read-only are retryable; a lost connection during COMMIT is in
// doubt; SQL errors (syntax, unknown table or column, constraint violations)
// are not retryable.
//
// Thread safety: the store is shared by all threads.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "orpheus/store.hpp"

namespace orpheus {

/// The master of one shard.
struct mysql_shard {
  std::string host = "127.0.0.1";
  int port = 3306;
  std::string user;
  std::string password;
  std::string database;
};

/// Parses "mysql://user:password@host:port/database" (port optional, default
/// 3306). Throws config_error on anything else.
[[nodiscard]] mysql_shard parse_mysql_url(std::string_view url);

struct mysql_options {
  std::vector<mysql_shard> shards;
  std::chrono::seconds connect_timeout{5};
  std::chrono::seconds read_timeout{30};
  std::chrono::seconds write_timeout{30};
  /// Per shard, for transactions; as many again for fast-path reads.
  std::size_t max_connections_per_shard = 16;
  /// How long a caller waits for a free connection before a retryable error.
  std::chrono::milliseconds pool_wait{5000};
  /// Ping an idle connection before reuse when it sat idle this long.
  std::chrono::seconds ping_after_idle{30};
};

class mysql_store final : public store {
 public:
  /// Validates the options (throws config_error: no shards, empty database,
  /// bad port, zero pool size). Connects lazily: the first use of a shard
  /// opens its first connection.
  explicit mysql_store(mysql_options options);
  ~mysql_store() override;

  [[nodiscard]] std::size_t shard_count() const override;
  [[nodiscard]] std::size_t shard_of(const request_id& id) const override;
  std::optional<record> read(const request_id& id) override;
  std::optional<record> inspect(const request_id& id) override;
  std::unique_ptr<store_tx> begin(const request_id& id) override;
  std::unique_ptr<store_tx> begin_on_shard(std::size_t shard) override;
  std::size_t purge_expired(std::size_t shard, std::size_t limit) override;
  void migrate() override;
  int schema_version(std::size_t shard) override;

  struct impl;

 private:
  std::optional<record> select(const request_id& id, bool full);
  std::unique_ptr<impl> impl_;
};

}  // namespace orpheus
