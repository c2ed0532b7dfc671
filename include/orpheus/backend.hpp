// The backend contract: what a database must give the library.
//
// The record state machine's SQL is written once, in the core
// (src/records.cpp), against this narrow interface. A backend is a
// connection, a pool, a dialect and an error classifier:
//   - transactions on one shard that run parameterised statements, commit
//     and roll back (store_backend::begin, backend_tx);
//   - autocommit reads for the replay fast path (store_backend::read);
//   - a few lines of SQL that differ between databases (sql_dialect);
//   - the one place where driver errors become orpheus::storage_error,
//     retryable or not, in doubt or not (see error.hpp).
// Backends: orpheus/store/sqlite.hpp, orpheus/store/mysql.hpp. A backend
// passes tests/integration/conformance_test.cpp.
//
// Thread safety: a backend is shared by all threads; a transaction belongs
// to the one thread that began it.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "orpheus/detail/migration.hpp"
#include "orpheus/error.hpp"
#include "orpheus/tx.hpp"

namespace orpheus {

/// A transaction on one shard: statements, then commit() or rollback().
/// Destroying an uncommitted transaction rolls it back. This is what the
/// application gets for its own set-up (store::begin_on_shard).
class transaction : public tx {
 public:
  /// Commits. A failure whose outcome is unknown throws a storage_error with
  /// in_doubt() set; any other failure commits nothing.
  virtual void commit() = 0;
  virtual void rollback() noexcept = 0;
};

/// A backend's transaction, with the two writes whose form differs between
/// databases. Only the library's record layer calls these two.
class backend_tx : public transaction {
 public:
  /// Runs an INSERT of the dialect's insert-if-absent form (the statement
  /// ends with sql_dialect::insert_if_absent_suffix). Returns false, changing
  /// nothing, when a row with the same primary key exists.
  virtual bool insert_if_absent(std::string_view sql, std::span<const sql_value> params) = 0;

  /// Runs an UPDATE that must change exactly one row: a write fenced by a
  /// lease. Returns false, changing nothing, when it matched no row. A
  /// backend may instead hold it and send it with the commit() that follows
  /// (one round trip fewer); it then returns true, and if the UPDATE then
  /// matches no row, commit() commits nothing and throws
  /// `on_fence_failure()`. A held write is sent before any other statement,
  /// so statements keep their order; rollback() drops it.
  virtual bool execute_fenced(std::string_view sql, std::span<const sql_value> params,
                              storage_error (*on_fence_failure)()) {
    (void)on_fence_failure;
    return execute_values(sql, params) == 1;
  }
};

/// The SQL that differs between databases. Every string is SQL text.
struct sql_dialect {
  /// The database clock in microseconds since the Unix epoch, UTC.
  std::string now_us;
  /// Appended to a SELECT to lock its rows until the transaction ends (""
  /// when a write transaction already excludes every other writer).
  std::string lock_suffix;
  /// Appended to the completer's claim (a SELECT of due records): lock the
  /// rows it returns and pass over rows another transaction holds ("" where a
  /// write transaction already excludes every other writer).
  std::string skip_locked_suffix;
  /// Appended to an INSERT so that a duplicate key changes nothing without
  /// an error ("" when the backend reports a duplicate key as false).
  std::string insert_if_absent_suffix;
  /// Text concatenation of n expressions, separated by one space: the
  /// opening, the separator and the closing (CONCAT_WS(' ', a, b) or
  /// (a || ' ' || b)). Every part must be NOT NULL.
  std::string concat_open;
  std::string concat_separator;
  std::string concat_close;
  /// DELETE of at most `?` rows of `table` matching `where`, oldest
  /// `order_by` first; the limit is the statement's last parameter.
  std::function<std::string(std::string_view table, std::string_view where,
                            std::string_view order_by)>
      bounded_delete;
  /// CREATE TABLE IF NOT EXISTS orpheus_schema_version (version, name,
  /// applied_us).
  std::string create_version_table;
  /// A query with one parameter, a table name, returning one row whose first
  /// column is the number of tables of that name in the current database.
  std::string count_tables;
};

/// One backend: the shards of one database product.
class store_backend {
 public:
  store_backend() = default;
  store_backend(const store_backend&) = delete;
  store_backend& operator=(const store_backend&) = delete;
  virtual ~store_backend() = default;

  [[nodiscard]] virtual std::size_t shard_count() const = 0;
  [[nodiscard]] virtual const sql_dialect& dialect() const = 0;
  /// The schema migrations this library version ships for the backend.
  [[nodiscard]] virtual std::span<const detail::migration> migrations() const = 0;

  /// Opens a transaction on `shard` (< shard_count()).
  virtual std::unique_ptr<backend_tx> begin(std::size_t shard) = 0;
  /// Runs `body` in one transaction on `shard`, then commits it: begin(),
  /// body, commit(), which is what this default does. If `body` throws, the
  /// transaction is rolled back and the exception is rethrown. `body` must not
  /// call commit() or rollback(). A backend may run `body` on another thread
  /// (SQLite runs it on its writer thread, inside a batch, so that the caller
  /// waits once, for the commit, and not for a turn on the connection); it
  /// returns or throws only once `body` has returned, so `body` may refer to
  /// the caller's stack. A backend may also run `body` again, as a retry
  /// would, after a failure that undid all of it (SQLite, when another
  /// member's statement rolled back the batch it ran in): `body` does
  /// nothing but its statements. Errors as begin() and commit().
  virtual void transact(std::size_t shard, const std::function<void(backend_tx&)>& body) {
    const std::unique_ptr<backend_tx> t = begin(shard);
    body(*t);
    t->commit();
  }
  /// Runs one read outside any transaction (autocommit) on `shard`'s master.
  /// It changes nothing, so a backend may retry it once on a fresh
  /// connection.
  virtual sql_rows read(std::size_t shard, std::string_view sql,
                        std::span<const sql_value> params) = 0;
  /// Runs `f` on `shard` with every other migrator of that shard shut out.
  /// Statements without parameters go to the database as they are (DDL).
  /// Whether `f`'s DDL is one transaction is the database's business (it is
  /// on SQLite; MySQL commits each DDL statement), so every migration must be
  /// safe to apply after a partial run.
  virtual void exclusively(std::size_t shard, const std::function<void(tx&)>& f) = 0;
  /// Whether `e`, thrown by a migration's statement, says that what the
  /// statement does is already done (a table, column or index that exists,
  /// or, for a DROP, does not): store::migrate() then goes on, since where
  /// DDL commits statement by statement a run that stopped part way (killed,
  /// or its connection lost while the server finished the statement) left
  /// it applied without the file's version row. False by default, for a
  /// database whose migrations are one transaction.
  [[nodiscard]] virtual bool already_applied(const storage_error& e) const noexcept {
    (void)e;
    return false;
  }
};

}  // namespace orpheus
