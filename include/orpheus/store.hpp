// The idempotency records and the store that keeps them.
//
// The core decides the state machine (docs/state-machine.md) and writes its
// SQL once (src/records.cpp); a backend (backend.hpp) only runs short, fenced
// statements against the master of the key's shard and reports failures as
// orpheus::storage_error, classified in one place per backend. Times are
// microseconds since the Unix epoch on the DATABASE's clock: every statement
// that sets or compares a lease time computes "now" in SQL, and every read
// returns that "now" so the core can compare on the same clock.
//
// Backends: orpheus/store/sqlite.hpp (embedded default), orpheus/store/mysql.hpp
// (production, sharded). Both pass tests/integration/conformance_test.cpp.
//
// Thread safety: a store is shared by all threads; a transaction belongs to
// the one thread that began it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "orpheus/backend.hpp"
#include "orpheus/request.hpp"
#include "orpheus/tx.hpp"

namespace orpheus {

enum class record_state {
  in_progress = 1,  ///< a lease is held until lease_expires_us
  retryable = 2,    ///< the last attempt failed safely; no lease
  succeeded = 3,    ///< terminal: the response is recorded
  failed = 4,       ///< terminal, non-retryable: the error is recorded
  /// Out of attempts or out of its retry window: waits for a person
  /// (orpheus/admin.hpp, orpheusctl) to requeue or resolve it. No lease; not
  /// terminal; never purged; clients retrying it are told to come back later.
  parked = 5,
};

[[nodiscard]] constexpr bool is_terminal(record_state s) noexcept {
  return s == record_state::succeeded || s == record_state::failed;
}
[[nodiscard]] std::string_view to_string(record_state s) noexcept;

/// One idempotency record, as read from its shard.
struct record {
  record_state state = record_state::in_progress;
  std::string fingerprint;
  int attempts = 0;
  std::string lease_owner;            ///< empty when no lease is held
  std::int64_t lease_expires_us = 0;  ///< 0 when no lease is held
  std::string pre_state;              ///< JSON of the Pre-RPC result
  std::string recovery_point;
  response recorded;  ///< meaningful in terminal states
  std::string last_error;
  std::int64_t created_us = 0;
  std::int64_t updated_us = 0;
  std::int64_t retry_until_us = 0;  ///< end of the retry window
  std::int64_t expires_us = 0;      ///< retention deadline (terminal only)
  std::int64_t db_now_us = 0;       ///< the database clock when read
  /// Attempts made before the last requeue: only later ones count against
  /// config::max_attempts. `attempts` itself never goes down, so a requeued
  /// request's next attempt is still a retry (attempt::is_retry()).
  int attempts_before_requeue = 0;
  /// The registered handler that can finish the request without its client
  /// (manager::register_handler); empty: only its client can.
  std::string handler;
  int handler_version = 0;
  /// When the completer may try it next, database clock; 0: never (finished,
  /// parked, or written before schema version 3).
  std::int64_t next_attempt_us = 0;
  /// How long the finished record is to be kept, as the request asked when
  /// it was made (process_options::retention); 0 when written before schema
  /// version 3.
  std::int64_t retention_us = 0;
  /// Until when a call downstream whose outcome was unknown (in doubt, or an
  /// attempt that never finished) may still land, database clock
  /// (config::in_doubt_window): a spent budget does not park the record
  /// before it, and admin resolve and cancel refuse it. 0: every attempt
  /// finished with a known outcome (or none since schema version 5).
  std::int64_t in_doubt_until_us = 0;
};

/// Lease and retention figures a write needs, in microseconds.
struct lease_terms {
  std::int64_t lease_us = 0;
  std::int64_t retry_window_us = 0;
  std::int64_t retention_us = 0;
  /// config::in_doubt_window: how long after an attempt's lease its call may
  /// still land downstream (record::in_doubt_until_us).
  std::int64_t in_doubt_window_us = 0;
};

namespace detail {
struct record_sql;
}

/// The idempotency records of every shard, on one backend. The application
/// constructs a backend's store (sqlite_store, mysql_store), migrates it and
/// hands it to the manager; the record state machine's SQL lives in the
/// core (src/records.cpp), once for every backend.
class store {
 public:
  /// Takes `backend` over. Throws config_error when it is null.
  explicit store(std::unique_ptr<store_backend> backend);
  store(const store&) = delete;
  store& operator=(const store&) = delete;
  /// Stops the map reader (backend_for_records()), waiting for the shard
  /// it is reading: with that shard gone, up to its connects, and for one
  /// that is frozen, a read's timeouts. The reader uses only the backend;
  /// a derived store's backend must not use the derived store's members.
  ///
  /// A store is not carried across fork(): make it in the process that
  /// uses it (its connections do not survive a fork, nor does the reader;
  /// a forked child's requests read the map themselves, and its destructor
  /// leaves the parent's reader, its thread and its lock, as they are).
  virtual ~store();

