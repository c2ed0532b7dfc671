#include "orpheus/client/journal.hpp"

#include <sqlite3.h>

#include <algorithm>
#include <mutex>
#include <stdexcept>

#include "orpheus/client/retry.hpp"
#include "orpheus/error.hpp"

namespace orpheus::client {

struct sqlite_key_journal::impl {
  sqlite3* db = nullptr;
  journal_options options;
  std::mutex m;  // one connection, used by one thread at a time

  void exec(const char* sql) {
    char* err = nullptr;
    if (sqlite3_exec(db, sql, nullptr, nullptr, &err) != SQLITE_OK) {
      std::string msg = err ? err : "unknown error";
      sqlite3_free(err);
      throw std::runtime_error(std::string("key journal: ") + sql + ": " + msg);
    }
  }

  // Runs one statement with text parameters; returns each row's columns
  // (NULL as empty).
  std::vector<std::vector<std::string>> rows(const char* sql,
                                             std::initializer_list<std::string_view> params) {
    sqlite3_stmt* s = nullptr;
    if (sqlite3_prepare_v2(db, sql, -1, &s, nullptr) != SQLITE_OK) {
      throw std::runtime_error(std::string("key journal: ") + sqlite3_errmsg(db));
    }
    int i = 1;
    for (const auto p : params) {
      // Never a null pointer: SQLite binds that as NULL, which no name
      // equals (found in review: a default-constructed string_view as the
      // name found no entry, and each run was given a new key).
      sqlite3_bind_text64(s, i++, p.data() != nullptr ? p.data() : "", p.size(), SQLITE_TRANSIENT,
                          SQLITE_UTF8);
    }
    std::vector<std::vector<std::string>> out;
    int rc = 0;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
      auto& row = out.emplace_back();
      for (int c = 0; c < sqlite3_column_count(s); ++c) {
        const auto* t = reinterpret_cast<const char*>(sqlite3_column_text(s, c));
        row.emplace_back(t ? t : "");
      }
    }
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE)
      throw std::runtime_error(std::string("key journal: ") + sqlite3_errmsg(db));
    return out;
  }
  // The first column of each row.
  std::vector<std::string> run(const char* sql, std::initializer_list<std::string_view> params) {
    std::vector<std::string> out;
    for (auto& row : rows(sql, params)) out.push_back(std::move(row.at(0)));
    return out;
  }
};

sqlite_key_journal::sqlite_key_journal(const std::string& path, journal_options options)
    : impl_(std::make_unique<impl>()) {
  if (options.resume_within.count() <= 0) {
    throw config_error("key journal: resume_within must be positive");
  }
  // Found in review: "" (SQLite's temporary database) and ":memory:" were
  // accepted, a journal that keeps nothing past the process.
  if (path.empty() || path == ":memory:" || path.rfind("file:", 0) == 0) {
    throw config_error("key journal: '" + path +
                       "' is not a file that outlives the process; give a file's path");
  }
  impl_->options = options;
  if (sqlite3_open(path.c_str(), &impl_->db) != SQLITE_OK) {
    const std::string msg = impl_->db ? sqlite3_errmsg(impl_->db) : "out of memory";
    sqlite3_close(impl_->db);
    throw std::runtime_error("key journal: cannot open " + path + ": " + msg);
  }
  sqlite3_busy_timeout(impl_->db, 5000);
  impl_->exec("PRAGMA journal_mode=WAL");
  impl_->exec("PRAGMA synchronous=FULL");  // a key must survive a crash once returned
  impl_->exec(
      "CREATE TABLE IF NOT EXISTS orpheus_client_keys (name TEXT PRIMARY KEY, idem_key TEXT NOT "
      "NULL, payload TEXT NOT NULL, created TEXT NOT NULL DEFAULT (datetime('now')), completed "
      "TEXT)");
  // A journal made before entries were kept once completed (they were
  // deleted): the column, NULL for every entry left, all of them pending.
  // Under the write lock, so that two processes opening it at once add it
  // once.
  impl_->exec("BEGIN IMMEDIATE");
  try {
    if (impl_
            ->run("SELECT name FROM pragma_table_info('orpheus_client_keys') WHERE name = "
                  "'completed'",
                  {})
            .empty()) {
      impl_->exec("ALTER TABLE orpheus_client_keys ADD COLUMN completed TEXT");
    }
    impl_->exec("COMMIT");
  } catch (...) {
    sqlite3_exec(impl_->db, "ROLLBACK", nullptr, nullptr, nullptr);
    sqlite3_close(impl_->db);
    throw;
  }
}

