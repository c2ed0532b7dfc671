// The SQLite backend: one file, a pool of read connections, one writer with
// group commit (single_writer.hpp), and SQLite's dialect. The record SQL is
// the core's (src/records.cpp).
#include "orpheus/store/sqlite.hpp"

#include <sqlite3.h>

#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "connection.hpp"
#include "single_writer.hpp"

namespace orpheus {
namespace detail {
const std::vector<migration>& sqlite_migrations();
}

namespace {

using sqlite_detail::connection;
using sqlite_detail::single_writer;

sql_dialect sqlite_dialect() {
  sql_dialect d;
  // julianday has millisecond precision: enough for leases measured in
  // seconds.
  d.now_us = "CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER)";
  d.lock_suffix = "";  // BEGIN IMMEDIATE already holds the database's write lock
  d.skip_locked_suffix = "";
  d.insert_if_absent_suffix = " ON CONFLICT DO NOTHING";
  d.concat_open = "(";
  d.concat_separator = " || ' ' || ";
  d.concat_close = ")";
  d.bounded_delete = [](std::string_view table, std::string_view where, std::string_view order_by) {
    std::string t(table);
    return "DELETE FROM " + t + " WHERE rowid IN (SELECT rowid FROM " + t + " WHERE " +
           std::string(where) + " ORDER BY " + std::string(order_by) + " LIMIT ?)";
  };
  d.create_version_table =
      "CREATE TABLE IF NOT EXISTS orpheus_schema_version (version INTEGER PRIMARY KEY, name TEXT "
      "NOT NULL, applied_us INTEGER NOT NULL)";
  d.count_tables = "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ?";
  return d;
}

// Reads (the replay fast path, inspect) use a pool of connections; WAL lets
// them run beside the writer.
struct read_pool {
  explicit read_pool(const sqlite_options& o) : options(o) {}
  const sqlite_options& options;
  std::mutex mutex;
  std::condition_variable available;
  std::vector<std::unique_ptr<connection>> idle;
  std::size_t open = 0;

  // A connection borrowed from the pool; returned on destruction.
  struct lease_handle {
    read_pool* owner;
    std::unique_ptr<connection> conn;
    lease_handle(read_pool* o, std::unique_ptr<connection> c) : owner(o), conn(std::move(c)) {}
    lease_handle(lease_handle&&) = default;
    ~lease_handle() {
      if (conn) owner->give_back(std::move(conn));
    }
  };

  // Waits at most busy_timeout for a connection: a pool exhausted by stuck
  // callers gives a retryable error instead of hanging the process.
  lease_handle borrow() {
    std::unique_lock lock(mutex);
    const bool got = available.wait_for(lock, options.busy_timeout, [&] {
      return !idle.empty() || open < options.max_connections;
    });
    if (!got) {
      throw storage_error::transient("sqlite: no free connection within busy_timeout (" +
                                     std::to_string(options.max_connections) + " in use)");
    }
    if (!idle.empty()) {
      auto c = std::move(idle.back());
      idle.pop_back();
      return {this, std::move(c)};
    }
    ++open;
    lock.unlock();
    try {
      return {this, std::make_unique<connection>(options)};
    } catch (...) {
      std::lock_guard relock(mutex);
      --open;
      available.notify_one();
      throw;
    }
  }

  void give_back(std::unique_ptr<connection> c) {
    std::lock_guard lock(mutex);
    idle.push_back(std::move(c));
    available.notify_one();
  }
};

// The statements of one write transaction, on the writer's connection.
//
// SQLite may roll a whole transaction back on an error (I/O, full disk, out
// of memory, some SQLITE_BUSY cases). Once that happened, a later statement
// would run in autocommit mode and commit on its own: a fenced finish() would
// record "succeeded" while the handler's writes are gone. So the transaction
// is poisoned: every later statement and commit throws.
class sqlite_statements : public backend_tx {
 public:
  sqlite_statements(connection& c, const single_writer& w) : c_(c), writer_(w) {}

  sql_rows query_values(std::string_view sql, std::span<const sql_value> p) override {
    check_alive();
    try {
      return c_.run(sql, p);
    } catch (const storage_error&) {
      note_if_rolled_back();
      throw;
    }
  }
  std::uint64_t execute_values(std::string_view sql, std::span<const sql_value> p) override {
    check_alive();
    try {
      c_.run(sql, p);
    } catch (const storage_error&) {
      note_if_rolled_back();
      throw;
    }
    note_if_rolled_back();  // a ROLLBACK run as a statement ends it too
    return static_cast<std::uint64_t>(sqlite3_changes(c_.db()));
  }
  std::size_t shard() const override { return 0; }

