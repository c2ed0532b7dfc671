// The store: what the application and the manager ask of the records, on any
// backend. The SQL is the record layer's (records.cpp); the backend runs it.
#include "orpheus/store.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "orpheus/detail/record_row.hpp"
#include "orpheus/detail/records.hpp"
#include "orpheus/log.hpp"
#include "orpheus/shard_map.hpp"
#include "sql_guard.hpp"

namespace orpheus {
namespace {

std::int64_t first_int(const sql_rows& rows) {
  return rows.empty() || rows.front().values.empty()
             ? 0
             : detail::int_or_zero(rows.front().values.front());
}

struct shard_place {
  std::int64_t index = 0;
  std::int64_t count = 0;
  friend bool operator==(const shard_place&, const shard_place&) = default;
};

/// Where `shard` belongs in a map of `count` shards.
shard_place place_of(std::size_t shard, std::size_t count) {
  return {static_cast<std::int64_t>(shard), static_cast<std::int64_t>(count)};
}

std::optional<shard_place> place_in(const sql_rows& rows) {
  if (rows.empty() || rows.front().values.size() < 2) return std::nullopt;
  return shard_place{detail::int_or_zero(rows.front().values[0]),
                     detail::int_or_zero(rows.front().values[1])};
}

std::string describe(const shard_place& p) {
  return "shard " + std::to_string(p.index) + " of " + std::to_string(p.count);
}

/// What migrate() says of a shard whose database records another place.
config_error another_map(std::size_t shard, std::size_t count, const shard_place& recorded,
                         std::string_view unchanged) {
  return config_error(
      "store: the database of shard " + std::to_string(shard) + " of this store's " +
      std::to_string(count) + " records itself as " + describe(recorded) +
      ": another process migrated it with other shards, or the same ones in another order. "
      "Two processes whose shard maps differ run a retry of one key as a new request on "
      "another shard (a second charge). Nothing was changed" +
      std::string(unchanged) +
      ". Give this process the shards "
      "the others have, in their order; for a planned change of the map, see "
      "docs/sharding.md (store::adopt_shard_map(), orpheusctl adopt-shard-map)");
}

/// The refusal of a store whose shard `shard` records `recorded` (nothing:
/// no row) instead of this store's place for it. Retryable, as for an old
/// schema: the request changed nothing, and the cure is a deploy (the right
/// shard list) or a migrate.
storage_error map_refusal(std::size_t shard, std::size_t count,
                          const std::optional<shard_place>& recorded, bool for_all) {
  return storage_error::transient(
      "store: shard " + std::to_string(shard) + " of this store's " + std::to_string(count) +
      (recorded ? " records itself as " + describe(*recorded) +
                      ": this process was given other shards, or the same ones in another "
                      "order, than the process that migrated it, and would look for a key on "
                      "another shard than theirs (docs/sharding.md)"
                : " records no shard map (no row in orpheus_shard_map): run migrate "
                  "(store::migrate(), orpheusctl migrate) before serving") +
      "; until then every request on " + (for_all ? "every shard" : "it") +
      " is refused and nothing is written");
}

std::int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

struct store::map_reader {
  std::mutex mutex;  // guards the two below
  std::condition_variable cv;
  bool wake = false;  // read at once (read_map_again(), a conflict on an agreed map)
  std::thread thread;
};

store::store(std::unique_ptr<store_backend> backend)
    : backend_(std::move(backend)),
      owner_pid_(::getpid()),
      reader_(std::make_unique<map_reader>()) {
  if (!backend_) throw config_error("store: no backend");
  if (backend_->shard_count() == 0) throw config_error("store: the backend has no shard");
  sql_ = std::make_unique<const detail::record_sql>(backend_->dialect());
  for (const auto& m : backend_->migrations())
    required_version_ = std::max(required_version_, m.version);
  checks_ = std::make_unique<shard_check[]>(backend_->shard_count());
}

store::~store() {
  if (::getpid() != owner_pid_) {
    // A forked child's copy of the parent's reader: no such thread here to
    // stop or join (destroying it joinable ends the process), a condition
    // variable the parent's thread was waiting on (destroying it waits for
    // that waiter, forever), a mutex perhaps locked (found in review: by a
    // request starting the reader as the fork happened). Left as it is.
    (void)reader_.release();
    return;
  }
  if (!reader_started_.load(std::memory_order_acquire)) return;
  // The reader uses the backend, which goes with this store.
  {
    const std::lock_guard lock(reader_->mutex);
    reader_stop_.store(true, std::memory_order_release);
  }
  reader_->cv.notify_all();
  reader_->thread.join();
}

std::size_t store::shard_count() const { return backend_->shard_count(); }

std::size_t store::shard_of(const request_id& id) const {
  return shard_for(id.scope, id.key, shard_count());
}

std::optional<record> store::read(const request_id& id) {
  const sql_value p[] = {id.scope, id.key};
  const std::size_t shard = shard_of(id);
  const auto rows = backend_for_records(shard).read(shard, sql_->read_fast, p);
  if (rows.empty()) return std::nullopt;
  return detail::record_from_fast_row(rows.front());
}

std::optional<record> store::inspect(const request_id& id) {
  const sql_value p[] = {id.scope, id.key};
  const std::size_t shard = shard_of(id);
  const auto rows = backend_for_records(shard).read(shard, sql_->inspect, p);
  if (rows.empty()) return std::nullopt;
  return detail::record_from_row(rows.front(), true);
}

namespace {

/// The application's own transaction: the backend's, with statements that
/// would end it or leave state on the pooled connection refused
/// (detail::refuse_session_escape(); found in review: SET autocommit = 1
/// stayed on a MySQL connection for the library's later transactions, and a
/// COMMIT statement ended the SQLite writer's batch under other requests).
class own_transaction final : public transaction {
 public:
  explicit own_transaction(std::unique_ptr<backend_tx> t) : t_(std::move(t)) {}
  sql_rows query_values(std::string_view sql, std::span<const sql_value> params) override {
    detail::refuse_session_escape(sql);
    return t_->query_values(sql, params);
  }
  std::uint64_t execute_values(std::string_view sql, std::span<const sql_value> params) override {
    detail::refuse_session_escape(sql);
    return t_->execute_values(sql, params);
  }
  [[nodiscard]] std::size_t shard() const override { return t_->shard(); }
  void commit() override { t_->commit(); }
  void rollback() noexcept override { t_->rollback(); }

