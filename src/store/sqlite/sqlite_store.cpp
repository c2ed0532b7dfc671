#include "orpheus/store/sqlite.hpp"

#include <sqlite3.h>

#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <vector>

#include "orpheus/detail/migration.hpp"
#include "orpheus/detail/record_row.hpp"

namespace orpheus {
namespace detail {
const std::vector<migration>& sqlite_migrations();
}

namespace {

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

// The one place where SQLite result codes become retryable or not.
[[noreturn]] void throw_sqlite(sqlite3* db, int rc, std::string_view what, bool in_commit = false) {
  std::string msg = "sqlite: ";
  msg.append(what).append(": ").append(db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
  switch (rc & 0xFF) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
    case SQLITE_IOERR:
    case SQLITE_FULL:
    case SQLITE_CANTOPEN:
    case SQLITE_PROTOCOL:
    case SQLITE_NOMEM:
      throw storage_error::transient(std::move(msg), in_commit);
    default:
      if (in_commit) throw storage_error::transient(std::move(msg), true);
      throw storage_error::permanent(std::move(msg));
  }
}

class connection {
 public:
  explicit connection(const sqlite_options& o) {
    const int rc =
        sqlite3_open_v2(o.path.c_str(), &db_,
                        SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
    if (rc != SQLITE_OK) {
      std::string msg = db_ ? sqlite3_errmsg(db_) : sqlite3_errstr(rc);
      sqlite3_close(db_);
      db_ = nullptr;
      throw storage_error::transient("sqlite: cannot open " + o.path + ": " + msg);
    }
    sqlite3_busy_timeout(db_, static_cast<int>(o.busy_timeout.count()));
    // The PRAGMA answers with the mode it got, which is not always WAL (a
    // file on a file system without shared memory, an in-memory database):
    // the durability and concurrency this store promises rest on WAL.
    const std::string mode = query_text("PRAGMA journal_mode=WAL");
    if (mode != "wal") {
      sqlite3_close(db_);
      db_ = nullptr;
      throw config_error("sqlite: " + o.path + " cannot be put in WAL mode (it is in '" + mode +
                         "' mode)");
    }
    exec("PRAGMA synchronous=FULL");
    exec("PRAGMA foreign_keys=ON");
  }
  connection(const connection&) = delete;
  connection& operator=(const connection&) = delete;
  ~connection() {
    for (auto& [sql, stmt] : cache_) sqlite3_finalize(stmt);
    sqlite3_close(db_);
  }

  sqlite3* db() const { return db_; }

  // The first column of the first row of `sql`, as text ("" when none).
  std::string query_text(const char* sql) {
    sqlite3_stmt* stmt = nullptr;
    int rc = sqlite3_prepare_v2(db_, sql, -1, &stmt, nullptr);
    std::string out;
    if (rc == SQLITE_OK) {
      rc = sqlite3_step(stmt);
      if (rc == SQLITE_ROW) {
        const auto* t = sqlite3_column_text(stmt, 0);
        if (t != nullptr) out = reinterpret_cast<const char*>(t);
        rc = SQLITE_OK;
      } else if (rc == SQLITE_DONE) {
        rc = SQLITE_OK;
      }
    }
    sqlite3_finalize(stmt);
    if (rc != SQLITE_OK) throw_sqlite(db_, rc, sql);
    return out;
  }

  void exec(const char* sql) {
    char* err = nullptr;
    const int rc = sqlite3_exec(db_, sql, nullptr, nullptr, &err);
    sqlite3_free(err);
    if (rc != SQLITE_OK) throw_sqlite(db_, rc, sql);
  }

  // Prepared statements are cached per connection: one prepare per SQL text.
  sqlite3_stmt* prepare(std::string_view sql) {
    auto it = cache_.find(std::string(sql));
    if (it != cache_.end()) {
      sqlite3_reset(it->second);
      sqlite3_clear_bindings(it->second);
      return it->second;
    }
    sqlite3_stmt* stmt = nullptr;
    const int rc =
        sqlite3_prepare_v2(db_, sql.data(), static_cast<int>(sql.size()), &stmt, nullptr);
    if (rc != SQLITE_OK) throw_sqlite(db_, rc, "prepare");
    if (cache_.size() > 256) {  // application SQL built at run time: bound it
      for (auto& [s, st] : cache_) sqlite3_finalize(st);
      cache_.clear();
    }
    cache_.emplace(std::string(sql), stmt);
    return stmt;
  }

 private:
  sqlite3* db_ = nullptr;
  std::unordered_map<std::string, sqlite3_stmt*> cache_;
};

void bind(sqlite3* db, sqlite3_stmt* s, std::span<const sql_value> params) {
  if (static_cast<int>(params.size()) != sqlite3_bind_parameter_count(s)) {
    throw storage_error::permanent("sqlite: statement expects " +
                                   std::to_string(sqlite3_bind_parameter_count(s)) +
                                   " parameters, got " + std::to_string(params.size()));
  }
  int i = 1;
  for (const auto& p : params) {
    int rc = SQLITE_OK;
    if (std::holds_alternative<std::nullptr_t>(p)) {
      rc = sqlite3_bind_null(s, i);
    } else if (const auto* n = std::get_if<std::int64_t>(&p)) {
      rc = sqlite3_bind_int64(s, i, *n);
    } else if (const auto* d = std::get_if<double>(&p)) {
      rc = sqlite3_bind_double(s, i, *d);
    } else {
      const auto& str = std::get<std::string>(p);
      // Text, not blob: SQL literals in the application's statements compare
      // equal to it. Length-delimited, so any bytes survive.
      rc = sqlite3_bind_text64(s, i, str.data(), str.size(), SQLITE_TRANSIENT, SQLITE_UTF8);
    }
    if (rc != SQLITE_OK) throw_sqlite(db, rc, "bind");
    ++i;
  }
}

sql_value column(sqlite3_stmt* s, int i) {
  switch (sqlite3_column_type(s, i)) {
    case SQLITE_NULL:
      return nullptr;
    case SQLITE_INTEGER:
      return static_cast<std::int64_t>(sqlite3_column_int64(s, i));
    case SQLITE_FLOAT:
      return sqlite3_column_double(s, i);
    default: {
      const auto* p = static_cast<const char*>(sqlite3_column_blob(s, i));
      return std::string(p ? p : "", static_cast<std::size_t>(sqlite3_column_bytes(s, i)));
    }
  }
}

// Runs a statement to completion; returns its rows.
sql_rows run(connection& c, std::string_view sql, std::span<const sql_value> params) {
  sqlite3_stmt* s = c.prepare(sql);
  bind(c.db(), s, params);
  sql_rows rows;
  for (;;) {
    const int rc = sqlite3_step(s);
    if (rc == SQLITE_DONE) break;
    if (rc != SQLITE_ROW) {
      sqlite3_reset(s);
      throw_sqlite(c.db(), rc, "step");
    }
    sql_row row;
    const int n = sqlite3_column_count(s);
    row.values.reserve(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) row.values.push_back(column(s, i));
    rows.push_back(std::move(row));
  }
  sqlite3_reset(s);
  return rows;
}

std::int64_t int_or_zero(const sql_value& v) {
  const auto* n = std::get_if<std::int64_t>(&v);
  return n ? *n : 0;
}

std::string headers_json(const response& r) {
  return nlohmann::json(r.headers).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

struct sqlite_store::impl {
  sqlite_options options;
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

  // Waits at most busy_timeout for a connection: a thread that asks while
  // holding one (or a pool exhausted by stuck callers) gets a retryable error
  // instead of hanging the process.
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
    auto rows = run(*h.conn, full ? all : fast, params);
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

class sqlite_tx final : public store_tx {
 public:
  explicit sqlite_tx(sqlite_store::impl::lease_handle h) : h_(std::move(h)) {
    conn().exec("BEGIN IMMEDIATE");
    open_ = true;
  }
  ~sqlite_tx() override { rollback(); }

  sql_rows query_values(std::string_view sql, std::span<const sql_value> p) override {
    check_alive();
    try {
      return run(conn(), sql, p);
    } catch (const storage_error&) {
      note_if_rolled_back();
      throw;
    }
  }
  std::uint64_t execute_values(std::string_view sql, std::span<const sql_value> p) override {
    check_alive();
    try {
      run(conn(), sql, p);
    } catch (const storage_error&) {
      note_if_rolled_back();
      throw;
    }
    note_if_rolled_back();  // a ROLLBACK run as a statement ends it too
    return static_cast<std::uint64_t>(sqlite3_changes(conn().db()));
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

  void commit() override {
    check_alive();
    const int rc = sqlite3_exec(conn().db(), "COMMIT", nullptr, nullptr, nullptr);
    if (rc != SQLITE_OK) {
      rollback();
      throw_sqlite(conn().db(), rc, "commit", /*in_commit=*/true);
    }
    open_ = false;
  }

  void rollback() noexcept override {
    if (!open_) return;
    open_ = false;
    sqlite3_exec(conn().db(), "ROLLBACK", nullptr, nullptr, nullptr);
  }

 private:
  connection& conn() { return *h_.conn; }

  // SQLite may roll a whole transaction back on an error (I/O, full disk,
  // out of memory, some SQLITE_BUSY cases). Once that happened, a later
  // statement would run in autocommit mode and commit on its own: a fenced
  // finish() would record "succeeded" while the handler's writes are gone.
  // So the transaction is poisoned: every later statement and commit throws.
  void note_if_rolled_back() {
    if (open_ && sqlite3_get_autocommit(conn().db()) != 0) {
      open_ = false;
      poisoned_ = true;
    }
  }
  void check_alive() {
    note_if_rolled_back();
    if (poisoned_) {
      throw storage_error::transient(
          "sqlite: the transaction was already rolled back by an earlier error; nothing of it "
          "was committed");
    }
    if (!open_) throw storage_error::permanent("sqlite: the transaction is already finished");
  }

  sqlite_store::impl::lease_handle h_;
  bool open_ = false;
  bool poisoned_ = false;
};

}  // namespace

sqlite_store::sqlite_store(sqlite_options options) : impl_(std::make_unique<impl>()) {
  if (options.path.empty()) throw config_error("sqlite_store: path is empty");
  if (options.max_connections == 0) throw config_error("sqlite_store: max_connections is 0");
  if (options.busy_timeout.count() < 0) throw config_error("sqlite_store: negative busy_timeout");
  impl_->options = std::move(options);
  impl_->borrow();  // open the file now: fail at start-up, not on first use
}

sqlite_store::~sqlite_store() = default;

std::optional<record> sqlite_store::read(const request_id& id) { return impl_->select(id, false); }

std::optional<record> sqlite_store::inspect(const request_id& id) {
  return impl_->select(id, true);
}

std::unique_ptr<store_tx> sqlite_store::begin(const request_id&) { return begin_on_shard(0); }

std::unique_ptr<store_tx> sqlite_store::begin_on_shard(std::size_t shard) {
  if (shard != 0) throw storage_error::permanent("sqlite_store has one shard");
  return std::make_unique<sqlite_tx>(impl_->borrow());
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
  auto h = impl_->borrow();
  connection& c = *h.conn;
  c.exec("BEGIN IMMEDIATE");  // DDL is transactional in SQLite: all or nothing
  try {
    c.exec(
        "CREATE TABLE IF NOT EXISTS orpheus_schema_version (version INTEGER PRIMARY KEY, "
        "name TEXT NOT NULL, applied_us INTEGER NOT NULL)");
    const auto have = run(c, "SELECT COALESCE(MAX(version), 0) FROM orpheus_schema_version", {});
    const auto current = int_or_zero(have.at(0).values.at(0));
    for (const auto& m : detail::sqlite_migrations()) {
      if (m.version <= current) continue;
      for (const auto& stmt : detail::split_statements(m.sql)) c.exec(stmt.c_str());
      const sql_value params[] = {std::int64_t{m.version}, std::string(m.name)};
      run(c,
          "INSERT INTO orpheus_schema_version(version, name, applied_us) VALUES (?, ?, " ORPHEUS_NOW
          ")",
          params);
    }
    c.exec("COMMIT");
  } catch (...) {
    sqlite3_exec(c.db(), "ROLLBACK", nullptr, nullptr, nullptr);
    throw;
  }
}

int sqlite_store::schema_version(std::size_t shard) {
  if (shard != 0) throw storage_error::permanent("sqlite_store has one shard");
  auto h = impl_->borrow();
  const auto exists = run(*h.conn,
                          "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = "
                          "'orpheus_schema_version'",
                          {});
  if (int_or_zero(exists.at(0).values.at(0)) == 0) return 0;
  const auto v = run(*h.conn, "SELECT COALESCE(MAX(version), 0) FROM orpheus_schema_version", {});
  return static_cast<int>(int_or_zero(v.at(0).values.at(0)));
}

}  // namespace orpheus
