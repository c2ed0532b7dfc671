#include "orpheus/store/mysql.hpp"

#include <cppconn/connection.h>
#include <cppconn/datatype.h>
#include <cppconn/driver.h>
#include <cppconn/prepared_statement.h>
#include <cppconn/resultset.h>
#include <cppconn/resultset_metadata.h>
#include <cppconn/statement.h>

#include <atomic>
#include <charconv>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "clock.hpp"
#include "errors.hpp"
#include "orpheus/detail/migration.hpp"
#include "orpheus/detail/record_row.hpp"
#include "orpheus/shard_map.hpp"

namespace orpheus {
namespace detail {
const std::vector<migration>& mysql_migrations();
}

namespace {

using mysql_detail::classify;
using steady = std::chrono::steady_clock;

// The database clock in microseconds since the epoch (see clock.hpp).
#define ORPHEUS_NOW ORPHEUS_MYSQL_NOW_US

sql::Driver* driver() {
  // get_driver_instance() is not thread-safe; a function-local static is
  // initialised exactly once.
  static sql::Driver* d = get_driver_instance();
  return d;
}

/// One connection with its prepared-statement cache. A statement is prepared
/// once per connection, so each execution is a single round trip.
class connection {
 public:
  connection(const mysql_shard& s, const mysql_options& o, bool autocommit,
             std::uint64_t generation)
      : generation_(generation) {
    sql::ConnectOptionsMap opts;
    opts["hostName"] = sql::SQLString("tcp://" + s.host + ":" + std::to_string(s.port));
    opts["userName"] = sql::SQLString(s.user);
    opts["password"] = sql::SQLString(s.password);
    opts["schema"] = sql::SQLString(s.database);
    opts["OPT_CONNECT_TIMEOUT"] = static_cast<int>(o.connect_timeout.count());
    opts["OPT_READ_TIMEOUT"] = static_cast<int>(o.read_timeout.count());
    opts["OPT_WRITE_TIMEOUT"] = static_cast<int>(o.write_timeout.count());
    opts["OPT_RECONNECT"] = false;     // see STACK.md: silent autocommit after loss
    opts["CLIENT_FOUND_ROWS"] = true;  // affected rows = matched rows
    conn_.reset(driver()->connect(opts));
    std::unique_ptr<sql::Statement> st(conn_->createStatement());
    // Bug 9 of issue 7: a host that dies mid-transaction used to keep its
    // rows locked until the server's default wait_timeout (8 hours) while
    // every attempt on the key waited the server's lock wait (50 s). The
    // session ends within session_idle_timeout of its client going silent,
    // whether the server waits for the next command (wait_timeout) or is
    // inside a packet (net_read_timeout / net_write_timeout), and its
    // transaction rolls back; a waiter gives up after lock_wait_timeout
    // with a retryable 1205.
    const std::string idle = std::to_string(o.session_idle_timeout.count());
    st->execute("SET SESSION time_zone = '+00:00', SESSION innodb_lock_wait_timeout = " +
                std::to_string(o.lock_wait_timeout.count()) + ", SESSION wait_timeout = " + idle +
                ", SESSION net_read_timeout = " + idle + ", SESSION net_write_timeout = " + idle);
    st->execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED");
    // Whether a lock wait timeout rolls back the whole transaction (then it
    // must poison it, like a deadlock) or just the statement (the default).
    // The same round trip asks whether the server is MariaDB: its compound
    // statements let commit() store the Pre-RPC result too (see mysql_tx).
    std::unique_ptr<sql::ResultSet> rs(
        st->executeQuery("SELECT @@innodb_rollback_on_timeout, VERSION() LIKE '%MariaDB%'"));
    const bool got = rs->next();
    rollback_on_timeout_ = got && rs->getInt(1) != 0;
    mariadb_ = got && rs->getInt(2) != 0;
    rs.reset();
    conn_->setAutoCommit(autocommit);
    last_used_ = steady::now();
  }

  sql::Connection& raw() { return *conn_; }
  std::uint64_t generation() const { return generation_; }
  void set_generation(std::uint64_t g) { generation_ = g; }
  steady::time_point last_used() const { return last_used_; }
  void touch() { last_used_ = steady::now(); }
  bool rollback_on_timeout() const { return rollback_on_timeout_; }
  /// The server runs BEGIN NOT ATOMIC ... END (MariaDB 10.1 and later).
  bool compound_statements() const { return mariadb_; }

