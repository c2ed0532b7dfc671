// The transaction handle that Pre-RPC and Post-RPC run their own SQL through.
//
// The library opens the transaction, runs your phase, writes its own
// bookkeeping, and commits: your rows and the idempotency record commit or
// roll back together. Statements use `?` placeholders and typed parameters:
//
//   tx.execute("INSERT INTO payments(id, amount) VALUES (?, ?)", id, 1250);
//   auto rows = tx.query("SELECT amount FROM payments WHERE id = ?", id);
//   std::int64_t amount = rows.at(0).get<std::int64_t>(0);
//
// The SQL dialect is the backend's (SQLite or MySQL); the application's tables
// live on the same shard as the key (tx.shard()).
//
// Errors: a database failure throws orpheus::storage_error, classified
// retryable or not by the backend; let it propagate so the library can roll
// back and answer correctly.
//
// Thread safety and lifetime: a tx is used by the thread running the phase,
// and only during the phase; do not keep it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

namespace orpheus {

/// A typed SQL value: NULL, integer, floating point, or text/bytes.
using sql_value = std::variant<std::nullptr_t, std::int64_t, double, std::string>;

/// One row of a query result.
struct sql_row {
  std::vector<sql_value> values;

  [[nodiscard]] bool is_null(std::size_t i) const {
    return std::holds_alternative<std::nullptr_t>(values.at(i));
  }
  /// Throws std::bad_variant_access when the column holds another type.
  template <class T>
  [[nodiscard]] const T& get(std::size_t i) const {
    return std::get<T>(values.at(i));
  }
};

using sql_rows = std::vector<sql_row>;

namespace detail {
template <class T>
sql_value to_sql_value(T&& v) {
  using D = std::decay_t<T>;
  if constexpr (std::is_same_v<D, std::nullptr_t>) {
    return nullptr;
  } else if constexpr (std::is_same_v<D, bool>) {
    return std::int64_t{v ? 1 : 0};
  } else if constexpr (std::is_integral_v<D>) {
    return static_cast<std::int64_t>(v);
  } else if constexpr (std::is_floating_point_v<D>) {
    return static_cast<double>(v);
  } else if constexpr (std::is_same_v<D, sql_value>) {
    return std::forward<T>(v);
  } else {
    return std::string(std::string_view(v));
  }
}
}  // namespace detail

class tx {
 public:
  tx() = default;
  tx(const tx&) = delete;
  tx& operator=(const tx&) = delete;
  virtual ~tx() = default;

  /// Runs a statement that returns rows.
  virtual sql_rows query_values(std::string_view sql, std::span<const sql_value> params) = 0;
  /// Runs a statement that returns no rows; returns the affected row count.
  virtual std::uint64_t execute_values(std::string_view sql, std::span<const sql_value> params) = 0;
  /// Index of the shard this transaction runs on.
  [[nodiscard]] virtual std::size_t shard() const = 0;

  template <class... Args>
  sql_rows query(std::string_view sql, Args&&... args) {
    const sql_value params[] = {sql_value{}, detail::to_sql_value(std::forward<Args>(args))...};
    return query_values(sql, std::span<const sql_value>(params).subspan(1));
  }

  template <class... Args>
  std::uint64_t execute(std::string_view sql, Args&&... args) {
    const sql_value params[] = {sql_value{}, detail::to_sql_value(std::forward<Args>(args))...};
    return execute_values(sql, std::span<const sql_value>(params).subspan(1));
  }
};

}  // namespace orpheus
