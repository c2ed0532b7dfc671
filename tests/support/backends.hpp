// Test backends: a real SQLite file or the real MariaDB servers that
// scripts/test starts (URLs in ORPHEUS_TEST_MYSQL, comma separated). A MySQL
// test without a server FAILS: a skipped test is not a pass. Built without
// MySQL (ORPHEUS_TEST_WITH_MYSQL=0, from tests/CMakeLists.txt), a MySQL store
// is never linked and asking for one fails the test.
#pragma once

#include <gtest/gtest.h>
#include <openssl/rand.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "orpheus/detail/hex.hpp"
#include "orpheus/store/sqlite.hpp"
#ifndef ORPHEUS_TEST_WITH_MYSQL
#define ORPHEUS_TEST_WITH_MYSQL 1
#endif
#if ORPHEUS_TEST_WITH_MYSQL
#include "orpheus/store/mysql.hpp"
#endif

namespace orpheus::test {

inline std::string random_hex(std::size_t bytes = 8) {
  std::vector<unsigned char> b(bytes);
  RAND_bytes(b.data(), static_cast<int>(b.size()));
  return detail::lowercase_hex(b);
}

inline std::vector<std::string> mysql_urls() {
  const char* env = std::getenv("ORPHEUS_TEST_MYSQL");
  std::vector<std::string> out;
  if (env == nullptr) return out;
  std::stringstream ss(env);
  for (std::string item; std::getline(ss, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

#if ORPHEUS_TEST_WITH_MYSQL
/// The shard URLs of an n-shard map on the test servers (the first n of
/// ORPHEUS_TEST_MYSQL). Each database records the map it belongs to
/// (docs/sharding.md) and refuses another, so a map of n > 1 shards has
/// databases of its own, created here when missing: the first server's
/// database is shard 0 of 1 to every one-shard test.
inline std::vector<std::string> mysql_map_urls(std::size_t n) {
  const auto urls = mysql_urls();
  if (urls.size() < n) {
    ADD_FAILURE() << "ORPHEUS_TEST_MYSQL must list at least " << n
                  << " MariaDB URL(s); run the suite with scripts/test";
    return {};
  }
  std::vector<std::string> out(urls.begin(), urls.begin() + static_cast<std::ptrdiff_t>(n));
  if (n == 1) return out;
  for (auto& url : out) {
    mysql_options o;
    o.shards.push_back(parse_mysql_url(url));
    const std::string database = o.shards[0].database + "_of" + std::to_string(n);
    mysql_store server(o);
    auto t = server.begin_on_shard(0);
    t->execute("CREATE DATABASE IF NOT EXISTS " + database);
    t->commit();
    url = url.substr(0, url.rfind('/') + 1) + database;
  }
  return out;
}
#endif

/// A store of the named kind: "sqlite" (a fresh file) or "mysql" (a
/// `shards`-shard map on the test servers: mysql_map_urls()). Migrated,
/// ready to use.
inline std::unique_ptr<store> make_store(const std::string& kind, std::size_t shards = 1) {
  if (kind == "sqlite") {
    auto dir = std::filesystem::temp_directory_path() / ("orpheus-test-" + random_hex());
    std::filesystem::create_directories(dir);
    auto s = std::make_unique<sqlite_store>(sqlite_options{(dir / "orpheus.db").string()});
    s->migrate();
    return s;
  }
#if ORPHEUS_TEST_WITH_MYSQL
  const auto urls = mysql_map_urls(shards);
  if (urls.empty()) return nullptr;
  mysql_options o;
  for (const auto& url : urls) o.shards.push_back(parse_mysql_url(url));
  auto s = std::make_unique<mysql_store>(o);
  s->migrate();
  return s;
#else
  ADD_FAILURE() << "store kind '" << kind << "': built without MySQL (-DORPHEUS_WITH_MYSQL=OFF)";
  static_cast<void>(shards);
  return nullptr;
#endif
}

inline std::string backend_name(const testing::TestParamInfo<std::string>& p) { return p.param; }

/// A store URL of `kind` for a server process under test, all its own: a
/// fresh SQLite file in `dir`, or a fresh database on the first test MariaDB
/// (a payments server's completer finishes every due payment in its store,
/// and one left behind by another test would be charged at this test's
/// fresh bank). The database is dropped with this object.
class scratch_store {
 public:
  scratch_store(const std::string& kind, const std::filesystem::path& dir,
                std::string_view prefix) {
    if (kind == "sqlite") {
      url_ = "sqlite:" + (dir / "payments.db").string();
      return;
    }
#if ORPHEUS_TEST_WITH_MYSQL
    const auto urls = mysql_urls();
    if (urls.empty()) {
      ADD_FAILURE() << "ORPHEUS_TEST_MYSQL is not set; run scripts/test";
      return;
    }
    mysql_options o;
    o.shards.push_back(parse_mysql_url(urls[0]));
    server_ = std::make_unique<mysql_store>(o);
    database_ = std::string(prefix) + random_hex(6);
    auto t = server_->begin_on_shard(0);
    t->execute("CREATE DATABASE " + database_);
    t->commit();
    url_ = urls[0].substr(0, urls[0].rfind('/') + 1) + database_;
#else
    ADD_FAILURE() << "store kind '" << kind << "': built without MySQL";
    static_cast<void>(prefix);
#endif
  }
  scratch_store(const scratch_store&) = delete;
  scratch_store& operator=(const scratch_store&) = delete;
  ~scratch_store() {
    if (!server_) return;
    auto t = server_->begin_on_shard(0);
    t->execute("DROP DATABASE IF EXISTS " + database_);
    t->commit();
  }
  /// What payments_server's --store takes.
  [[nodiscard]] const std::string& url() const { return url_; }

 private:
  std::string url_;
  std::unique_ptr<store> server_;  // MySQL: creates and drops the database
  std::string database_;
};

}  // namespace orpheus::test
