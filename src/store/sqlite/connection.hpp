// One SQLite connection of the store, with its prepared-statement cache, and
// the one place where SQLite result codes become retryable or not.
#pragma once

#include <sqlite3.h>

#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "../statement_cache.hpp"
#include "orpheus/store/sqlite.hpp"
#include "orpheus/tx.hpp"

namespace orpheus::sqlite_detail {

/// Throws the storage_error for SQLite result `rc`, as judge() in errors.hpp
/// classifies it: BUSY, LOCKED, IOERR, FULL, CANTOPEN, PROTOCOL and NOMEM are
/// retryable, anything else is permanent; any failure `in_commit` is in doubt.
[[noreturn]] void throw_sqlite(sqlite3* db, int rc, std::string_view what, bool in_commit = false);

class connection {
 public:
  /// Opens the file in WAL mode with synchronous=FULL. Throws config_error
  /// when the file cannot use WAL, storage_error when it cannot be opened.
  explicit connection(const sqlite_options& o);
  connection(const connection&) = delete;
  connection& operator=(const connection&) = delete;
  ~connection();

  [[nodiscard]] sqlite3* db() const { return db_; }
  /// Runs SQL without parameters or results (transaction control, PRAGMA).
  void exec(const char* sql);
  /// The same through the prepared-statement cache, for one statement run
  /// again and again (a batch member's SAVEPOINT and RELEASE): parsed once.
  void exec_cached(std::string_view sql);
  /// The first column of the first row of `sql` as text ("" when none).
  std::string query_text(const char* sql);
  /// Runs a statement to completion with `params`; returns its rows.
  sql_rows run(std::string_view sql, std::span<const sql_value> params);

 private:
  sqlite3_stmt* prepare(std::string_view sql);

  struct finalizer {
    void operator()(sqlite3_stmt* s) const noexcept { sqlite3_finalize(s); }
  };
  using statement = std::unique_ptr<sqlite3_stmt, finalizer>;

  sqlite3* db_ = nullptr;
  detail::statement_cache<statement> cache_;
};

}  // namespace orpheus::sqlite_detail
