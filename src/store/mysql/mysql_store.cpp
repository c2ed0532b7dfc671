// The MySQL / MariaDB backend: the pools of every shard, transactions that
// refuse to go on once the server has ended them, fenced writes that travel
// with their COMMIT on MariaDB, and MySQL's dialect. The record SQL is the
// core's (src/records.cpp); connections, pools and errors have their files.
#include "orpheus/store/mysql.hpp"

#include <cppconn/resultset.h>
#include <cppconn/statement.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "clock.hpp"
#include "connection.hpp"
#include "errors.hpp"
#include "orpheus/detail/ascii.hpp"
#include "pool.hpp"

namespace orpheus {
namespace detail {
const std::vector<migration>& mysql_migrations();
}

namespace {

using mysql_detail::borrowed;
using mysql_detail::connection;
using mysql_detail::duplicate_key;
using mysql_detail::pool;
using mysql_detail::run_query;
using mysql_detail::run_update;

sql_dialect mysql_dialect() {
  sql_dialect d;
  d.now_us = ORPHEUS_MYSQL_NOW_US;  // see clock.hpp
  d.lock_suffix = " FOR UPDATE";
  d.skip_locked_suffix = " FOR UPDATE SKIP LOCKED";  // MariaDB 10.6+, MySQL 8
  d.insert_if_absent_suffix = "";  // a duplicate key is caught (mysql_tx::insert_if_absent)
  d.concat_open = "CONCAT_WS(' ', ";
  d.concat_separator = ", ";
  d.concat_close = ")";
  d.bounded_delete = [](std::string_view table, std::string_view where, std::string_view order_by) {
    return "DELETE FROM " + std::string(table) + " WHERE " + std::string(where) + " ORDER BY " +
           std::string(order_by) + " LIMIT ?";
  };
  d.create_version_table =
      "CREATE TABLE IF NOT EXISTS orpheus_schema_version (version INT PRIMARY KEY, name "
      "VARCHAR(255) NOT NULL, applied_us BIGINT NOT NULL) ENGINE=InnoDB";
  d.count_tables =
      "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND "
      "table_name = ?";
  return d;
}

class mysql_tx final : public backend_tx {
 private:
  // Bug 4 of issue 7: once the server has ended the transaction (deadlock,
  // lost connection, ...), a handler that swallowed the error used to carry
  // on, and the next statement ran in a NEW transaction on the same session
  // (autocommit is off): the library's fenced finish() then committed
  // "succeeded" without the handler's rolled-back writes. Such a transaction
  // is poisoned: every later statement and commit() throw a retryable error
  // without reaching the database, and the session never runs a statement
  // that the caller believes belongs to the old transaction.
  //
  // After commit() or rollback() nothing runs either (found in review): with
  // autocommit off, a statement would open a new transaction that nobody
  // ends, and the pooled connection would carry it, locks and all, to the
  // next borrower, whose COMMIT would commit it.
  template <class F>
  auto run(std::string_view what, F&& f) {
    refuse_if_finished();
    if (!poisoned_.empty()) throw refusal();
    send_deferred();  // statements keep their order
    try {
      return conn_.guarded(what, std::forward<F>(f));
    } catch (const storage_error& e) {
      if (conn_.transaction_ended()) poisoned_ = e.what();
      throw;
    }
  }

  void refuse_if_finished() const {
    if (done_) throw storage_error::permanent("mysql: the transaction is already finished");
  }

  storage_error refusal() const {
    return storage_error::transient(
        "mysql: the server already ended this transaction, after: " + poisoned_ +
        "; nothing more runs in it (retry the whole request)");
  }

 public:
  mysql_tx(pool& p, std::size_t shard) : conn_(p), shard_(shard) {}
  ~mysql_tx() override { rollback(); }

  sql_rows query_values(std::string_view sql, std::span<const sql_value> p) override {
    return run("query", [&](connection& c) { return run_query(c, sql, p); });
  }
  std::uint64_t execute_values(std::string_view sql, std::span<const sql_value> p) override {
    return run("execute", [&](connection& c) { return run_update(c, sql, p); });
  }
  std::size_t shard() const override { return shard_; }