sqlite_key_journal::~sqlite_key_journal() { sqlite3_close(impl_->db); }

void key_journal::forget(std::string_view name) {
  throw std::logic_error("key journal: this journal cannot forget '" + std::string(name) + "'");
}

journal_entry key_journal::entry_for(std::string_view name, std::string_view payload_fingerprint) {
  const auto before = pending();
  const bool resumed = std::find(before.begin(), before.end(), name) != before.end();
  return {key_for(name, payload_fingerprint), resumed};
}

std::string sqlite_key_journal::key_for(std::string_view name, std::string_view payload) {
  return entry_for(name, payload).key;
}

journal_entry sqlite_key_journal::entry_for(std::string_view name, std::string_view payload) {
  if (name.empty()) {
    throw std::invalid_argument("key journal: a logical request needs a name, and '' is none");
  }
  std::lock_guard lock(impl_->m);
  impl_->exec("BEGIN IMMEDIATE");
  try {
    const auto found = impl_->rows(
        "SELECT idem_key, payload, completed, created, CAST((julianday('now') - "
        "julianday(created)) * 86400 AS INTEGER) FROM orpheus_client_keys WHERE name = ?",
        {name});
    std::string key;
    if (!found.empty()) {
      const auto& row = found[0];
      key = row.at(0);
      // Sending the key again reads the recorded answer only while the
      // server keeps the record; after that it is a new request (found in
      // review: the advice was given whatever the age).
      const bool young = std::stoll(row.at(4)) <= impl_->options.resume_within.count();
      if (!row.at(2).empty()) {
        throw request_completed(
            "key journal: '" + std::string(name) + "' was completed at " + row.at(2) +
            " UTC under key " + key +
            (young ? " (send that key to read its answer again while the server keeps it)"
                   : " (started longer ago than resume_within: the server may have purged its "
                     "record, and that key sent again would be a new request; do not send it)") +
            "; a new request needs a new name, or forget() of this one");
      }
      if (!young) {
        throw entry_too_old("key journal: '" + std::string(name) + "' was started at " + row.at(3) +
                            " UTC under key " + key +
                            ", longer ago than this journal resumes (resume_within): the "
                            "server may have purged its record, and the key sent again would "
                            "be a new request; find out what became of it, then complete() "
                            "or forget() it");
      }
      if (row.at(1) != payload) {
        throw payload_changed("key journal: '" + std::string(name) +
                              "' was started with another payload; a logical request's payload "
                              "can not change between attempts");
      }
    } else {
      key = new_idempotency_key();
      impl_->run("INSERT INTO orpheus_client_keys (name, idem_key, payload) VALUES (?, ?, ?)",
                 {name, key, payload});
    }
    impl_->exec("COMMIT");
    return {key, !found.empty()};
  } catch (...) {
    sqlite3_exec(impl_->db, "ROLLBACK", nullptr, nullptr, nullptr);
    throw;
  }
}

void sqlite_key_journal::complete(std::string_view name) {
  std::lock_guard lock(impl_->m);
  impl_->run(
      "UPDATE orpheus_client_keys SET completed = datetime('now') WHERE name = ? AND completed "
      "IS NULL",
      {name});
}

void sqlite_key_journal::forget(std::string_view name) {
  std::lock_guard lock(impl_->m);
  impl_->run("DELETE FROM orpheus_client_keys WHERE name = ?", {name});
}

std::vector<std::string> sqlite_key_journal::pending() {
  std::lock_guard lock(impl_->m);
  return impl_->run(
      "SELECT name FROM orpheus_client_keys WHERE completed IS NULL ORDER BY created, rowid", {});
}

}  // namespace orpheus::client