  /// Runs a statement without parameters or results (COMMIT, ROLLBACK).
  /// Never use sql::Connection::commit()/rollback(): connector 1.1.12 returns
  /// from commit() without an error when the connection is already dead, so
  /// a COMMIT that never ran would look like success. A plain statement
  /// reports the lost connection (2013), which makes the commit in doubt.
  void exec(const char* sql) {
    if (!plain_) plain_.reset(conn_->createStatement());
    plain_->execute(sql);
  }

  sql::PreparedStatement& prepare(std::string_view sql) {
    // Looked up by string_view: a statement's SQL is a few hundred bytes, and
    // copying it into a std::string on every execution was a heap allocation
    // per statement.
    auto it = cache_.find(sql);
    if (it != cache_.end()) return *it->second;
    if (cache_.size() >= 128) cache_.clear();  // bound run-time-built SQL
    std::unique_ptr<sql::PreparedStatement> ps(
        conn_->prepareStatement(sql::SQLString(std::string(sql))));
    return *cache_.emplace(std::string(sql), std::move(ps)).first->second;
  }

 private:
  std::unique_ptr<sql::Connection> conn_;
  // Declared after conn_: statements are closed before their connection.
  struct sql_hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept {
      return std::hash<std::string_view>{}(s);
    }
  };
  std::unordered_map<std::string, std::unique_ptr<sql::PreparedStatement>, sql_hash,
                     std::equal_to<>>
      cache_;
  std::unique_ptr<sql::Statement> plain_;
  std::uint64_t generation_;
  steady::time_point last_used_;
  bool rollback_on_timeout_ = false;
  bool mariadb_ = false;
};

/// A bounded pool for one shard and one autocommit mode.
class pool {
 public:
  /// `epoch` is shared by the pools of one shard: a broken connection in
  /// either makes every idle connection of the shard suspect (pinged first).
  pool(mysql_shard shard, const mysql_options& o, bool autocommit,
       std::atomic<std::uint64_t>& epoch)
      : shard_(std::move(shard)),
        options_(o),
        autocommit_(autocommit),
        generation_(epoch),
        // The server closes a session idle for session_idle_timeout (its
        // wait_timeout). The client's idle clock starts a little after the
        // server's, so a connection idle for most of the timeout is dropped
        // unasked rather than lent out to die on its first statement (bug 9);
        // one idle for half of it is pinged first.
        discard_after_(o.session_idle_timeout - o.session_idle_timeout / 4),
        ping_after_(std::min<steady::duration>(o.ping_after_idle, o.session_idle_timeout / 2)) {}

  std::unique_ptr<connection> borrow() {
    std::unique_lock lock(mutex_);
    for (;;) {
      const bool ready = available_.wait_for(lock, options_.pool_wait, [&] {
        return !idle_.empty() || open_ < options_.max_connections_per_shard;
      });
      if (!ready) {
        throw storage_error::transient("mysql: no free connection to " + shard_.host + ":" +
                                       std::to_string(shard_.port) + " within pool_wait");
      }
      if (idle_.empty()) break;
      auto c = std::move(idle_.back());
      idle_.pop_back();
      const auto idle_for = steady::now() - c->last_used();
      if (idle_for >= discard_after_) {
        --open_;  // closed by the server, or about to be: drop it and look again
        lock.unlock();
        c.reset();
        lock.lock();
        continue;
      }
      const bool suspect = c->generation() != generation_.load() || idle_for > ping_after_;
      if (!suspect) return c;
      const std::uint64_t gen = generation_.load();
      lock.unlock();
      bool ok = false;
      try {
        ok = c->raw().isValid();
      } catch (const sql::SQLException&) {
        ok = false;
      }
      if (ok) {
        c->set_generation(gen);
        return c;
      }
      c.reset();
      lock.lock();
      --open_;  // dead: drop it and look again
    }
    ++open_;
    const std::uint64_t gen = generation_.load();
    lock.unlock();
    try {
      return std::make_unique<connection>(shard_, options_, autocommit_, gen);
    } catch (const sql::SQLException& e) {
      forget_one();
      throw classify(e, "connect", false);
    } catch (...) {
      forget_one();
      throw;
    }
  }

  /// Returns a connection; a broken one is closed, and every idle connection
  /// opened before it is pinged before its next use.
  void give_back(std::unique_ptr<connection> c, bool broken) {
    if (broken) {
      c.reset();
      std::lock_guard lock(mutex_);
      --open_;
      ++generation_;
      available_.notify_one();
      return;
    }
    c->touch();
    std::lock_guard lock(mutex_);
    idle_.push_back(std::move(c));
    available_.notify_one();
  }

  const mysql_shard& shard() const { return shard_; }