  [[nodiscard]] std::size_t shard_count() const;
  /// The shard that owns (scope, key); see shard_map.hpp.
  [[nodiscard]] std::size_t shard_of(const request_id& id) const;
  /// The replay fast path: one read from the key's master, no transaction.
  /// Loads what the decision and a replay need: state, fingerprint, attempts,
  /// lease, recorded response, the database clock, and expires_us (how long
  /// a replay cache may keep it). The other fields are left empty (see
  /// inspect()).
  std::optional<record> read(const request_id& id);
  /// The whole record, for tools and tests; no transaction.
  std::optional<record> inspect(const request_id& id);
  /// Opens a transaction on a shard, for the application's own set-up
  /// (tables next to the records). Throws storage_error for a shard that
  /// does not exist. End it with commit() or rollback(): statements that
  /// would end it (COMMIT, ROLLBACK, BEGIN, ...), lock tables, or leave state
  /// on the pooled connection (SET of anything but a user variable, USE) are
  /// refused with a permanent storage_error. On SQLite one thread holds at
  /// most one transaction of a store at a time (the writer is one
  /// connection): a second, or a request, begun on the thread before the
  /// first ends is refused with a permanent storage_error whose code is
  /// codes::nested_transaction (final whatever the key a request holds).
  std::unique_ptr<transaction> begin_on_shard(std::size_t shard);
  /// Deletes at most `limit` records of `shard` whose retention deadline has
  /// passed (never one under a live lease, never a parked one), oldest
  /// first, with their history, in one transaction. Returns how many rows
  /// were deleted (records and history): 0 when there is nothing left.
  std::size_t purge_expired(std::size_t shard, std::size_t limit);
  /// Applies the schema migrations this library version ships that a
  /// shard's schema version table does not list yet, on every shard, and
  /// records this store's shard map in each shard's database: shard i of
  /// shard_count() (orpheus_shard_map, docs/sharding.md). Every shard's
  /// recorded place is read first: when one that answers records another
  /// (it was migrated by a process given other shards, or the same ones in
  /// another order), this throws config_error and nothing is written on
  /// any shard. Two processes that route a key to different shards each run
  /// a retry of it as a new request. A planned change of the map goes
  /// through adopt_shard_map().
  void migrate();
  /// The same on one shard (after reading every shard's recorded place, as
  /// migrate() does): a service may start with the shards that answer and
  /// migrate the others when they come back (until then the record
  /// statements refuse them: backend_for_records()).
  void migrate_shard(std::size_t shard);
  /// migrate(), but a shard that records another map is given this store's:
  /// for a planned change of the shard map only, once every server of the
  /// old map has stopped and the keys that move are dealt with
  /// (docs/sharding.md, "Resharding"). Every shard must answer first, or
  /// nothing is written. A server still running with the old map refuses
  /// requests within the recheck interval (recheck_shard_map_every()) on
  /// each shard recorded anew, not on one the new map leaves out; what it
  /// ran before then, it ran on its old map. Every shard's place is read
  /// back at the end: config_error when one records another (two shards of
  /// this store are one database under two names, or another process wrote
  /// a map meanwhile); storage_error when a shard cannot be read then (the
  /// adopt may have taken: run it again).
  void adopt_shard_map();
  /// How often a shard's recorded map is read again once it was found to
  /// agree (10 s unless set): one read per shard per interval, on the
  /// request that finds the interval over; and the whole map's, by the map
  /// reader (backend_for_records()). 0 (every request, on the request) to
  /// 24 hours; config_error otherwise.
  void recheck_shard_map_every(std::chrono::milliseconds every);
  /// The highest applied schema version of a shard (0 before any).
  int schema_version(std::size_t shard);
  /// The schema version the record statements of this library version
  /// need: the last migration its backend ships.
  [[nodiscard]] int required_schema_version() const noexcept { return required_version_; }

