// The record state machine's SQL, written once for every backend, and the
// transaction the manager runs it in. Internal: the manager and the tests use
// it; applications get orpheus::transaction, which cannot reach these calls.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "orpheus/backend.hpp"
#include "orpheus/request.hpp"
#include "orpheus/store.hpp"

namespace orpheus::detail {

/// Keys per statement of the purge's deletes.
inline constexpr std::size_t purge_chunk = 64;

/// Every statement of the record layer, built once per store from its
/// backend's dialect. The states are written from record_state.
struct record_sql {
  explicit record_sql(const sql_dialect& d);

  std::string read_fast;  ///< the replay fast path (see record_from_fast_row)
  std::string inspect;    ///< the whole record, no lock
  std::string lock;       ///< the whole record, locked
  std::string insert;
  std::string save_pre_state;
  std::string save_progress;
  std::string take_lease;
  std::string raise_handler_version;
  std::string mark_in_doubt;
  std::string mark_in_doubt_unfenced;
  std::string finish;
  std::string release;
  std::string park;
  std::string add_history;
  std::string add_history_fenced;
  std::string add_abandoned;
  std::string history;
  std::string requeue;
  std::string resolve;
  std::string cancel;
  std::string list;
  std::string count_by_state;
  std::string claim_head;
  std::string claim_tail;
  std::string claim_hold;
  /// The purge: up to `?` purgeable records, locked, with whether each has
  /// history; then their history and themselves, purge_chunk keys per
  /// statement (a shorter chunk repeats its last key).
  std::string purge_select;
  std::string purge_history_of;
  std::string purge_records_of;
  std::string create_version_table;
  std::string count_tables;
  std::string max_version;
  std::string add_version;
  /// The shard map a shard's database belongs to (migration 006): read
  /// (shard_index, shard_count), write it (index, count) where there is none,
  /// replace it (index, count).
  std::string read_shard_map;
  std::string record_shard_map;
  std::string replace_shard_map;
};

/// The library's side of a transaction on one shard: the record's writes
/// (all fenced by the attempt's owner token except insert and take_lease,
/// which run under the record's lock) on a backend transaction that the
/// application's Pre/Post-RPC statements share. Destroying an uncommitted
/// record_tx rolls it back.
class record_tx {
 public:
  record_tx(std::unique_ptr<backend_tx> t, const record_sql& sql);
  /// On a transaction the caller owns and ends (transact()).
  record_tx(backend_tx& t, const record_sql& sql);