 private:
  void forget_one() {
    std::lock_guard lock(mutex_);
    --open_;
    ++generation_;
    available_.notify_one();
  }

  mysql_shard shard_;
  const mysql_options& options_;
  bool autocommit_;
  std::mutex mutex_;
  std::condition_variable available_;
  std::vector<std::unique_ptr<connection>> idle_;
  std::size_t open_ = 0;
  std::atomic<std::uint64_t>& generation_;
  steady::duration discard_after_;
  steady::duration ping_after_;
};

/// A borrowed connection, returned on destruction (discarded if broken).
class borrowed {
 public:
  explicit borrowed(pool& p) : pool_(&p), conn_(p.borrow()) {}
  borrowed(const borrowed&) = delete;
  borrowed& operator=(const borrowed&) = delete;
  ~borrowed() {
    if (conn_) pool_->give_back(std::move(conn_), broken_);
  }
  connection& operator*() { return *conn_; }
  connection* operator->() { return conn_.get(); }
  void mark_broken() { broken_ = true; }
  [[nodiscard]] bool broken() const { return broken_; }
  /// The driver's code of the last failed statement (0 if it succeeded).
  [[nodiscard]] int last_error_code() const { return last_code_; }
  /// The last failed statement ended the server-side transaction (deadlock,
  /// lost connection, ...): see mysql_detail::verdict.
  [[nodiscard]] bool transaction_ended() const { return ended_; }

  /// Runs `f`, translating driver errors; a broken link marks the connection.
  template <class F>
  auto guarded(std::string_view what, F&& f, bool in_commit = false) {
    last_code_ = 0;
    ended_ = false;
    try {
      return f(*conn_);
    } catch (const sql::SQLException& e) {
      last_code_ = e.getErrorCode();
      const bool timeout_rolls_back = conn_->rollback_on_timeout();
      const auto v = mysql_detail::judge(e, in_commit, timeout_rolls_back);
      if (v.connection_broken) broken_ = true;
      ended_ = v.transaction_ended;
      throw classify(e, what, in_commit, timeout_rolls_back);
    }
  }