  // The dialect has no insert-if-absent suffix: INSERT IGNORE would turn
  // other errors (truncation, bad values) into warnings too. A duplicate key
  // (1062) is the one error that means "the row exists".
  bool insert_if_absent(std::string_view sql, std::span<const sql_value> p) override {
    refuse_if_finished();  // before the try: a stale 1062 must not read as "the row exists"
    try {
      return execute_values(sql, p) == 1;
    } catch (const storage_error&) {
      if (poisoned_.empty() && conn_.last_error_code() == duplicate_key) return false;
      throw;
    }
  }

  // On MariaDB a fenced write travels with the COMMIT that follows it: one
  // round trip instead of two (the manager commits right after saving the
  // Pre-RPC result and right after finishing). It is still fenced, before the
  // COMMIT and in the same statement: if the UPDATE changes no row the block
  // signals and stops, nothing commits, and commit() throws what a false
  // return would have caused. At most one write waits: any other statement,
  // or another fenced write, sends it first, so statements keep their order;
  // a rollback drops it. Elsewhere (MySQL 8 runs no compound statement
  // outside a stored program) it is sent at once.
  bool execute_fenced(std::string_view sql, std::span<const sql_value> p,
                      storage_error (*on_fence_failure)()) override {
    refuse_if_finished();
    if (!poisoned_.empty()) throw refusal();
    send_deferred();
    if (conn_->compound_statements()) {
      // Refused here, where the transaction can still be rolled back and
      // its connection kept, not in commit(), where any failure discards
      // the connection.
      mysql_detail::check_packet(conn_->max_packet(), p);
      deferred_ = fenced_write{std::string(sql), std::vector<sql_value>(p.begin(), p.end()),
                               on_fence_failure};
      return true;
    }
    return execute_values(sql, p) == 1;
  }

  void commit() override {
    refuse_if_finished();
    if (!poisoned_.empty()) {
      rollback();  // the server already rolled back; this only cleans the session
      throw refusal();
    }
    done_ = true;
    const std::optional<fenced_write> w = std::move(deferred_);
    deferred_.reset();
    // The block, prepared apart from its run: a refusal to prepare it
    // (max_prepared_stmt_count, 1461) ran nothing, so it is not in doubt
    // (found in review: it was reported commit_in_doubt).
    sql::PreparedStatement* block = nullptr;
    try {
      if (w) {
        block = conn_.guarded("prepare the commit",
                              [&](connection& c) { return &c.prepare(and_commit(w->sql)); });
      }
      conn_.guarded(
          "commit",
          [&](connection& c) {
            if (!w) {
              c.exec("COMMIT");
              return;
            }
            // Fails, like COMMIT, in doubt when the connection dies in it.
            // Checked against max_allowed_packet in execute_fenced() already.
            mysql_detail::bind(*block, std::span<const sql_value>(w->params), /*max_packet=*/0);
            try {
              block->execute();
            } catch (const sql::SQLException& e) {
              // An error on a live link with the session still inside the
              // transaction came from the block's UPDATE: its COMMIT never
              // ran. It is judged as the UPDATE's, not the COMMIT's (found
              // in review: a lock wait timeout on the record row was in
              // doubt, and a Pre-RPC result too long for its column was
              // retried for ever instead of refused).
              const auto v = mysql_detail::judge(e, /*in_commit=*/true, c.rollback_on_timeout());
              if (e.getErrorCode() != signal_exception && v.in_doubt && !v.connection_broken &&
                  still_in_transaction(c)) {
                throw mysql_detail::classify(e, "the fenced write before the commit",
                                             /*in_commit=*/false, c.rollback_on_timeout());
              }
              throw;
            }
          },
          /*in_commit=*/true);
    } catch (const storage_error&) {
      // Whatever the error, the session may still be inside the transaction:
      // never lend this connection to another request. A failed fence is the
      // server's own answer: the link was up.
      const bool fence_failed = w && conn_.last_error_code() == signal_exception;
      conn_.mark_broken(/*link_up=*/fence_failed);
      // The fence stopped the block before its COMMIT: nothing committed
      // (the discarded connection's transaction is rolled back).
      if (fence_failed) throw w->on_fence_failure();
      throw;
    } catch (...) {
      conn_.mark_broken();
      throw;
    }
  }