  /// Inserts a new in-progress record with a lease held by `owner`, attempt 1.
  /// Returns false, changing nothing, when the key already has a record.
  /// `handler` (may be empty) is the registered handler that can finish the
  /// request without its client.
  bool insert(const request_id& id, std::string_view owner, const lease_terms& terms,
              std::string_view handler = {}, int handler_version = 0);
  /// Reads the record and locks it until the transaction ends.
  std::optional<record> lock(const request_id& id);
  /// Stores the Pre-RPC result; fenced by the owner token. May travel with
  /// the commit() that follows (see backend_tx::execute_fenced); a failed
  /// fence then makes commit() throw a non-retryable storage_error.
  bool save_pre_state(const request_id& id, std::string_view owner, std::string_view json,
                      std::string_view recovery_point = {});
  /// A step of a multi-step request finished: stores the recovery point
  /// (orpheus/steps.hpp) and renews the lease for the next step. Fenced like
  /// finish(), and may travel with the commit() the same way.
  bool save_progress(const request_id& id, std::string_view owner, std::string_view recovery_point,
                     const lease_terms& terms);
  /// Under lock(): gives the lease to `new_owner` and sets the attempt count.
  /// The completer may try it again `next_attempt_in_us` from now (default:
  /// when the lease ends), if it has a handler.
  void take_lease(const request_id& id, std::string_view new_owner, int attempts,
                  const lease_terms& terms, std::optional<std::int64_t> next_attempt_in_us = {});
  /// Under lock(): the record's handler version becomes `version` if that is
  /// newer (an attempt of a newer version runs it from now on).
  void raise_handler_version(const request_id& id, int version);
  /// The attempt's call downstream has an unknown outcome: it may still land
  /// until `window_us` after the lease ends (record::in_doubt_until_us; a
  /// later time already there stays), and a completer tries it again no
  /// sooner than `backoff_us` after the lease ends (next_attempt_us, if
  /// set). Fenced like finish(). With an empty `owner` (the attempt lost its
  /// lease to another): `window_us` from now, unfenced, on an unfinished
  /// record, and next_attempt_us is left to the lease's holder.
  bool mark_in_doubt(const request_id& id, std::string_view owner, std::int64_t window_us,
                     std::int64_t backoff_us);
  /// Records a terminal state and its response, releasing the lease. Fenced:
  /// returns false, changing nothing, when `owner` no longer holds the lease.
  /// May travel with the commit() that follows; a failed fence then makes
  /// commit() throw storage_error::lease_lost without committing anything.
  bool finish(const request_id& id, std::string_view owner, record_state final_state,
              const response& r, std::string_view last_error, const lease_terms& terms);
  /// Marks the record retryable and releases the lease, and adds a history
  /// row for the attempt (`retryable`). Fenced like finish().
  bool release(const request_id& id, std::string_view owner, std::string_view last_error,
               std::int64_t retry_in_us = 0, std::string_view runner = "client",
               std::string_view step = {});
  /// Under lock(): parks the record (no lease), with `why` as its last error
  /// and a history row `parked`. A record in progress (its last attempt did
  /// not finish, and its call may still land) keeps in_doubt_until_us at
  /// least `window_us` after its lease's end.
  void park(const request_id& id, std::string_view why, std::string_view runner = "client",
            std::string_view step = {}, std::int64_t window_us = 0);
  /// Adds a history row for the record's current attempt (orpheus_attempts),
  /// with its outcome and who wrote it (see history_entry, orpheus/admin.hpp).
  void add_history(const request_id& id, std::string_view outcome, std::string_view error,
                   std::string_view runner = "client", std::string_view step = {});
  /// add_history(), only while `owner` holds the lease of the record in
  /// progress; false when it does not (nothing written).
  bool add_history_fenced(const request_id& id, std::string_view owner, std::string_view outcome,
                          std::string_view error, std::string_view runner,
                          std::string_view step = {});
  /// Under lock(), for a record in progress whose lease expired: a history
  /// row `abandoned` for its attempt, unless that attempt wrote one (held in
  /// doubt).
  void add_abandoned(const request_id& id);
  /// A parked record becomes retryable with a fresh budget: attempts made so
  /// far stop counting against the cap, and the retry window starts again.
  /// Returns false, changing nothing, when the record is not parked.
  [[nodiscard]] bool requeue(const request_id& id, std::string_view note, const lease_terms& terms);
  /// A person cancels a multi-step request before its pivot: the record
  /// becomes retryable with a fresh budget and `recovery_point`, which sends
  /// its next attempt through the compensations. For a parked or retryable
  /// record; returns false, changing nothing, otherwise.
  bool cancel(const request_id& id, std::string_view recovery_point, std::string_view note,
              const lease_terms& terms);
  /// Records an outcome decided by a person: `final_state` (succeeded or
  /// failed) with `r`, for a record that is parked or retryable. Returns
  /// false, changing nothing, otherwise.
  bool resolve(const request_id& id, record_state final_state, const response& r,
               std::string_view note, const lease_terms& terms);

  /// Commits. A failure whose outcome is unknown throws a storage_error with
  /// in_doubt() set.
  void commit() { t_->commit(); }
  void rollback() noexcept { t_->rollback(); }

  /// The backend transaction, for the application's statements.
  [[nodiscard]] backend_tx& statements() noexcept { return *t_; }

 private:
  std::unique_ptr<backend_tx> owned_;
  backend_tx* t_;
  const record_sql& sql_;
};

/// Why `r`'s headers cannot be sent as they are, or nullopt: a name that is
/// not an HTTP token, a value with a control character (a line break would
/// send the rest as a header of its own), or a value longer than
/// `max_value` bytes. record_tx::finish() refuses a handler's answer over
/// max_header_value (what Beast can send at all) and the HTTP front end a
/// recorded one; admin::resolve() an operator's over 8192.
[[nodiscard]] std::optional<std::string> unsendable_header(const response& r,
                                                           std::size_t max_value);
/// A byte no header value may carry: a control character other than a tab.
[[nodiscard]] constexpr bool header_control(unsigned char c) noexcept {
  return (c < 0x20 && c != '\t') || c == 0x7f;
}
/// Whether one header can be sent as it is (the rules of unsendable_header()).
[[nodiscard]] bool sendable_field(std::string_view name, std::string_view value,
                                  std::size_t max_value) noexcept;
/// The longest header value Beast sends (a field is at most 64 KiB with its
/// CRLF).
inline constexpr std::size_t max_header_value = 65533;

/// Opens a record transaction on the shard of `id`.
std::unique_ptr<record_tx> begin_record_tx(store& s, const request_id& id);

/// Runs `body` in one record transaction on the shard of `id` and commits it
/// (store_backend::transact: on SQLite, on the writer thread). `body` must
/// not commit or roll back: it throws to undo all it did, and the exception
/// comes out of transact(). Use it for the transactions every request makes;
/// begin_record_tx() for the rest.
void transact(store& s, const request_id& id, const std::function<void(record_tx&)>& body);

}  // namespace orpheus::detail
