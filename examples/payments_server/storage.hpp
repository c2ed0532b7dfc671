// The payments server's database: the --store flags, opening the store they
// name, and the schema (the library's records and the payments table) on
// each shard, at start or, for a shard that is down then, when it is back.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "orpheus/store.hpp"

namespace examples::payments_server {

/// The --store flags, one entry per shard (orpheus::split_store_list(), which
/// throws config_error on a bad list); sqlite:payments.db when none is given.
[[nodiscard]] std::vector<std::string> store_parts(const std::vector<std::string>& specs);

/// Whether the parts name one SQLite file (rather than MySQL shards).
[[nodiscard]] bool is_sqlite(const std::vector<std::string>& parts);

/// The store the parts name: sqlite_store, or mysql_store over every shard.
/// Built without MySQL (PAYMENTS_SERVER_WITH_MYSQL=0), anything but one
/// sqlite:PATH throws std::runtime_error saying so.
[[nodiscard]] std::unique_ptr<orpheus::store> open_store(const std::vector<std::string>& parts);

/// How many file descriptors the store open_store() makes may hold at once:
/// on SQLite the file, its WAL and its shared memory for each of its
/// connections (the readers and the writer); on MariaDB the two pools of
/// each shard.
[[nodiscard]] long store_descriptors(const std::vector<std::string>& parts);

/// Prepares one shard: creates the payments table if it is not there, then
/// applies the library's migrations. In that order: the library refuses a
/// shard's requests until it is migrated (store::backend_for_records()), so
/// a request that gets through finds the table too.
void prepare_shard(orpheus::store& store, std::size_t shard);

/// Prepares every shard that answers and returns those that did not (a
/// retryable failure: the server is down or not ready), for late_shards to
/// finish while the others serve. Throws what a failure retrying will not fix
/// throws (a wrong password, a bad schema), and any failure of a SQLite
/// store (one local file: nothing to serve without it).
[[nodiscard]] std::vector<std::size_t> prepare_shards(orpheus::store& store, bool sqlite);

/// Prepares, in a thread of its own, the shards that did not answer at start:
/// tries each one every `every` until it is done. Meanwhile requests whose
/// key lives there are refused as retryable (503): a shard down at start
/// costs its share of the keys, not the whole service. Each failure is
/// logged on stderr once per distinct message. The destructor stops it.
class late_shards {
 public:
  late_shards(orpheus::store& store, std::vector<std::size_t> shards,
              std::chrono::milliseconds every);
  late_shards(const late_shards&) = delete;
  late_shards& operator=(const late_shards&) = delete;
  ~late_shards();

 private:
  void run(const std::stop_token& stop);

  orpheus::store& store_;
  std::vector<std::size_t> shards_;
  std::chrono::milliseconds every_;
  std::mutex mutex_;
  std::condition_variable_any wake_;
  std::jthread thread_;  // last: started once the members it uses exist
};

}  // namespace examples::payments_server