 private:
  pool* pool_;
  std::unique_ptr<connection> conn_;
  bool broken_ = false;
  bool ended_ = false;
  int last_code_ = 0;
};

void bind(sql::PreparedStatement& ps, std::span<const sql_value> params) {
  unsigned i = 1;
  for (const auto& p : params) {
    if (std::holds_alternative<std::nullptr_t>(p)) {
      ps.setNull(i, sql::DataType::SQLNULL);
    } else if (const auto* n = std::get_if<std::int64_t>(&p)) {
      ps.setInt64(i, *n);
    } else if (const auto* d = std::get_if<double>(&p)) {
      ps.setDouble(i, *d);
    } else {
      ps.setString(i, sql::SQLString(std::get<std::string>(p)));
    }
    ++i;
  }
}

sql_rows read_rows(sql::ResultSet& rs) {
  sql_rows rows;
  sql::ResultSetMetaData* md = rs.getMetaData();
  const unsigned n = md->getColumnCount();
  std::vector<int> types(n);
  for (unsigned c = 0; c < n; ++c) types[c] = md->getColumnType(c + 1);
  while (rs.next()) {
    sql_row row;
    row.values.reserve(n);
    for (unsigned c = 1; c <= n; ++c) {
      if (rs.isNull(c)) {
        row.values.emplace_back(nullptr);
        continue;
      }
      switch (types[c - 1]) {
        case sql::DataType::BIT:
        case sql::DataType::TINYINT:
        case sql::DataType::SMALLINT:
        case sql::DataType::MEDIUMINT:
        case sql::DataType::INTEGER:
        case sql::DataType::BIGINT:
        case sql::DataType::YEAR:
          row.values.emplace_back(static_cast<std::int64_t>(rs.getInt64(c)));
          break;
        case sql::DataType::REAL:
        case sql::DataType::DOUBLE:
          row.values.emplace_back(static_cast<double>(rs.getDouble(c)));
          break;
        default:
          row.values.emplace_back(rs.getString(c).asStdString());
      }
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

sql_rows run_query(connection& c, std::string_view sql, std::span<const sql_value> p) {
  auto& ps = c.prepare(sql);
  bind(ps, p);
  std::unique_ptr<sql::ResultSet> rs(ps.executeQuery());
  return read_rows(*rs);
}

std::uint64_t run_update(connection& c, std::string_view sql, std::span<const sql_value> p) {
  auto& ps = c.prepare(sql);
  bind(ps, p);
  return static_cast<std::uint64_t>(ps.executeUpdate());
}

std::int64_t int_or_zero(const sql_value& v) {
  const auto* n = std::get_if<std::int64_t>(&v);
  return n ? *n : 0;
}

// SELECT lists: the fast path's columns, the clock, then (full) the rest.
std::string select_record(bool full, bool for_update) {
  std::string sql = "SELECT ";
  sql.append(detail::record_columns_fast).append(", " ORPHEUS_NOW " AS now_us");  // see select_fast
  if (full) sql.append(", ").append(detail::record_columns_rest);
  sql.append(" FROM orpheus_records WHERE scope = ? AND idem_key = ?");
  return for_update ? sql + " FOR UPDATE" : sql;
}

// The replay fast path's SELECT. On a replay the connector's cost per result
// column dominates the client's work: each column costs a name-map entry
// (upper-cased), a bound buffer and a getter call, about 3,000 instructions
// (callgrind, bench/process_bench.cpp), against about 1,000 for everything
// Orpheus adds around the read. So the five numbers, the fingerprint and the
// lease owner come back as ONE text column, and only headers and body (any
// bytes) keep their own: 3 columns instead of 9. CONCAT_WS skips NULLs, hence
// the COALESCEs, which give what record_from_row() gives a NULL: 0 or "".
// Every part is digits or hex (the fingerprint and the owner token are
// written validated), so a space separates them unambiguously. Every column
// has a one-letter alias: the connector upper-cases each column's name for
// every result set, and the unnamed CONCAT_WS was named by its whole text
// (about 3,800 instructions per replay, callgrind).
const std::string& select_fast() {
  static const std::string sql =
      "SELECT CONCAT_WS(' ', state, attempts, COALESCE(lease_expires_us, 0), "
      "COALESCE(status, 0), " ORPHEUS_NOW
      ", fingerprint, COALESCE(lease_owner, '')) AS r, headers AS h, body AS b "
      "FROM orpheus_records "
      "WHERE scope = ? AND idem_key = ?";
  return sql;
}

[[noreturn]] void unreadable_row(std::string_view why) {
  throw storage_error::permanent("mysql: unreadable orpheus_records row (" + std::string(why) +
                                 ")");
}

/// Parses select_fast()'s first column into `out`.
void parse_fast_meta(std::string_view meta, record& out) {
  const char* p = meta.data();
  const char* const end = meta.data() + meta.size();
  auto number = [&]() -> std::int64_t {
    std::int64_t v = 0;
    const auto [next, ec] = std::from_chars(p, end, v);
    if (ec != std::errc{} || next == end || *next != ' ') unreadable_row("numbers");
    p = next + 1;
    return v;
  };
  out.state = static_cast<record_state>(number());
  out.attempts = static_cast<int>(number());
  out.lease_expires_us = number();
  out.recorded.status = static_cast<int>(number());
  out.db_now_us = number();
  const std::string_view rest(p, static_cast<std::size_t>(end - p));
  const auto space = rest.find(' ');
  if (space == std::string_view::npos) unreadable_row("fingerprint");
  out.fingerprint.assign(rest.substr(0, space));
  out.lease_owner.assign(rest.substr(space + 1));
}

/// Reads a quoted JSON string of printable ASCII without escapes at `p`;
/// false (leaving the rest to the general parser) on anything else.
bool plain_json_string(const char*& p, const char* end, std::string& out) {
  if (p == end || *p != '"') return false;
  const char* const begin = ++p;
  while (p != end && *p != '"') {
    const auto c = static_cast<unsigned char>(*p);
    if (c < 0x20 || c > 0x7e || c == '\\') return false;
    ++p;
  }
  if (p == end) return false;
  out.assign(begin, p);
  ++p;
  return true;
}

/// The recorded headers, as finish() stored them: nlohmann's compact dump of
/// [[name, value], ...]. Parsing that with nlohmann cost about 7,000
/// instructions per replay, as much as the rest of the read; the common form
/// (printable ASCII, no escapes) is read directly, and anything else (escapes,
/// UTF-8, unexpected shape) goes to nlohmann exactly as record_from_row() does,
/// so both give the same headers for every stored value.
std::vector<std::pair<std::string, std::string>> parse_headers(const std::string& json) {
  std::vector<std::pair<std::string, std::string>> out;
  if (json.empty()) return out;
  const char* p = json.data();
  const char* const end = p + json.size();
  auto expect = [&](char c) {
    if (p == end || *p != c) return false;
    ++p;
    return true;
  };
  bool plain = expect('[');
  if (plain && !expect(']')) {
    do {
      auto& h = out.emplace_back();
      plain = expect('[') && plain_json_string(p, end, h.first) && expect(',') &&
              plain_json_string(p, end, h.second) && expect(']');
    } while (plain && expect(','));
    plain = plain && expect(']');
  }
  if (plain && p == end) return out;
  try {  // as record_from_row(): a storage_error, not nlohmann's (issue 9)
    return nlohmann::json::parse(json).get<std::vector<std::pair<std::string, std::string>>>();
  } catch (const nlohmann::json::exception& e) {
    unreadable_row(std::string("headers: ") + e.what());
  }
}

}  // namespace

struct mysql_store::impl {
  mysql_options options;
  // Per shard: transactions (autocommit off) and fast-path reads (autocommit
  // on, so a read leaves no transaction open behind it).
  std::vector<std::unique_ptr<pool>> tx_pools;
  std::vector<std::unique_ptr<pool>> read_pools;
  std::deque<std::atomic<std::uint64_t>> epochs;  // one per shard; deque: stable addresses
};

namespace {

class mysql_tx final : public store_tx {
 private:
  // Bug 4 of issue 7: once the server has ended the transaction (deadlock,
  // lost connection, ...), a handler that swallowed the error used to carry
  // on, and the next statement ran in a NEW transaction on the same session
  // (autocommit is off): the library's fenced finish() then committed
  // "succeeded" without the handler's rolled-back writes. Such a transaction
  // is poisoned: every later statement and commit() throw a retryable error
  // without reaching the database, and the session never runs a statement
  // that the caller believes belongs to the old transaction.
  template <class F>
  auto run(std::string_view what, F&& f) {
    if (!poisoned_.empty()) throw refusal();
    send_deferred();  // statements keep their order
    try {
      return conn_.guarded(what, std::forward<F>(f));
    } catch (const storage_error& e) {
      if (conn_.transaction_ended()) poisoned_ = e.what();
      throw;
    }
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

  bool insert(const request_id& id, std::string_view owner, const lease_terms& t) override {
    try {
      return execute(
                 // Bug 12 of issue 7: an unfinished record expires too, at
                 // the end of its retry window plus the retention, so an
                 // abandoned one is purged in the end (finish() moves
                 // expires_us to its own retention).
                 "INSERT INTO orpheus_records(scope, idem_key, fingerprint, state, "
                 "attempts, lease_owner, lease_expires_us, created_us, updated_us, "
                 "retry_until_us, expires_us) VALUES (?, ?, ?, 1, 1, ?, " ORPHEUS_NOW
                 " + ?, " ORPHEUS_NOW ", " ORPHEUS_NOW ", " ORPHEUS_NOW " + ?, " ORPHEUS_NOW
                 " + ? + ?)",
                 id.scope, id.key, id.fingerprint, owner, t.lease_us, t.retry_window_us,
                 t.retry_window_us, t.retention_us) == 1;
    } catch (const storage_error&) {
      if (poisoned_.empty() && conn_.last_error_code() == mysql_detail::duplicate_key) return false;
      throw;
    }
  }

  std::optional<record> lock(const request_id& id) override {
    static const std::string sql = select_record(true, true);
    auto rows = query_values(sql, std::vector<sql_value>{id.scope, id.key});
    if (rows.empty()) return std::nullopt;
    return detail::record_from_row(rows.front(), true);
  }

  bool save_pre_state(const request_id& id, std::string_view owner,
                      std::string_view json) override {
    return fenced({pre_state_sql, pre_state_and_commit,
                   std::vector<sql_value>{std::string(json), id.scope, id.key, std::string(owner)},
                   &pre_state_fence_failed});
  }

  void take_lease(const request_id& id, std::string_view owner, int attempts,
                  const lease_terms& t) override {
    execute("UPDATE orpheus_records SET state = 1, lease_owner = ?, lease_expires_us = " ORPHEUS_NOW
            " + ?, attempts = ?, updated_us = " ORPHEUS_NOW " WHERE scope = ? AND idem_key = ?",
            owner, t.lease_us, attempts, id.scope, id.key);
  }

  bool finish(const request_id& id, std::string_view owner, record_state s, const response& r,
              std::string_view last_error, const lease_terms& t) override {
    const std::string headers =
        nlohmann::json(r.headers).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    return fenced(
        {finish_sql, finish_and_commit,
         std::vector<sql_value>{std::int64_t{static_cast<int>(s)}, std::int64_t{r.status}, headers,
                                r.body, std::string(last_error), std::int64_t{t.retention_us},
                                id.scope, id.key, std::string(owner)},
         &finish_fence_failed});
  }

  bool release(const request_id& id, std::string_view owner, std::string_view why) override {
    return execute(
               "UPDATE orpheus_records SET state = 2, lease_owner = NULL, "
               "lease_expires_us = NULL, last_error = ?, updated_us = " ORPHEUS_NOW
               " WHERE scope = ? AND idem_key = ? AND lease_owner = ? AND state = 1",
               why, id.scope, id.key, owner) == 1;
  }

  void commit() override {
    if (!poisoned_.empty()) {
      rollback();  // the server already rolled back; this only cleans the session
      throw refusal();
    }
    done_ = true;
    const std::optional<fenced_write> w = std::move(deferred_);
    deferred_.reset();
    try {
      conn_.guarded(
          "commit",
          [&](connection& c) {
            if (!w) {
              c.exec("COMMIT");
              return;
            }
            // Fails, like COMMIT, in doubt when the connection dies in it.
            auto& ps = c.prepare(w->with_commit);
            bind(ps, std::span<const sql_value>(w->params));
            ps.execute();
          },
          /*in_commit=*/true);
    } catch (const storage_error&) {
      // Whatever the error, the session may still be inside the transaction:
      // never lend this connection to another request.
      conn_.mark_broken();
      // The fence stopped the block before its COMMIT: nothing committed
      // (the discarded connection's transaction is rolled back).
      if (w && conn_.last_error_code() == signal_exception) throw w->fence_failed();
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
  // A fenced UPDATE of the lease row (save_pre_state, finish): the statement
  // alone, the compound block that runs it and commits, its parameters, and
  // the error a failed fence means once true has been returned.
  struct fenced_write {
    const char* alone;
    const char* with_commit;
    std::vector<sql_value> params;
    storage_error (*fence_failed)();
  };

  // On MariaDB a fenced write travels with the COMMIT that follows it: one
  // round trip instead of two (the manager commits right after saving the
  // Pre-RPC result and right after finishing). It is still fenced, before the
  // COMMIT and in the same statement: if the row is not this owner's
  // in-progress lease the block signals and stops, nothing commits, and
  // commit() throws what a false return would have caused. At most one write
  // waits: any other statement, or another fenced write, sends it first, so
  // statements keep their order; a rollback drops it. Elsewhere (MySQL 8 runs
  // no compound statement outside a stored program) it is sent at once.
  bool fenced(fenced_write w) {
    if (!poisoned_.empty()) throw refusal();
    send_deferred();
    if (conn_->compound_statements()) {
      deferred_ = std::move(w);
      return true;
    }
    return execute_values(w.alone, w.params) == 1;
  }

  /// Sends the deferred write on its own. Its true was already returned: a
  /// failed fence throws what commit() would have.
  void send_deferred() {
    if (!deferred_) return;
    const fenced_write w = std::move(*deferred_);
    deferred_.reset();
    if (execute_values(w.alone, w.params) != 1) throw w.fence_failed();
  }

  static storage_error pre_state_fence_failed() {
    return storage_error::permanent("lease row vanished inside its own transaction");
  }
  static storage_error finish_fence_failed() {
    return storage_error::lease_lost(
        "mysql: the fenced finish found another owner's lease; nothing committed");
  }

  /// ER_SIGNAL_EXCEPTION: raised by the fence of a compound block.
  static constexpr int signal_exception = 1644;

// The fence every write of an attempt carries, and the compound block that
// checks it and commits (MariaDB).
#define ORPHEUS_FENCE " WHERE scope = ? AND idem_key = ? AND lease_owner = ? AND state = 1"
#define ORPHEUS_AND_COMMIT(update)                                                 \
  "BEGIN NOT ATOMIC " update                                                       \
  "; IF ROW_COUNT() <> 1 THEN "                                                    \
  "SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'orpheus: lease not held'; END IF; " \
  "COMMIT; END"
#define ORPHEUS_PRE_STATE_UPDATE \
  "UPDATE orpheus_records SET pre_state = ?, updated_us = " ORPHEUS_NOW ORPHEUS_FENCE
#define ORPHEUS_FINISH_UPDATE                                                 \
  "UPDATE orpheus_records SET state = ?, status = ?, headers = ?, body = ?, " \
  "last_error = ?, lease_owner = NULL, lease_expires_us = NULL, "             \
  "expires_us = " ORPHEUS_NOW " + ?, updated_us = " ORPHEUS_NOW ORPHEUS_FENCE
  static constexpr const char* pre_state_sql = ORPHEUS_PRE_STATE_UPDATE;
  static constexpr const char* pre_state_and_commit = ORPHEUS_AND_COMMIT(ORPHEUS_PRE_STATE_UPDATE);
  static constexpr const char* finish_sql = ORPHEUS_FINISH_UPDATE;
  static constexpr const char* finish_and_commit = ORPHEUS_AND_COMMIT(ORPHEUS_FINISH_UPDATE);
#undef ORPHEUS_FINISH_UPDATE
#undef ORPHEUS_PRE_STATE_UPDATE
#undef ORPHEUS_AND_COMMIT
#undef ORPHEUS_FENCE

  borrowed conn_;
  std::size_t shard_;
  bool done_ = false;
  std::optional<fenced_write> deferred_;  ///< waits for commit() (see fenced())
  std::string poisoned_;                  ///< the error that ended the transaction, if any
};

}  // namespace

mysql_shard parse_mysql_url(std::string_view url) {
  constexpr std::string_view scheme = "mysql://";
  auto bad = [&](const char* why) {
    return config_error(std::string("bad MySQL URL (") + why +
                        "); expected mysql://user:password@host:port/database");
  };
  if (url.substr(0, scheme.size()) != scheme) throw bad("scheme");
  url.remove_prefix(scheme.size());
  const auto at = url.rfind('@');
  if (at == std::string_view::npos) throw bad("no user");
  const auto creds = url.substr(0, at);
  url.remove_prefix(at + 1);
  mysql_shard s;
  const auto colon = creds.find(':');
  s.user = std::string(creds.substr(0, colon));
  if (colon != std::string_view::npos) s.password = std::string(creds.substr(colon + 1));
  const auto slash = url.find('/');
  if (slash == std::string_view::npos) throw bad("no database");
  const auto hostport = url.substr(0, slash);
  s.database = std::string(url.substr(slash + 1));
  const auto pc = hostport.rfind(':');
  s.host = std::string(hostport.substr(0, pc));
  if (pc != std::string_view::npos) {
    const auto p = hostport.substr(pc + 1);
    int port = 0;
    const auto [ptr, ec] = std::from_chars(p.data(), p.data() + p.size(), port);
    if (ec != std::errc{} || ptr != p.data() + p.size() || port <= 0 || port > 65535) {
      throw bad("port");
    }
    s.port = port;
  }
  if (s.user.empty() || s.host.empty() || s.database.empty()) throw bad("empty part");
  return s;
}

mysql_store::mysql_store(mysql_options options) : impl_(std::make_unique<impl>()) {
  if (options.shards.empty()) throw config_error("mysql_store: no shards");
  if (options.max_connections_per_shard == 0) {
    throw config_error("mysql_store: max_connections_per_shard is 0");
  }
  for (const auto& s : options.shards) {
    if (s.database.empty() || s.host.empty() || s.user.empty()) {
      throw config_error("mysql_store: a shard needs host, user and database");
    }
    if (s.port <= 0 || s.port > 65535) throw config_error("mysql_store: bad port");
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
  if (options.pool_wait.count() <= 0) throw config_error("mysql_store: pool_wait must be positive");
  if (options.lock_wait_timeout >= options.read_timeout) {
    // The client would give up reading before the server answers a lock
    // wait: a clean, retryable 1205 would become a lost connection.
    throw config_error("mysql_store: lock_wait_timeout must be shorter than read_timeout");
  }
  driver();
  impl_->options = std::move(options);
  for (const auto& s : impl_->options.shards) {
    auto& epoch = impl_->epochs.emplace_back(0);
    impl_->tx_pools.push_back(std::make_unique<pool>(s, impl_->options, false, epoch));
    impl_->read_pools.push_back(std::make_unique<pool>(s, impl_->options, true, epoch));
  }
}

mysql_store::~mysql_store() = default;

std::size_t mysql_store::shard_count() const { return impl_->tx_pools.size(); }

std::size_t mysql_store::shard_of(const request_id& id) const {
  return shard_for(id.scope, id.key, shard_count());
}

std::optional<record> mysql_store::read(const request_id& id) {
  const sql_value params[] = {id.scope, id.key};
  // A read changes nothing, so one retry on a fresh connection is safe: it
  // hides a pooled connection that died while idle.
  for (int tries = 0;; ++tries) {
    borrowed c(*impl_->read_pools[shard_of(id)]);
    try {
      return c.guarded("read", [&](connection& conn) -> std::optional<record> {
        auto& ps = conn.prepare(select_fast());
        bind(ps, std::span<const sql_value>(params));
        std::unique_ptr<sql::ResultSet> rs(ps.executeQuery());
        if (!rs->next()) return std::nullopt;
        record out;
        parse_fast_meta(rs->getString(1).asStdString(), out);
        out.recorded.headers = parse_headers(rs->getString(2).asStdString());
        out.recorded.body = rs->getString(3).asStdString();
        return out;
      });
    } catch (const storage_error&) {
      if (tries > 0) throw;
    }
  }
}

std::optional<record> mysql_store::inspect(const request_id& id) {
  static const std::string all = select_record(true, false);
  const sql_value params[] = {id.scope, id.key};
  // A read changes nothing, so one retry on a fresh connection is safe: it
  // hides a pooled connection that died while idle.
  for (int tries = 0;; ++tries) {
    borrowed c(*impl_->read_pools[shard_of(id)]);
    try {
      auto rows =
          c.guarded("inspect", [&](connection& conn) { return run_query(conn, all, params); });
      if (rows.empty()) return std::nullopt;
      return detail::record_from_row(rows.front(), true);
    } catch (const storage_error&) {
      if (tries > 0) throw;
    }
  }
}

std::unique_ptr<store_tx> mysql_store::begin(const request_id& id) {
  return begin_on_shard(shard_of(id));
}

std::unique_ptr<store_tx> mysql_store::begin_on_shard(std::size_t shard) {
  if (shard >= shard_count()) throw storage_error::permanent("mysql_store: no such shard");
  return std::make_unique<mysql_tx>(*impl_->tx_pools[shard], shard);
}

std::size_t mysql_store::purge_expired(std::size_t shard, std::size_t limit) {
  auto t = begin_on_shard(shard);
  // Bug 12 of issue 7: abandoned unfinished records (in progress with a dead
  // lease, retryable) expire too (see insert()). Any state goes once its
  // expiry has passed, except a record under a live lease: someone is working
  // on it right now. Bounded by `limit` per call.
  const auto n =
      t->execute("DELETE FROM orpheus_records WHERE expires_us < " ORPHEUS_NOW
                 " AND (state <> 1 OR lease_expires_us IS NULL OR lease_expires_us < " ORPHEUS_NOW
                 ") ORDER BY expires_us LIMIT ?",
                 static_cast<std::int64_t>(limit));
  t->commit();
  return n;
}

void mysql_store::migrate() {
  for (std::size_t s = 0; s < shard_count(); ++s) {
    borrowed c(*impl_->read_pools[s]);
    c.guarded("migrate", [&](connection& conn) {
      std::unique_ptr<sql::Statement> st(conn.raw().createStatement());
      // DDL is not transactional in MySQL: serialise migrators with a lock
      // and record each file as soon as it is applied.
      std::unique_ptr<sql::ResultSet> got(
          st->executeQuery("SELECT GET_LOCK('orpheus_migrate', 60)"));
      if (!got->next() || got->getInt(1) != 1) {
        throw storage_error::transient("mysql: another process is migrating");
      }
      got.reset();
      try {
        st->execute(
            "CREATE TABLE IF NOT EXISTS orpheus_schema_version (version INT PRIMARY KEY, "
            "name VARCHAR(255) NOT NULL, applied_us BIGINT NOT NULL) ENGINE=InnoDB");
        std::unique_ptr<sql::ResultSet> v(
            st->executeQuery("SELECT COALESCE(MAX(version), 0) FROM orpheus_schema_version"));
        v->next();
        const int current = v->getInt(1);
        v.reset();
        for (const auto& m : detail::mysql_migrations()) {
          if (m.version <= current) continue;
          for (const auto& stmt : detail::split_statements(m.sql)) st->execute(stmt);
          const sql_value p[] = {std::int64_t{m.version}, std::string(m.name)};
          run_update(conn,
                     "INSERT INTO orpheus_schema_version(version, name, applied_us) VALUES (?, "
                     "?, " ORPHEUS_NOW ")",
                     p);
        }
      } catch (...) {
        st->execute("DO RELEASE_LOCK('orpheus_migrate')");
        throw;
      }
      st->execute("DO RELEASE_LOCK('orpheus_migrate')");
    });
  }
}

int mysql_store::schema_version(std::size_t shard) {
  borrowed c(*impl_->read_pools.at(shard));
  return c.guarded("schema_version", [&](connection& conn) {
    auto exists = run_query(conn,
                            "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = "
                            "DATABASE() AND table_name = 'orpheus_schema_version'",
                            {});
    if (int_or_zero(exists.at(0).values.at(0)) == 0) return 0;
    auto v = run_query(conn, "SELECT COALESCE(MAX(version), 0) FROM orpheus_schema_version", {});
    return static_cast<int>(int_or_zero(v.at(0).values.at(0)));
  });
}

}  // namespace orpheus
