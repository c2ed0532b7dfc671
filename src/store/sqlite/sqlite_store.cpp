#include "orpheus/store/sqlite.hpp"

#include <sqlite3.h>

#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <vector>

#include "connection.hpp"
#include "orpheus/detail/migration.hpp"
#include "orpheus/detail/record_row.hpp"
#include "single_writer.hpp"

namespace orpheus {
namespace detail {
const std::vector<migration>& sqlite_migrations();
}

namespace {

using sqlite_detail::connection;
using sqlite_detail::single_writer;

// The database clock, in microseconds since the epoch (julianday has
// millisecond precision; enough for leases measured in seconds).
#define ORPHEUS_NOW "CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER)"

// SELECT lists: the fast path's columns, the clock, then (full) the rest.
std::string select_record(bool full) {
  std::string sql = "SELECT ";
  sql.append(detail::record_columns_fast).append(", " ORPHEUS_NOW);
  if (full) sql.append(", ").append(detail::record_columns_rest);
  return sql.append(" FROM orpheus_records WHERE scope = ? AND idem_key = ?");
}

std::int64_t int_or_zero(const sql_value& v) {
  const auto* n = std::get_if<std::int64_t>(&v);
  return n ? *n : 0;
}

std::string headers_json(const response& r) {
  return nlohmann::json(r.headers).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

// Reads (the replay fast path, inspect) use a pool of connections; WAL lets
// them run beside the writer. Every write transaction goes through the one
// single_writer.
struct sqlite_store::impl {
  sqlite_options options;
  std::unique_ptr<single_writer> writer;
  std::mutex mutex;
  std::condition_variable available;
  std::vector<std::unique_ptr<connection>> idle;
  std::size_t open = 0;

  // A connection borrowed from the pool; returned on destruction.
  struct lease_handle {
    impl* owner;
    std::unique_ptr<connection> conn;
    lease_handle(impl* o, std::unique_ptr<connection> c) : owner(o), conn(std::move(c)) {}
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

  std::optional<record> select(const request_id& id, bool full) {
    static const std::string fast = select_record(false);
    static const std::string all = select_record(true);
    auto h = borrow();
    const sql_value params[] = {id.scope, id.key};
    auto rows = h.conn->run(full ? all : fast, params);
    if (rows.empty()) return std::nullopt;
    return detail::record_from_row(rows.front(), full);
  }

  void give_back(std::unique_ptr<connection> c) {
    std::lock_guard lock(mutex);
    idle.push_back(std::move(c));
    available.notify_one();
  }
};

namespace {

// One write transaction: a member of the single writer's current batch.
class sqlite_tx final : public store_tx {
 public:
  explicit sqlite_tx(single_writer& w) : w_(w), batch_(w.enter()) {}
  sqlite_tx(const sqlite_tx&) = delete;
  sqlite_tx& operator=(const sqlite_tx&) = delete;
  ~sqlite_tx() override { rollback(); }

  sql_rows query_values(std::string_view sql, std::span<const sql_value> p) override {
    check_alive();
    try {
      return w_.conn().run(sql, p);
    } catch (const storage_error&) {
      note_if_rolled_back();
      throw;
    }
  }
  std::uint64_t execute_values(std::string_view sql, std::span<const sql_value> p) override {
    check_alive();
    try {
      w_.conn().run(sql, p);
    } catch (const storage_error&) {
      note_if_rolled_back();
      throw;
    }
    note_if_rolled_back();  // a ROLLBACK run as a statement ends it too
    return static_cast<std::uint64_t>(sqlite3_changes(w_.conn().db()));
  }
  std::size_t shard() const override { return 0; }

  bool insert(const request_id& id, std::string_view owner, const lease_terms& t) override {
    return execute(
               "INSERT INTO orpheus_records(scope, idem_key, fingerprint, state, "
               "attempts, lease_owner, lease_expires_us, created_us, updated_us, "
               "retry_until_us, expires_us) VALUES (?, ?, ?, 1, 1, ?, " ORPHEUS_NOW
               " + ?, " ORPHEUS_NOW ", " ORPHEUS_NOW ", " ORPHEUS_NOW " + ?, " ORPHEUS_NOW
               " + ?) ON CONFLICT DO NOTHING",
               id.scope, id.key, id.fingerprint, owner, t.lease_us, t.retry_window_us,
               t.retry_window_us + t.retention_us) == 1;
  }

  std::optional<record> lock(const request_id& id) override {
    // BEGIN IMMEDIATE already holds the database's write lock.
    static const std::string sql = select_record(true);
    auto rows = query(sql, id.scope, id.key);
    if (rows.empty()) return std::nullopt;
    return detail::record_from_row(rows.front(), true);
  }

  bool save_pre_state(const request_id& id, std::string_view owner,
                      std::string_view json) override {
    return execute("UPDATE orpheus_records SET pre_state = ?, updated_us = " ORPHEUS_NOW
                   " WHERE scope = ? AND idem_key = ? AND lease_owner = ? AND state = 1",
                   json, id.scope, id.key, owner) == 1;
  }

  void take_lease(const request_id& id, std::string_view owner, int attempts,
                  const lease_terms& t) override {
    execute("UPDATE orpheus_records SET state = 1, lease_owner = ?, lease_expires_us = " ORPHEUS_NOW
            " + ?, attempts = ?, updated_us = " ORPHEUS_NOW " WHERE scope = ? AND idem_key = ?",
            owner, t.lease_us, attempts, id.scope, id.key);
  }

  bool finish(const request_id& id, std::string_view owner, record_state s, const response& r,
              std::string_view last_error, const lease_terms& t) override {
    return execute(
               "UPDATE orpheus_records SET state = ?, status = ?, headers = ?, body = ?, "
               "last_error = ?, lease_owner = NULL, lease_expires_us = NULL, "
               "expires_us = " ORPHEUS_NOW " + ?, updated_us = " ORPHEUS_NOW
               " WHERE scope = ? AND idem_key = ? AND lease_owner = ? AND state = 1",
               static_cast<int>(s), r.status, headers_json(r), r.body, last_error, t.retention_us,
               id.scope, id.key, owner) == 1;
  }

  bool release(const request_id& id, std::string_view owner, std::string_view why) override {
    return execute(
               "UPDATE orpheus_records SET state = 2, lease_owner = NULL, "
               "lease_expires_us = NULL, last_error = ?, updated_us = " ORPHEUS_NOW
               " WHERE scope = ? AND idem_key = ? AND lease_owner = ? AND state = 1",
               why, id.scope, id.key, owner) == 1;
  }

  // Returns once the batch holding this transaction is durable.
  void commit() override {
    check_alive();
    in_turn_ = false;
    w_.leave(batch_, /*keep=*/true);
  }

  void rollback() noexcept override {
    if (!in_turn_) return;
    in_turn_ = false;
    try {
      w_.leave(batch_, /*keep=*/false);
    } catch (...) {  // NOLINT(bugprone-empty-catch): an undone member has nothing to report
    }
  }

 private:
  // SQLite may roll a whole transaction back on an error (I/O, full disk,
  // out of memory, some SQLITE_BUSY cases). Once that happened, a later
  // statement would run in autocommit mode and commit on its own: a fenced
  // finish() would record "succeeded" while the handler's writes are gone.
  // So the transaction is poisoned: every later statement and commit throws.
  void note_if_rolled_back() {
    if (in_turn_ && sqlite3_get_autocommit(w_.conn().db()) != 0) poisoned_ = true;
  }
  void check_alive() {
    if (!in_turn_) throw storage_error::permanent("sqlite: the transaction is already finished");
    note_if_rolled_back();
    if (poisoned_) {
      throw storage_error::transient(
          "sqlite: the transaction was already rolled back by an earlier error; nothing of it "
          "was committed");
    }
  }

  single_writer& w_;
  std::uint64_t batch_;
  bool in_turn_ = true;  // holds the writer until commit() or rollback()
  bool poisoned_ = false;
};

}  // namespace

sqlite_store::sqlite_store(sqlite_options options) : impl_(std::make_unique<impl>()) {
  if (options.path.empty()) throw config_error("sqlite_store: path is empty");
  if (options.max_connections == 0) throw config_error("sqlite_store: max_connections is 0");
  if (options.busy_timeout.count() < 0) throw config_error("sqlite_store: negative busy_timeout");
  if (options.max_batch == 0) throw config_error("sqlite_store: max_batch is 0");
  if (options.max_batch_age.count() < 0) throw config_error("sqlite_store: negative max_batch_age");
  impl_->options = std::move(options);
  // Open the file now: fail at start-up, not on first use.
  impl_->writer = std::make_unique<single_writer>(impl_->options);
}

sqlite_store::~sqlite_store() = default;

std::optional<record> sqlite_store::read(const request_id& id) { return impl_->select(id, false); }

std::optional<record> sqlite_store::inspect(const request_id& id) {
  return impl_->select(id, true);
}

std::unique_ptr<store_tx> sqlite_store::begin(const request_id&) { return begin_on_shard(0); }

std::unique_ptr<store_tx> sqlite_store::begin_on_shard(std::size_t shard) {
  if (shard != 0) throw storage_error::permanent("sqlite_store has one shard");
  return std::make_unique<sqlite_tx>(*impl_->writer);
}

std::size_t sqlite_store::purge_expired(std::size_t shard, std::size_t limit) {
  auto t = begin_on_shard(shard);
  // Terminal records expire `retention` after they finished; records never
  // finished (abandoned in progress or retryable) `retention` after their
  // retry window closed. A live lease is never purged from under its attempt.
  const auto n = t->execute(
      "DELETE FROM orpheus_records WHERE rowid IN (SELECT rowid FROM orpheus_records "
      "WHERE expires_us < " ORPHEUS_NOW " AND NOT (state = 1 AND lease_expires_us >= " ORPHEUS_NOW
      ") ORDER BY expires_us LIMIT ?)",
      static_cast<std::int64_t>(limit));
  t->commit();
  return n;
}

void sqlite_store::migrate() {
  impl_->writer->exclusively([](connection& c) {
    c.exec("BEGIN IMMEDIATE");  // DDL is transactional in SQLite: all or nothing
    try {
      c.exec(
          "CREATE TABLE IF NOT EXISTS orpheus_schema_version (version INTEGER PRIMARY KEY, "
          "name TEXT NOT NULL, applied_us INTEGER NOT NULL)");
      const auto have = c.run("SELECT COALESCE(MAX(version), 0) FROM orpheus_schema_version", {});
      const auto current = int_or_zero(have.at(0).values.at(0));
      for (const auto& m : detail::sqlite_migrations()) {
        if (m.version <= current) continue;
        for (const auto& stmt : detail::split_statements(m.sql)) c.exec(stmt.c_str());
        const sql_value params[] = {std::int64_t{m.version}, std::string(m.name)};
        c.run(
            "INSERT INTO orpheus_schema_version(version, name, applied_us) VALUES (?, "
            "?, " ORPHEUS_NOW ")",
            params);
      }
      c.exec("COMMIT");
    } catch (...) {
      sqlite3_exec(c.db(), "ROLLBACK", nullptr, nullptr, nullptr);
      throw;
    }
  });
}

sqlite_writer_stats sqlite_store::writer_stats() { return impl_->writer->stats(); }

int sqlite_store::schema_version(std::size_t shard) {
  if (shard != 0) throw storage_error::permanent("sqlite_store has one shard");
  auto h = impl_->borrow();
  const auto exists = h.conn->run(
      "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = "
      "'orpheus_schema_version'",
      {});
  if (int_or_zero(exists.at(0).values.at(0)) == 0) return 0;
  const auto v = h.conn->run("SELECT COALESCE(MAX(version), 0) FROM orpheus_schema_version", {});
  return static_cast<int>(int_or_zero(v.at(0).values.at(0)));
}

}  // namespace orpheus
