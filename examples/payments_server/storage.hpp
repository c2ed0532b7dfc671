// The payments server's database: the --store flags, opening the store they
// name, and the schema (the library's records and the payments table).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "orpheus/store.hpp"

namespace examples::payments_server {

/// The --store flags, one entry per shard (commas split too); sqlite:payments.db
/// when there is none.
[[nodiscard]] std::vector<std::string> store_parts(const std::vector<std::string>& specs);

/// Whether the parts name one SQLite file (rather than MySQL shards).
[[nodiscard]] bool is_sqlite(const std::vector<std::string>& parts);

/// The store the parts name: sqlite_store, or mysql_store over every shard.
/// Built without MySQL (PAYMENTS_SERVER_WITH_MYSQL=0), anything but one
/// sqlite:PATH throws std::runtime_error saying so.
[[nodiscard]] std::unique_ptr<orpheus::store> open_store(const std::vector<std::string>& parts);

/// Applies the library's migrations, then creates the payments table on every
/// shard if it is not there.
void migrate_schema(orpheus::store& store);

}  // namespace examples::payments_server