  void rollback() noexcept override {
    deferred_.reset();
    if (done_) return;
    done_ = true;
    if (conn_.broken()) return;  // discarded anyway; the server rolls it back
    try {
      conn_->exec("ROLLBACK");
    } catch (...) {
      conn_.mark_broken();  // state unknown: never hand this connection out again
    }
  }

 private:
  // A fenced UPDATE waiting for commit(), and the error a failed fence
  // means once true has been returned.
  struct fenced_write {
    std::string sql;
    std::vector<sql_value> params;
    storage_error (*on_fence_failure)();
  };

  /// Sends the deferred write on its own. Its true was already returned: a
  /// failed fence throws what commit() would have.
  void send_deferred() {
    if (!deferred_) return;
    const fenced_write w = std::move(*deferred_);
    deferred_.reset();
    if (execute_values(w.sql, w.params) != 1) throw w.on_fence_failure();
  }

  /// The compound block that runs a fenced UPDATE, checks that it changed
  /// exactly one row, and commits (MariaDB).
  static std::string and_commit(std::string_view update) {
    return "BEGIN NOT ATOMIC " + std::string(update) +
           "; IF ROW_COUNT() <> 1 THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'orpheus: lease "
           "not held'; END IF; COMMIT; END";
  }

  /// Whether the session is inside a transaction (MariaDB's
  /// @@in_transaction), asked after a compound block failed: then its
  /// COMMIT never ran. False when the question itself fails: in doubt. A
  /// plain statement, not a prepared one: a server out of prepared
  /// statements (1461) still answers it, and the connection's cache of
  /// them is left alone.
  static bool still_in_transaction(connection& c) noexcept {
    try {
      const std::unique_ptr<sql::Statement> st(c.raw().createStatement());
      const std::unique_ptr<sql::ResultSet> r(st->executeQuery("SELECT @@in_transaction"));
      return r->next() && r->getInt(1) == 1;
    } catch (...) {
      return false;
    }
  }

  /// ER_SIGNAL_EXCEPTION: raised by the fence of a compound block.
  static constexpr int signal_exception = 1644;

  borrowed conn_;
  std::size_t shard_;
  bool done_ = false;
  std::optional<fenced_write> deferred_;  ///< waits for commit() (see execute_fenced())
  std::string poisoned_;                  ///< the error that ended the transaction, if any
};

// A session for migrations: an autocommit connection. DDL goes as plain
// statements (not every DDL statement can be prepared).
// The codes of DDL whose work is done: 1050 table exists, 1060 duplicate
// column, 1061 duplicate key name, 1091 cannot drop (no such column or
// index).
constexpr int already_done_codes[] = {1050, 1060, 1061, 1091};

class migration_session final : public tx {
 public:
  migration_session(connection& c, std::size_t shard) : c_(c), shard_(shard) {}
  sql_rows query_values(std::string_view sql, std::span<const sql_value> p) override {
    return run_query(c_, sql, p);
  }
  std::uint64_t execute_values(std::string_view sql, std::span<const sql_value> p) override {
    if (!p.empty()) return run_update(c_, sql, p);
    std::unique_ptr<sql::Statement> st(c_.raw().createStatement());
    try {
      st->execute(sql::SQLString(std::string(sql)));
    } catch (const sql::SQLException& e) {
      // DDL whose work is done goes out as the storage_error it is, for a
      // migration to go on (store_backend::already_applied()); the link is
      // fine. Anything else to guarded(), which judges the link.
      if (std::find(std::begin(already_done_codes), std::end(already_done_codes),
                    e.getErrorCode()) != std::end(already_done_codes)) {
        throw mysql_detail::classify(e, "migrate", false, false);
      }
      throw;
    }
    return static_cast<std::uint64_t>(st->getUpdateCount());
  }
  [[nodiscard]] std::size_t shard() const override { return shard_; }

