#include "storage.hpp"

#include <sstream>
#include <stdexcept>

#include "orpheus/store/sqlite.hpp"
#if PAYMENTS_SERVER_WITH_MYSQL  // set by examples/CMakeLists.txt from ORPHEUS_WITH_MYSQL
#include "orpheus/store/mysql.hpp"
#endif

namespace examples::payments_server {

std::vector<std::string> store_parts(const std::vector<std::string>& specs) {
  std::vector<std::string> parts;
  for (const auto& s : specs) {
    std::stringstream ss(s);
    for (std::string p; std::getline(ss, p, ',');) {
      // A comma starts a shard only before a URL: in "mysql://u:p@h1,h2/d"
      // it separates the nodes of one shard (a Galera cluster).
      const bool shard = p.rfind("mysql://", 0) == 0 || p.rfind("sqlite:", 0) == 0;
      if (!shard && !parts.empty() && parts.back().rfind("mysql://", 0) == 0) {
        parts.back() += "," + p;
      } else if (!p.empty()) {
        parts.push_back(p);
      }
    }
  }
  if (parts.empty()) parts.push_back("sqlite:payments.db");
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

void migrate_schema(orpheus::store& store) {
  store.migrate();
  for (std::size_t s = 0; s < store.shard_count(); ++s) {
    auto t = store.begin_on_shard(s);
    t->execute(
        "CREATE TABLE IF NOT EXISTS payments (id VARCHAR(64) PRIMARY KEY, "
        "client VARCHAR(255) NOT NULL, amount BIGINT NOT NULL, currency CHAR(3) NOT NULL, "
        "customer VARCHAR(64) NOT NULL, state VARCHAR(32) NOT NULL, charge_id VARCHAR(64))");
    t->commit();
  }
}

}  // namespace examples::payments_server