 private:
  std::unique_ptr<backend_tx> t_;
};

}  // namespace

void store::check_shard(std::size_t shard) const {
  if (shard >= shard_count()) {
    throw storage_error::permanent("store: no shard " + std::to_string(shard) + " (there are " +
                                   std::to_string(shard_count()) + ")");
  }
}

std::unique_ptr<transaction> store::begin_on_shard(std::size_t shard) {
  check_shard(shard);
  return std::make_unique<own_transaction>(backend_->begin(shard));
}

std::size_t store::purge_expired(std::size_t shard, std::size_t limit) {
  auto t = std::make_unique<own_transaction>(backend_for_records(shard).begin(shard));
  // The records, locked, then their history and them, by key (records.cpp).
  std::vector<std::pair<std::string, std::string>> all;
  std::vector<std::pair<std::string, std::string>> with_history;
  // A limit past int64 (SIZE_MAX, "all") became LIMIT -1: no limit on
  // SQLite, an error on MySQL (found in review).
  const auto bounded = static_cast<std::int64_t>(
      std::min<std::size_t>(limit, std::numeric_limits<std::int64_t>::max()));
  for (const auto& row : t->query(sql_->purge_select, bounded)) {
    const auto& v = row.values;
    std::pair key{std::get<std::string>(v.at(0)), std::get<std::string>(v.at(1))};
    if (detail::int_or_zero(v.at(2)) != 0) with_history.push_back(key);
    all.push_back(std::move(key));
  }
  std::size_t n = 0;
  const auto delete_by_key = [&](const std::string& sql,
                                 const std::vector<std::pair<std::string, std::string>>& keys) {
    for (std::size_t i = 0; i < keys.size(); i += detail::purge_chunk) {
      std::vector<sql_value> p;
      p.reserve(2 * detail::purge_chunk);
      for (std::size_t k = 0; k < detail::purge_chunk; ++k) {
        const auto& key = keys[std::min(i + k, keys.size() - 1)];
        p.emplace_back(key.first);
        p.emplace_back(key.second);
      }
      n += t->execute_values(sql, p);
    }
  };
  delete_by_key(sql_->purge_history_of, with_history);
  delete_by_key(sql_->purge_records_of, all);
  t->commit();
  return n;
}

void store::migrate() {
  read_every_place(false);
  for (std::size_t s = 0; s < shard_count(); ++s) migrate_shard(s, false);
}

void store::migrate_shard(std::size_t shard) {
  check_shard(shard);
  read_every_place(false);  // the example server migrates shard by shard
  migrate_shard(shard, false);
}

void store::adopt_shard_map() {
  read_every_place(true);
  for (std::size_t s = 0; s < shard_count(); ++s) migrate_shard(s, true);
  // Read back: one database given under two names (a host name and its
  // address) took both places, the later one winning, and the adopt said
  // nothing while the store refused every request, naming another
  // process's map.
  for (std::size_t s = 0; s < shard_count(); ++s) {
    const auto recorded = place_in(backend_->read(s, sql_->read_shard_map, {}));
    if (recorded != place_of(s, shard_count())) {
      throw config_error(
          "store: after adopt_shard_map(), the database of shard " + std::to_string(s) +
          " of this store's " + std::to_string(shard_count()) +
          (recorded ? " records itself as " + describe(*recorded) : std::string(" has no row")) +
          ": two shards of this store are one database, given under two names (a host name and "
          "its address, say), or another process migrated or adopted a map meanwhile. The "
          "store refuses requests until its map agrees: list each database once, stop the "
          "other process, and adopt again");
    }
  }
}

void store::read_every_place(bool adopt) {
  // Before anything is written (found in review: a migrate refused at its
  // second shard had already recorded its map on the first, and said
  // "nothing was changed"; an adopt with a shard down left two shards
  // claiming one place).
  const sql_value map_table[] = {std::string("orpheus_shard_map")};
  for (std::size_t s = 0; s < shard_count(); ++s) {
    std::optional<shard_place> recorded;
    try {
      if (first_int(backend_->read(s, sql_->count_tables, map_table)) != 0) {
        recorded = place_in(backend_->read(s, sql_->read_shard_map, {}));
      }
    } catch (const storage_error&) {
      if (adopt) throw;  // every shard of the new map answers, or none is written
      continue;          // its migrate_shard() below fails too, and says why
    }
    if (!adopt && recorded && *recorded != place_of(s, shard_count())) {
      // The requests of this store are refused too (found in review: the
      // example server, which migrates a shard late while serving the
      // others, only logged it).
      publish_whole_map(steady_ns(), map_refusal(s, shard_count(), recorded, true), false);
      throw another_map(s, shard_count(), *recorded, " on any shard");
    }
  }
}

void store::recheck_shard_map_every(std::chrono::milliseconds every) {
  if (every.count() < 0 || every > std::chrono::hours(24)) {
    throw config_error("store: the shard map recheck interval must be 0 to 24 hours");
  }
  map_recheck_ns_.store(std::chrono::nanoseconds(every).count(), std::memory_order_relaxed);
  read_map_again();  // and the reader at once, on its new interval
}

void store::read_map_again() {
  // Found in review: after an adopt in this process, the whole map's last
  // verdict (a conflict, say) held until its old due time.
  for (std::size_t s = 0; s < shard_count(); ++s) {
    checks_[s].map_checked_until_ns.store(0, std::memory_order_release);
  }
  whole_map_agreed_.store(false, std::memory_order_release);
  // Found in review: with the map reader, the first request after a new
  // interval went on with a verdict as old as the interval had been (an
  // hour's, from 0 to 10 s on an idle service), while the reader read.
  read_on_request_.store(true, std::memory_order_release);
  whole_map_due_ns_.store(0, std::memory_order_release);
  wake_map_reader();
}

void store::wake_map_reader() {
  if (::getpid() != owner_pid_) return;  // a forked child: the lock may be held for ever
  {
    const std::lock_guard lock(reader_->mutex);
    reader_->wake = true;
  }
  reader_->cv.notify_all();
}

void store::migrate_shard(std::size_t shard, bool adopt_map) {
  check_shard(shard);
  const auto migrations = backend_->migrations();
  const shard_place mine = place_of(shard, shard_count());
  backend_->exclusively(shard, [&](tx& t) {
    t.execute(sql_->create_version_table);
    // The recorded map is checked before any DDL: on MySQL, DDL commits by
    // itself, and a refused migrate changes nothing.
    const sql_value map_table[] = {std::string("orpheus_shard_map")};
    std::optional<shard_place> recorded;
    if (first_int(t.query_values(sql_->count_tables, map_table)) != 0) {
      recorded = place_in(t.query(sql_->read_shard_map));
    }
    if (recorded && *recorded != mine && !adopt_map) {
      throw another_map(shard, shard_count(), *recorded, " on this shard");
    }
    const std::int64_t current = first_int(t.query(sql_->max_version));
    // Each file is recorded as soon as it is applied: where DDL is not
    // transactional (MySQL), a failed run resumes at the file that failed.
    for (const auto& m : migrations) {
      if (m.version <= current) continue;
      for (const auto& statement : detail::split_statements(m.sql)) {
        // Found in review: on MySQL a run that stopped after a statement's
        // DDL but before the file's version row (a kill, or a lost
        // connection while the server finished an index build) could never
        // be run again (a duplicate column, an index already dropped), and
        // the shard stayed refused until someone repaired it by hand.
        try {
          t.execute(statement);
        } catch (const storage_error& e) {
          if (!backend_->already_applied(e)) throw;
          log(log_level::warning, "migration " + std::to_string(m.version) + " on shard " +
                                      std::to_string(shard) +
                                      ": a statement found its work done (an earlier run "
                                      "stopped part way), going on: " +
                                      e.what());
        }
      }
      t.execute(sql_->add_version, m.version, m.name);
    }
    if (!recorded) {
      t.execute(sql_->record_shard_map, mine.index, mine.count);
    } else if (*recorded != mine) {
      t.execute(sql_->replace_shard_map, mine.index, mine.count);
    }
  });
  // This process's own checks start again (an adopted map, a first one).
  read_map_again();
}

void store::check_recorded_map(std::size_t shard, std::int64_t now_ns) {
  // One shard is the whole map.
  if (shard_count() > 1 && !whole_map_agreed_.load(std::memory_order_acquire)) {
    check_whole_map(now_ns);
  }
  std::optional<shard_place> recorded;
  try {
    recorded = place_in(backend_->read(shard, sql_->read_shard_map, {}));
  } catch (const storage_error& e) {
    if (e.retryable()) throw;
    // Refused like a shard with no row, retryable (found in a session's
    // notes: a user without SELECT on the table got a permanent error, 500,
    // on every request, which tells clients to give up on payments that go
    // through once the grant is fixed; the schema check already reads such
    // a table as version 0).
    throw storage_error::transient(
        "store: shard " + std::to_string(shard) + "'s place in the shard map could not be read (" +
        e.what() +
        "); a user without SELECT on orpheus_shard_map gets this (docs/schema.md). Until it "
        "can be read, every request on it is refused and nothing is written");
  }
  if (!recorded) throw map_refusal(shard, shard_count(), recorded, false);
  if (*recorded != place_of(shard, shard_count())) {
    // Another map's place: this process routes keys as no other does, on
    // every shard, not this one alone (found in review: after an adopt of
    // [x] from [x, y], a straggler of the old map refused x at its own
    // check but went on serving y, where it looked for keys the new map
    // puts on x). Every shard is refused at once, as when a reading of the
    // whole map finds it.
    const bool every_shard = shard_count() > 1;  // one shard is the whole map
    auto refusal = map_refusal(shard, shard_count(), recorded, every_shard);
    if (every_shard) {
      publish_whole_map(steady_ns(), refusal, false);
      log(log_level::error, refusal.what());
    }
    throw refusal;
  }
}

void store::check_whole_map(std::int64_t now_ns) {
  // Each shard checked alone is not enough: two processes given [x, y] and
  // [y, x] that each migrated only their first shard would both find it
  // "shard 0 of 2", and serve one key on x and on y. So every shard's place
  // is read, once per recheck interval, until one reading finds every shard
  // answering and agreeing (found in review: a shard down at the first
  // reading was never read again; and a reading that passed over the
  // requesting shard was taken for the whole map).
  const std::int64_t every = map_recheck_ns_.load(std::memory_order_relaxed);
  std::int64_t due = whole_map_due_ns_.load(std::memory_order_acquire);
  const bool my_turn =
      now_ns >= due && whole_map_due_ns_.compare_exchange_strong(due, now_ns + every);
  const auto read_here = [&] {
    read_on_request_.store(false, std::memory_order_release);  // this is it
    const auto conflict = read_whole_map();
    if (every > 0 && !whole_map_agreed_.load(std::memory_order_acquire)) start_map_reader(now_ns);
    if (conflict) throw *conflict;
  };
  // Until a first reading has finished, every request makes one and waits
  // for it: none is served on a map not read yet.
  if (!whole_map_checked_.load(std::memory_order_acquire)) return read_here();
  // After that the map reader reads it, once per interval whether requests
  // come or not, and requests go on with the last verdict (found in a
  // session's review: the request that found the interval over read every
  // shard itself, and with a shard gone it waited for each node's connects,
  // twice, perhaps in its second transaction after the charge, long enough
  // to lose its lease; and in the next review: a reading started by a
  // request, not waited for, left the verdict as old as the last request
  // after an idle spell). One request per interval still reads and waits:
  // with an interval of 0 (every request, as asked); without a reader (no
  // thread, a forked child); while the last verdict is a conflict (such a
  // request is refused otherwise, and the reading may clear it: after an
  // adopt here, found in a test); and when asked (read_map_again(), a
  // reading of the reader's that failed).
  const bool reader = every > 0 && start_map_reader(now_ns);
  if (my_turn && (!reader || whole_map_conflict_.load(std::memory_order_acquire) ||
                  read_on_request_.exchange(false, std::memory_order_acq_rel))) {
    return read_here();
  }
  if (whole_map_conflict_.load(std::memory_order_acquire)) {
    const std::lock_guard lock(whole_map_mutex_);
    if (whole_map_conflict_.load(std::memory_order_relaxed)) {  // not cleared meanwhile
      throw storage_error::transient(whole_map_conflict_text_);
    }
  }
}

std::optional<storage_error> store::read_whole_map(const std::atomic<bool>* stop) {
  const std::int64_t started_ns = steady_ns();  // not the request's: the schema check may be slow
  bool every_one_agreed = true;
  std::optional<storage_error> conflict;
  for (std::size_t s = 0; s < shard_count() && !conflict; ++s) {
    if (stop != nullptr && stop->load(std::memory_order_acquire)) return std::nullopt;
    std::optional<shard_place> recorded;
    try {
      recorded = place_in(backend_->read(s, sql_->read_shard_map, {}));
    } catch (const storage_error&) {
      every_one_agreed = false;  // down, or not migrated: read again next time
      continue;
    }
    if (!recorded) {
      every_one_agreed = false;
    } else if (*recorded != place_of(s, shard_count())) {
      conflict = map_refusal(s, shard_count(), recorded, true);
    }
  }
  publish_whole_map(started_ns, conflict, every_one_agreed);
  if (conflict) log(log_level::error, conflict->what());
  return conflict;
}

bool store::start_map_reader(std::int64_t now_ns) {
  if (::getpid() != owner_pid_) return false;  // a forked child has no reader, nor its lock
  if (reader_started_.load(std::memory_order_acquire)) return true;
  if (now_ns < reader_retry_ns_.load(std::memory_order_relaxed)) return false;
  std::optional<std::string> failure;
  {
    const std::lock_guard lock(reader_->mutex);
    if (reader_started_.load(std::memory_order_acquire)) return true;  // another request's
    try {
      reader_->thread = std::thread([this] { read_map_every_interval(); });
      reader_started_.store(true, std::memory_order_release);
    } catch (const std::exception& e) {  // system_error, bad_alloc
      // Found in review: tried again on every request, each taking the lock
      // and logging.
      const std::int64_t every = map_recheck_ns_.load(std::memory_order_relaxed);
      reader_retry_ns_.store(now_ns + std::max<std::int64_t>(every, 1'000'000'000),
                             std::memory_order_relaxed);
      failure = e.what();
    }
  }
  if (failure) {  // logged outside the lock: a sink may be slow
    log(log_level::warning, "store: no thread for the shard map's reader (" + *failure +
                                "); requests read it themselves");
    return false;
  }
  return true;
}

void store::read_map_every_interval() {
  std::unique_lock lock(reader_->mutex);
  for (;;) {
    const std::int64_t every = map_recheck_ns_.load(std::memory_order_relaxed);
    const auto woken = [this] {
      return reader_stop_.load(std::memory_order_acquire) || reader_->wake;
    };
    // Interval 0: the requests read it. Agreed: nothing to read until a
    // conflict or read_map_again() wakes it (found in review: it woke every
    // interval only to find the map agreed).
    if (every == 0 || whole_map_agreed_.load(std::memory_order_acquire)) {
      reader_->cv.wait(lock, woken);
    } else {
      reader_->cv.wait_for(lock, std::chrono::nanoseconds(every), woken);
    }
    if (reader_stop_.load(std::memory_order_acquire)) return;
    reader_->wake = false;
    if (map_recheck_ns_.load(std::memory_order_relaxed) == 0 ||
        whole_map_agreed_.load(std::memory_order_acquire)) {
      continue;
    }
    lock.unlock();
    try {
      (void)read_whole_map(&reader_stop_);  // it publishes what it finds
    } catch (const std::exception& e) {
      // Nothing published: the next turn's request reads and waits (found
      // in review: the verdict went on ageing with no request refused).
      read_on_request_.store(true, std::memory_order_release);
      log(log_level::error, std::string("store: reading the shard map failed: ") + e.what());
    }
    lock.lock();
  }
}

void store::publish_whole_map(std::int64_t started_ns, const std::optional<storage_error>& conflict,
                              bool every_one_agreed) {
  bool was_agreed = false;
  {
    const std::lock_guard lock(whole_map_mutex_);
    was_agreed = whole_map_agreed_.load(std::memory_order_relaxed);
    if (conflict) {
      // A conflict always speaks, and every shard's own check, which might
      // have let requests through until its next due time, is due at once
      // (found in review: a conflict found by one shard's request left the
      // other shards served for up to an interval).
      whole_map_conflict_text_ = conflict->info().internal;
      whole_map_conflict_found_ns_ = steady_ns();
      whole_map_agreed_.store(false, std::memory_order_release);
      whole_map_conflict_.store(true, std::memory_order_release);
      for (std::size_t s = 0; s < shard_count(); ++s) {
        checks_[s].map_checked_until_ns.store(0, std::memory_order_release);
      }
    } else if (started_ns > whole_map_conflict_found_ns_) {
      // Readings may overlap (one slowed by a shard that does not answer): a
      // "no conflict" clears a conflict only when it began after that
      // conflict was found (found in review: an older reading's "no
      // conflict" overwrote a newer one's conflict).
      whole_map_conflict_.store(false, std::memory_order_release);
      if (every_one_agreed) whole_map_agreed_.store(true, std::memory_order_release);
    }
    whole_map_checked_.store(true, std::memory_order_release);
  }
  // The reader waits without a timeout while the map agrees.
  if (conflict && was_agreed) wake_map_reader();
}

store_backend& store::backend_for_records(std::size_t shard) {
  check_shard(shard);
  shard_check& checked = checks_[shard];
  const std::int64_t now = steady_ns();
  if (now < checked.map_checked_until_ns.load(std::memory_order_acquire)) return *backend_;
  if (!checked.schema_current.load(std::memory_order_acquire)) {
    check_schema_version(shard);
    checked.schema_current.store(true, std::memory_order_release);
  }
  check_recorded_map(shard, now);
  {
    // Under the lock a conflict is published with: a conflict found while
    // this check ran (by another request's reading of the whole map, or a
    // migrate) made every shard's check due at once, and must not be
    // overwritten by this check's "checked until" (found in review: the
    // shard was then served unchecked for another interval). A store of one
    // shard has no whole map to clear such a verdict: its own check speaks.
    const std::lock_guard lock(whole_map_mutex_);
    if (shard_count() > 1 && whole_map_conflict_.load(std::memory_order_relaxed)) {
      throw storage_error::transient(whole_map_conflict_text_);
    }
    checked.map_checked_until_ns.store(now + map_recheck_ns_.load(std::memory_order_relaxed),
                                       std::memory_order_release);
  }
  return *backend_;
}

void store::check_schema_version(std::size_t shard) {
  const int have = required_version_ == 0 ? 0 : schema_version(shard);
  if (have < required_version_) {
    // Retryable, unlike other refusals of the server (docs/mysql.md): the
    // request changed nothing, and the cure is known and on its way (a
    // deploy that migrates); clients told not to retry would drop payments
    // that go through once it has.
    throw storage_error::transient(
        "store: shard " + std::to_string(shard) + " has schema version " + std::to_string(have) +
        ", older than the version " + std::to_string(required_version_) +
        " this library needs: run migrate (store::migrate(), orpheusctl migrate) before "
        "serving; until then every request is refused and nothing is written" +
        (have == 0 ? std::string(" (version 0: no row in orpheus_schema_version, or no SELECT "
                                 "on it for this user; a schema applied by hand records its "
                                 "files there, docs/schema.md)")
                   : std::string()));
  }
}

int store::schema_version(std::size_t shard) {
  check_shard(shard);
  const sql_value table[] = {std::string("orpheus_schema_version")};
  if (first_int(backend_->read(shard, sql_->count_tables, table)) == 0) return 0;
  return static_cast<int>(first_int(backend_->read(shard, sql_->max_version, {})));
}

}  // namespace orpheus