 private:
  connection& c_;
  std::size_t shard_;
};

void validate(const mysql_options& options) {
  if (options.shards.empty()) throw config_error("mysql_store: no shards");
  if (options.max_connections_per_shard == 0) {
    throw config_error("mysql_store: max_connections_per_shard is 0");
  }
  for (const auto& s : options.shards) {
    if (s.database.empty() || s.host.empty() || s.user.empty()) {
      throw config_error("mysql_store: a shard needs host, user and database");
    }
    if (s.port <= 0 || s.port > 65535) throw config_error("mysql_store: bad port");
    for (const auto& h : s.failover) {
      if (h.host.empty() || h.port <= 0 || h.port > 65535) {
        throw config_error("mysql_store: a fail-over node needs a host and a good port");
      }
    }
  }
  // One database listed as two shards would hold the keys of both, and
  // migrate() would find it recorded as the other (docs/sharding.md): a
  // mistake in the list, refused here by name. (Another name for the same
  // server is caught by the recorded shard map.) Host names are compared
  // without case, as DNS reads them (found in review: h and H passed).
  std::vector<std::string> databases;
  for (const auto& s : options.shards) {
    databases.push_back(detail::ascii_lower(s.host) + ":" + std::to_string(s.port) + "/" +
                        s.database);
    for (const auto& h : s.failover) {
      databases.push_back(detail::ascii_lower(h.host) + ":" + std::to_string(h.port) + "/" +
                          s.database);
    }
  }
  std::sort(databases.begin(), databases.end());
  if (const auto twice = std::adjacent_find(databases.begin(), databases.end());
      twice != databases.end()) {
    throw config_error("mysql_store: the database " + *twice + " is listed twice");
  }
  // One year: beyond it a timeout is a mistake, and every value then fits the
  // int the connector and the server variables take.
  constexpr std::chrono::seconds year{365 * 24 * 3600};
  for (const auto t :
       {options.connect_timeout, options.read_timeout, options.write_timeout,
        options.lock_wait_timeout, options.session_idle_timeout, options.ping_after_idle}) {
    if (t.count() <= 0 || t > year) {
      throw config_error("mysql_store: timeouts must be positive and at most a year");
    }
  }
  // Found in review: 1,000 years wrapped steady_clock's nanoseconds into the
  // past, and every borrow under contention failed at once.
  if (options.pool_wait.count() <= 0 || options.pool_wait > year) {
    throw config_error("mysql_store: pool_wait must be positive and at most a year");
  }
  if (options.lock_wait_timeout >= options.read_timeout) {
    // The client would give up reading before the server answers a lock
    // wait: a clean, retryable 1205 would become a lost connection.
    throw config_error("mysql_store: lock_wait_timeout must be shorter than read_timeout");
  }
}

class mysql_backend final : public store_backend {
 public:
  explicit mysql_backend(mysql_options options) : options_(std::move(options)) {
    validate(options_);
    mysql_detail::driver();
    for (const auto& s : options_.shards) {
      auto& health = health_.emplace_back();
      tx_pools_.push_back(std::make_unique<pool>(s, options_, false, health));
      read_pools_.push_back(std::make_unique<pool>(s, options_, true, health));
    }
  }

  [[nodiscard]] std::size_t shard_count() const override { return tx_pools_.size(); }

  [[nodiscard]] mysql_pool_stats stats(std::size_t shard) const {
    const auto& h = health_.at(shard);
    return {h.pings.load(), h.failed_pings.load(), h.connects.load(), h.dropped_unpinged.load()};
  }
  [[nodiscard]] const sql_dialect& dialect() const override { return dialect_; }
  // migration_session throws these as storage_error; classify() writes the
  // code into the message as "[code/".
  [[nodiscard]] bool already_applied(const storage_error& e) const noexcept override {
    const std::string_view what = e.what();
    return std::any_of(std::begin(already_done_codes), std::end(already_done_codes), [&](int code) {
      char tag[16] = {'['};
      char* end = std::to_chars(tag + 1, tag + sizeof tag - 1, code).ptr;
      *end++ = '/';
      return what.find(std::string_view(tag, static_cast<std::size_t>(end - tag))) !=
             std::string_view::npos;
    });
  }