  /// The backend, for the application's own statements, migrations and
  /// tests. The record statements go through backend_for_records().
  [[nodiscard]] store_backend& backend() noexcept { return *backend_; }
  [[nodiscard]] const store_backend& backend() const noexcept { return *backend_; }
  /// The backend, to run the record statements on `shard`. Before the
  /// record statements reach a shard, two things are checked, by reads:
  /// - its schema version, until it is found current (then never again in
  ///   this store's life: a schema only moves forward). If it is older than
  ///   required_schema_version() (a binary deployed before `migrate`), the
  ///   record statements would name columns the schema lacks;
  /// - its recorded place in the shard map (see migrate()), again each
  ///   recheck interval (recheck_shard_map_every()); and, in a store of
  ///   more than one shard, the places of every shard, until one reading
  ///   finds every shard answering and agreeing. Until a first reading has
  ///   finished, every request makes one and waits for it (a shard that
  ///   does not answer costs it two tries to connect). After that, the map
  ///   reader, a thread of the store's own, reads it once per interval
  ///   (whether requests come or not), and requests go on with the last
  ///   reading's verdict, so a shard that is gone holds no request (one
  ///   that may have charged already) for its connects. Requests still read
  ///   it themselves, one per interval, and wait: with an interval of 0;
  ///   while the last reading found a conflict (they are refused
  ///   otherwise); normally the first after a migrate or adopt here or a
  ///   new interval; after a reading of the reader's failed with something
  ///   other than a storage_error; and when no thread could be started
  ///   (tried again once per interval) or in a forked child. A shard that
  ///   records no place, or another one, would let a key's retry run on a
  ///   shard where another process does not look; a shard that answers
  ///   with another place refuses them all.
  /// Either way this throws a retryable storage_error (storage_unavailable)
  /// that says what differs, and keeps refusing until it is fixed: nothing
  /// is written. A read that fails throws as read() does.
  store_backend& backend_for_records(std::size_t shard);
  /// The record state machine's SQL in this backend's dialect.
  [[nodiscard]] const detail::record_sql& statements() const noexcept { return *sql_; }

 private:
  /// Throws a permanent storage_error for a shard that does not exist.
  void check_shard(std::size_t shard) const;
  void migrate_shard(std::size_t shard, bool adopt_map);
  /// Each throws a retryable storage_error unless `shard`'s database has
  /// the schema version this library needs, or records this store's map.
  void check_schema_version(std::size_t shard);
  void check_recorded_map(std::size_t shard, std::int64_t now_ns);
  /// Every shard's recorded place, until they all answered and agreed once.
  void check_whole_map(std::int64_t now_ns);
  /// Reads every shard's place and publishes what it found; returns the
  /// refusal when a shard that answers names another place. Once `stop` is
  /// set, it stops before the next shard and publishes nothing.
  std::optional<storage_error> read_whole_map(const std::atomic<bool>* stop = nullptr);
  /// Starts the map reader unless it runs; false when no thread could be
  /// had (tried again once per interval) and in a forked child.
  bool start_map_reader(std::int64_t now_ns);
  /// Wakes the map reader to read at once (or, agreed, to wait again).
  void wake_map_reader();
  /// The map reader's loop: the whole map once per interval while it has
  /// not agreed, at once when read_map_again() asks.
  void read_map_every_interval();
  /// The next request reads the shard map again, and waits for it (after
  /// a migrate here, or a new interval); so does the reader.
  void read_map_again();
  /// What a reading of every shard's place (begun at `started_ns`) found.
  void publish_whole_map(std::int64_t started_ns, const std::optional<storage_error>& conflict,
                         bool every_one_agreed);
  /// Reads every shard's recorded place before migrate() or
  /// adopt_shard_map() writes anything (see there).
  void read_every_place(bool adopt);

  struct shard_check {
    std::atomic<bool> schema_current{false};            // found new enough
    std::atomic<std::int64_t> map_checked_until_ns{0};  // steady clock
  };

  std::unique_ptr<store_backend> backend_;
  std::unique_ptr<const detail::record_sql> sql_;
  int required_version_ = 0;
  std::unique_ptr<shard_check[]> checks_;  // one per shard
  std::atomic<std::int64_t> map_recheck_ns_{10'000'000'000};
  // The whole map (check_whole_map()): when a request reads it next, and
  // what the last reading found.
  std::atomic<std::int64_t> whole_map_due_ns_{0};
  std::atomic<bool> whole_map_checked_{false};    // one reading finished
  std::atomic<bool> whole_map_conflict_{false};   // ... and it found another map
  std::atomic<bool> whole_map_agreed_{false};     // one found every shard agreeing
  std::mutex whole_map_mutex_;                    // guards the two below
  std::int64_t whole_map_conflict_found_ns_ = 0;  // when the last conflict was found
  std::string whole_map_conflict_text_;           // what it said
  // The map reader (check_whole_map()).
  std::atomic<bool> read_on_request_{false};  // the next turn's request reads, and waits
  std::int64_t owner_pid_ = 0;                // the process that made this store
  std::atomic<bool> reader_started_{false};
  std::atomic<std::int64_t> reader_retry_ns_{0};  // after a thread could not be had
  std::atomic<bool> reader_stop_{false};          // set once, by ~store
  // Its thread and what it waits on, in a block of their own: a forked
  // child leaves the block as it is (found in review: destroying the
  // parent's condition variable, which the parent's reader waited on,
  // hung the child).
  struct map_reader;
  std::unique_ptr<map_reader> reader_;
};

}  // namespace orpheus
