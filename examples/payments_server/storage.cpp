#include "storage.hpp"

#include <iostream>
#include <stdexcept>

#include "orpheus/error.hpp"
#include "orpheus/store/list.hpp"
#include "orpheus/store/sqlite.hpp"
#if PAYMENTS_SERVER_WITH_MYSQL  // set by examples/CMakeLists.txt from ORPHEUS_WITH_MYSQL
#include "orpheus/store/mysql.hpp"
#endif

namespace examples::payments_server {

std::vector<std::string> store_parts(const std::vector<std::string>& specs) {
  auto parts = orpheus::split_store_list(specs);                // throws config_error on a bad list
  if (parts.empty()) parts.emplace_back("sqlite:payments.db");  // no --store at all
  return parts;
}

bool is_sqlite(const std::vector<std::string>& parts) {
  return parts.size() == 1 && parts[0].rfind("sqlite:", 0) == 0;
}

std::unique_ptr<orpheus::store> open_store(const std::vector<std::string>& parts) {
  if (is_sqlite(parts)) {
    return std::make_unique<orpheus::sqlite_store>(orpheus::sqlite_options{parts[0].substr(7)});
  }
#if PAYMENTS_SERVER_WITH_MYSQL
  orpheus::mysql_options o;
  for (const auto& p : parts) o.shards.push_back(orpheus::parse_mysql_url(p));
  return std::make_unique<orpheus::mysql_store>(o);
#else
  throw std::runtime_error(
      "--store: this payments_server was built without MySQL (-DORPHEUS_WITH_MYSQL=OFF); "
      "use one --store sqlite:PATH");
#endif
}

long store_descriptors(const std::vector<std::string>& parts) {
  if (is_sqlite(parts)) {
    return 3 * static_cast<long>(orpheus::sqlite_options{}.max_connections + 1);
  }
#if PAYMENTS_SERVER_WITH_MYSQL
  return 2 * static_cast<long>(orpheus::mysql_options{}.max_connections_per_shard) *
         static_cast<long>(parts.size());
#else
  return 0;  // open_store() refuses it
#endif
}

void prepare_shard(orpheus::store& store, std::size_t shard) {
  auto t = store.begin_on_shard(shard);
  t->execute(
      "CREATE TABLE IF NOT EXISTS payments (id VARCHAR(64) PRIMARY KEY, "
      "client VARCHAR(255) NOT NULL, amount BIGINT NOT NULL, currency CHAR(3) NOT NULL, "
      "customer VARCHAR(64) NOT NULL, state VARCHAR(32) NOT NULL, charge_id VARCHAR(64))");
  t->commit();
  store.migrate_shard(shard);
}

std::vector<std::size_t> prepare_shards(orpheus::store& store, bool sqlite) {
  std::vector<std::size_t> late;
  for (std::size_t s = 0; s < store.shard_count(); ++s) {
    try {
      prepare_shard(store, s);
    } catch (const orpheus::error& e) {
      if (sqlite || !e.retryable()) throw;
      std::cerr << "store: shard " << s << " is not ready (" << e.what()
                << "): serving the other shards, and preparing this one when it answers"
                << std::endl;
      late.push_back(s);
    }
  }
  return late;
}

late_shards::late_shards(orpheus::store& store, std::vector<std::size_t> shards,
                         std::chrono::milliseconds every)
    : store_(store), shards_(std::move(shards)), every_(every) {
  if (!shards_.empty()) thread_ = std::jthread([this](const std::stop_token& stop) { run(stop); });
}

late_shards::~late_shards() {
  if (thread_.joinable()) {
    thread_.request_stop();  // wakes wait_for below
    thread_.join();
  }
}

void late_shards::run(const std::stop_token& stop) {
  struct pending {
    std::size_t shard;
    std::string last_error;  // logged once per distinct message
  };
  std::vector<pending> left;
  for (const std::size_t s : shards_) left.push_back({s, {}});
  while (!left.empty()) {
    {
      std::unique_lock lock(mutex_);
      (void)wake_.wait_for(lock, stop, every_, [] { return false; });  // a sleep stop ends
    }
    if (stop.stop_requested()) return;
    std::erase_if(left, [&](pending& p) {
      if (stop.stop_requested()) return false;
      try {
        prepare_shard(store_, p.shard);
        std::cerr << "store: shard " << p.shard << " is ready" << std::endl;
        return true;
      } catch (const std::exception& e) {
        if (p.last_error != e.what()) {
          p.last_error = e.what();
          std::cerr << "store: shard " << p.shard << " is still not ready: " << e.what()
                    << std::endl;
        }
        return false;
      }
    });
  }
}

}  // namespace examples::payments_server