  [[nodiscard]] std::span<const detail::migration> migrations() const override {
    return detail::mysql_migrations();
  }

  std::unique_ptr<backend_tx> begin(std::size_t shard) override {
    return std::make_unique<mysql_tx>(*tx_pools_.at(shard), shard);
  }

  sql_rows read(std::size_t shard, std::string_view sql,
                std::span<const sql_value> params) override {
    pool& p = *read_pools_.at(shard);
    // A read changes nothing, so one retry on a fresh connection is safe: it
    // hides a pooled connection that died while idle.
    for (int tries = 0;; ++tries) {
      borrowed c(p);
      try {
        return c.guarded("read", [&](connection& conn) { return run_query(conn, sql, params); });
      } catch (const storage_error&) {
        if (tries > 0) throw;
      }
    }
  }

  void exclusively(std::size_t shard, const std::function<void(tx&)>& f) override {
    borrowed c(*read_pools_.at(shard));
    c.guarded("migrate", [&](connection& conn) {
      std::unique_ptr<sql::Statement> st(conn.raw().createStatement());
      // DDL is not transactional in MySQL: serialise migrators with a lock.
      // Every wait here ends within read_timeout, so that a busy lock or
      // table is a clear retryable error and not a connection lost under
      // the wait (found in review: GET_LOCK waited 60 s against the default
      // 30 s read timeout).
      const std::int64_t within_read = options_.read_timeout.count() - 2;
      const auto lock_wait = std::clamp<std::int64_t>(within_read, 0, 60);
      std::unique_ptr<sql::ResultSet> got(st->executeQuery("SELECT GET_LOCK('orpheus_migrate', " +
                                                           std::to_string(lock_wait) + ")"));
      if (!got->next() || got->getInt(1) != 1) {
        throw storage_error::transient("mysql: another process is migrating");
      }
      got.reset();
      // An ALTER waits for every transaction on its table, and every later
      // statement on the table waits behind the ALTER: give up after a short
      // while (a retryable error) rather than stall the service (the
      // server's default is a day). Found in review.
      const auto ddl_wait = std::clamp<std::int64_t>(within_read, 1, 10);
      st->execute("SET SESSION lock_wait_timeout = " + std::to_string(ddl_wait));
      // The lock first, then the session's own wait (connection.cpp), not
      // the server's day. A connection that cannot be put back so (a KILL
      // QUERY, a statement timeout on either) is discarded: closing it
      // releases the lock (found in review: the SET went first, and when it
      // failed the pooled connection kept the server-wide lock, so every
      // later migrate found "another process is migrating").
      const auto restore = [&] {
        try {
          st->execute("DO RELEASE_LOCK('orpheus_migrate')");
          st->execute("SET SESSION lock_wait_timeout = " +
                      std::to_string(options_.lock_wait_timeout.count()));
        } catch (...) {
          c.mark_broken();
          throw;
        }
      };
      try {
        migration_session session(conn, shard);
        f(session);
      } catch (...) {
        try {
          restore();
        } catch (...) {  // the migration's own error says more; the link is dropped anyway
        }
        throw;
      }
      restore();
    });
  }

 private:
  mysql_options options_;
  sql_dialect dialect_ = mysql_dialect();
  // One per shard, shared by its two pools; a deque: stable addresses.
  std::deque<mysql_detail::shard_health> health_;
  // Per shard: transactions (autocommit off) and fast-path reads (autocommit
  // on, so a read leaves no transaction open behind it).
  std::vector<std::unique_ptr<pool>> tx_pools_;
  std::vector<std::unique_ptr<pool>> read_pools_;
};

}  // namespace

mysql_store::mysql_store(mysql_options options)
    : store(std::make_unique<mysql_backend>(std::move(options))) {}

mysql_store::~mysql_store() = default;

mysql_pool_stats mysql_store::pool_stats(std::size_t shard) const {
  return static_cast<const mysql_backend&>(backend()).stats(shard);
}

}  // namespace orpheus