  bool insert_if_absent(std::string_view sql, std::span<const sql_value> p) override {
    return execute_values(sql, p) == 1;  // the dialect's ON CONFLICT DO NOTHING
  }

  void check_alive() {
    if (!open_) throw storage_error::permanent("sqlite: the transaction is already finished");
    note_if_rolled_back();
    if (poisoned_ && writer_.committed_by_a_statement()) {
      // Found in review: a COMMIT run as a statement by this transaction
      // (through the backend seam, which has no guard) ended the batch with
      // its writes committed, and it was told "nothing of it was committed".
      throw storage_error::transient(
          "sqlite: a COMMIT run as a statement ended the transaction; what was in it may be "
          "committed",
          /*in_doubt=*/true);
    }
    if (poisoned_) {
      throw storage_error::transient(
          "sqlite: the transaction was already rolled back by an earlier error; nothing of it "
          "was committed");
    }
  }

 protected:
  void note_if_rolled_back() {
    if (open_ && sqlite3_get_autocommit(c_.db()) != 0) poisoned_ = true;
  }

  connection& c_;
  const single_writer& writer_;
  bool open_ = true;  // until commit() or rollback()
  bool poisoned_ = false;
};

// A thread member of the single writer's current batch: this thread holds
// the connection from construction to commit() or rollback().
class sqlite_tx final : public sqlite_statements {
 public:
  explicit sqlite_tx(single_writer& w)
      : sqlite_statements(w.conn(), w), w_(w), member_(w.enter()) {}
  sqlite_tx(const sqlite_tx&) = delete;
  sqlite_tx& operator=(const sqlite_tx&) = delete;
  ~sqlite_tx() override { rollback(); }

  // Returns once the batch holding this transaction is durable.
  void commit() override {
    check_alive();
    open_ = false;
    w_.leave(member_, /*keep=*/true);
  }

  void rollback() noexcept override {
    if (!open_) return;
    open_ = false;
    try {
      w_.leave(member_, /*keep=*/false);
    } catch (...) {  // NOLINT(bugprone-empty-catch): an undone member has nothing to report
    }
  }

 private:
  single_writer& w_;
  single_writer::member_ticket member_;
};

// The transaction a body passed to transact() gets, on the writer thread:
// the writer keeps its savepoint when the body returns and commits the
// batch, so the body neither commits nor rolls back (it throws to undo).
class sqlite_job_tx final : public sqlite_statements {
 public:
  using sqlite_statements::sqlite_statements;
  void commit() override {
    throw storage_error::permanent("sqlite: commit() inside transact(): the store commits");
  }
  // Undoes the body: every later statement throws, and so does the end of
  // the body (transact() then rolls the savepoint back).
  void rollback() noexcept override { poisoned_ = true; }
};

// A session for migrations: the writer's connection, outside any batch.
class migration_session final : public tx {
 public:
  explicit migration_session(connection& c) : c_(c) {}
  sql_rows query_values(std::string_view sql, std::span<const sql_value> p) override {
    return c_.run(sql, p);
  }
  std::uint64_t execute_values(std::string_view sql, std::span<const sql_value> p) override {
    if (p.empty()) {
      c_.exec(std::string(sql).c_str());  // DDL: not kept in the statement cache
    } else {
      c_.run(sql, p);
    }
    return static_cast<std::uint64_t>(sqlite3_changes(c_.db()));
  }
  [[nodiscard]] std::size_t shard() const override { return 0; }

 private:
  connection& c_;
};

// Every write transaction goes through the one single_writer.
class sqlite_backend final : public store_backend {
 public:
  explicit sqlite_backend(sqlite_options o)
      : options_(std::move(o)),
        dialect_(sqlite_dialect()),
        // Open the file now: fail at start-up, not on first use.
        writer_(std::make_unique<single_writer>(options_)),
        reads_(options_) {}

  [[nodiscard]] std::size_t shard_count() const override { return 1; }
  [[nodiscard]] const sql_dialect& dialect() const override { return dialect_; }
  [[nodiscard]] std::span<const detail::migration> migrations() const override {
    return detail::sqlite_migrations();
  }

  std::unique_ptr<backend_tx> begin(std::size_t shard) override {
    check(shard);
    return std::make_unique<sqlite_tx>(*writer_);
  }

