#include "connection.hpp"

#include "errors.hpp"

namespace orpheus::sqlite_detail {
namespace {

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

}  // namespace

void throw_sqlite(sqlite3* db, int rc, std::string_view what, bool in_commit) {
  std::string msg = "sqlite: ";
  msg.append(what).append(": ").append(db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
  const verdict v = judge(rc, in_commit);
  if (v.retryable) throw storage_error::transient(std::move(msg), v.in_doubt);
  throw storage_error::permanent(std::move(msg));
}

connection::connection(const sqlite_options& o) {
  const int rc =
      sqlite3_open_v2(o.path.c_str(), &db_,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db_ ? sqlite3_errmsg(db_) : sqlite3_errstr(rc);
    sqlite3_close(db_);
    db_ = nullptr;
    throw storage_error::transient("sqlite: cannot open " + o.path + ": " + msg);
  }
  // SQLite opens a file it may not write read-only, without a word (found
  // in review: the store started, and every write failed).
  if (sqlite3_db_readonly(db_, "main") == 1) {
    sqlite3_close(db_);
    db_ = nullptr;
    throw storage_error::transient("sqlite: " + o.path +
                                   " can only be opened read-only (its permissions, or a "
                                   "read-only file system); nothing was written");
  }
  // Closed again on every refusal below (found in review: a PRAGMA that
  // failed, on a file that is not a database or on an I/O error, left the
  // handle and its descriptors open, one more per attempt: a read pool
  // retrying through an outage ran out of descriptors).
  try {
    // The busy handler only matters between processes now: threads of this
    // process take turns on one writer connection (single_writer).
    sqlite3_busy_timeout(db_, static_cast<int>(o.busy_timeout.count()));
    // The PRAGMA answers with the mode it got, which is not always WAL (a
    // file on a file system without shared memory, an in-memory database):
    // the durability and concurrency this store promises rest on WAL.
    const std::string mode = query_text("PRAGMA journal_mode=WAL");
    if (mode != "wal") {
      throw config_error("sqlite: " + o.path + " cannot be put in WAL mode (it is in '" + mode +
                         "' mode)");
    }
    exec("PRAGMA synchronous=FULL");
    exec("PRAGMA foreign_keys=ON");
  } catch (...) {
    cache_.clear();
    sqlite3_close(db_);
    db_ = nullptr;
    throw;
  }
}

connection::~connection() {
  cache_.clear();  // statements are finalized before their connection closes
  sqlite3_close(db_);
}

void connection::exec(const char* sql) {
  char* err = nullptr;
  const int rc = sqlite3_exec(db_, sql, nullptr, nullptr, &err);
  sqlite3_free(err);
  if (rc != SQLITE_OK) throw_sqlite(db_, rc, sql);
}

void connection::exec_cached(std::string_view sql) {
  sqlite3_stmt* s = prepare(sql);
  const int rc = sqlite3_step(s);
  sqlite3_reset(s);
  if (rc != SQLITE_DONE) throw_sqlite(db_, rc, sql);
}

std::string connection::query_text(const char* sql) {
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

// Prepared statements are cached per connection: one prepare per SQL text.
sqlite3_stmt* connection::prepare(std::string_view sql) {
  if (sqlite3_stmt* cached = cache_.find(sql)) {
    sqlite3_reset(cached);
    sqlite3_clear_bindings(cached);
    return cached;
  }
  sqlite3_stmt* stmt = nullptr;
  const char* tail = nullptr;
  const int rc = sqlite3_prepare_v2(db_, sql.data(), static_cast<int>(sql.size()), &stmt, &tail);
  if (rc != SQLITE_OK) throw_sqlite(db_, rc, "prepare");
  statement first(stmt);
  // One statement per call (found in review: SQLite prepares the first of
  // several and ignores the rest, so a handler's second statement was
  // dropped without a word, while MySQL refuses such text). What follows it
  // may only be blanks and comments: preparing those gives no statement.
  const auto rest = static_cast<int>(sql.data() + sql.size() - tail);
  sqlite3_stmt* next = nullptr;
  const int more = rest > 0 ? sqlite3_prepare_v2(db_, tail, rest, &next, nullptr) : SQLITE_OK;
  const statement second(next);
  if (!first || more != SQLITE_OK || second) {
    throw storage_error::permanent(
        std::string("sqlite: ") +
        (first ? "the SQL text holds more than one statement; run each on its own"
               : "the SQL text holds no statement"));
  }
  return cache_.add(sql, std::move(first));
}

sql_rows connection::run(std::string_view sql, std::span<const sql_value> params) {
  sqlite3_stmt* s = prepare(sql);
  bind(db_, s, params);
  sql_rows rows;
  for (;;) {
    const int rc = sqlite3_step(s);
    if (rc == SQLITE_DONE) break;
    if (rc != SQLITE_ROW) {
      sqlite3_reset(s);
      throw_sqlite(db_, rc, "step");
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

}  // namespace orpheus::sqlite_detail