  // On the writer thread, as one member of its batch: the calling thread
  // waits once, for the batch's commit, and not for a turn on the connection.
  void transact(std::size_t shard, const std::function<void(backend_tx&)>& body) override {
    check(shard);
    writer_->run([&](connection& c) {
      sqlite_job_tx t(c, *writer_);
      body(t);
      t.check_alive();  // a body that rolled back, or lost its batch, keeps nothing
    });
  }

  sql_rows read(std::size_t shard, std::string_view sql,
                std::span<const sql_value> params) override {
    check(shard);
    auto h = reads_.borrow();
    return h.conn->run(sql, params);
  }

  void exclusively(std::size_t shard, const std::function<void(tx&)>& f) override {
    check(shard);
    writer_->exclusively([&](connection& c) {
      // Foreign keys off around it, as SQLite's procedure for rebuilding a
      // table says (found in review: with them on, migration 3's DROP TABLE
      // of the records, copied to their new table, first deleted every row,
      // and an application table that referenced them ON DELETE CASCADE
      // lost its rows). The migrations copy every row they move, key and
      // all, so none is left pointing nowhere. A no-op inside a
      // transaction: set before BEGIN, and on again after its end; if that
      // fails, the next batch turns them on before it begins.
      writer_->foreign_keys_off();
      c.exec("PRAGMA foreign_keys=OFF");
      struct keys_back_on {
        single_writer& w;
        connection& c;
        ~keys_back_on() {
          try {
            c.exec("PRAGMA foreign_keys=ON");
            const auto on = c.run("PRAGMA foreign_keys", {});
            if (!on.empty() && on[0].get<std::int64_t>(0) == 1) w.foreign_keys_on();
          } catch (...) {  // NOLINT(bugprone-empty-catch): the next batch does it
          }
        }
      } back_on{*writer_, c};
      c.exec("BEGIN IMMEDIATE");  // DDL is transactional in SQLite: all or nothing
      try {
        migration_session session(c);
        f(session);
        c.exec("COMMIT");
      } catch (...) {
        sqlite3_exec(c.db(), "ROLLBACK", nullptr, nullptr, nullptr);
        throw;
      }
    });
  }

  [[nodiscard]] sqlite_writer_stats writer_stats() { return writer_->stats(); }

 private:
  static void check(std::size_t shard) {
    if (shard != 0) throw storage_error::permanent("sqlite_store has one shard");
  }

  sqlite_options options_;
  sql_dialect dialect_;
  std::unique_ptr<single_writer> writer_;
  read_pool reads_;
};

std::unique_ptr<store_backend> open_sqlite(sqlite_options options) {
  if (options.path.empty()) throw config_error("sqlite_store: path is empty");
  // Found in review: Debian's SQLite reads "file:" names as URIs, so
  // "file:x.db?nolock=1" (or vfs=unix-none) was accepted, a database whose
  // locking is off, which two processes then corrupt. ":memory:" is a
  // database of each connection's own, not shared by the writer and the
  // readers. Give a file's path.
  if (options.path == ":memory:" || options.path.rfind("file:", 0) == 0) {
    throw config_error("sqlite_store: '" + options.path +
                       "' is not a plain file path (SQLite would read it as a URI or an "
                       "in-memory database); give a file's path");
  }
  if (options.max_connections == 0) throw config_error("sqlite_store: max_connections is 0");
  // Positive: a transaction waits up to busy_timeout for its batch's COMMIT.
  // At most a day: SQLite takes an int of milliseconds (found in review:
  // past 24.8 days it wrapped, and the busy handler between processes went).
  if (options.busy_timeout.count() <= 0 || options.busy_timeout > std::chrono::hours(24)) {
    throw config_error("sqlite_store: busy_timeout must be positive and at most 24 hours");
  }
  if (options.max_batch == 0) throw config_error("sqlite_store: max_batch is 0");
  if (options.max_batch_age.count() < 0) throw config_error("sqlite_store: negative max_batch_age");
  return std::make_unique<sqlite_backend>(std::move(options));
}

}  // namespace

sqlite_store::sqlite_store(sqlite_options options) : store(open_sqlite(std::move(options))) {}

sqlite_store::~sqlite_store() = default;

sqlite_writer_stats sqlite_store::writer_stats() {
  return static_cast<sqlite_backend&>(backend()).writer_stats();
}

}  // namespace orpheus
