// The storage seam: what a backend must do for the library.
//
// The core decides the state machine (SPEC section 4); a backend only runs
// short, fenced statements against the master of the key's shard and reports
// failures as orpheus::storage_error, classified in one place per backend.
// Times are microseconds since the Unix epoch on the DATABASE's clock: every
// statement that sets or compares a lease time computes "now" in SQL, and
// every read returns that "now" so the core can compare on the same clock.
//
// Backends: orpheus/store/sqlite.hpp (embedded default), orpheus/store/mysql.hpp
// (production, sharded). Both pass tests/integration/conformance_test.cpp.
//
// Thread safety: a store is shared by all threads; a store_tx belongs to the
// one thread that began it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "orpheus/request.hpp"
#include "orpheus/tx.hpp"

namespace orpheus {

enum class record_state {
  in_progress = 1,  ///< a lease is held until lease_expires_us
  retryable = 2,    ///< the last attempt failed safely; no lease
  succeeded = 3,    ///< terminal: the response is recorded
  failed = 4,       ///< terminal, non-retryable: the error is recorded
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
};

/// Lease and retention figures a write needs, in microseconds.
struct lease_terms {
  std::int64_t lease_us = 0;
  std::int64_t retry_window_us = 0;
  std::int64_t retention_us = 0;
};

/// The library's side of a transaction on one shard. It is also the `tx` the
/// application's Pre/Post-RPC SQL runs through. Destroying an uncommitted
/// store_tx rolls it back.
class store_tx : public tx {
 public:
  /// Inserts a new in-progress record with a lease held by `owner`, attempt 1.
  /// Returns false, changing nothing, when the key already has a record.
  virtual bool insert(const request_id& id, std::string_view owner, const lease_terms& terms) = 0;
  /// Reads the record and locks it until the transaction ends.
  virtual std::optional<record> lock(const request_id& id) = 0;
  /// Stores the Pre-RPC result; fenced by the owner token. A backend may send
  /// it with the commit() that follows (MySQL on MariaDB: one round trip
  /// fewer); it then returns true, and a failed fence makes that commit()
  /// throw a non-retryable storage_error without committing anything.
  virtual bool save_pre_state(const request_id& id, std::string_view owner,
                              std::string_view json) = 0;
  /// Under lock(): gives the lease to `new_owner` and sets the attempt count.
  virtual void take_lease(const request_id& id, std::string_view new_owner, int attempts,
                          const lease_terms& terms) = 0;
  /// Records a terminal state and its response, releasing the lease. Fenced:
  /// returns false, changing nothing, when `owner` no longer holds the lease.
  /// A backend may send it with the commit() that follows (MySQL on MariaDB:
  /// one round trip fewer); it then returns true, and a failed fence makes
  /// that commit() throw storage_error::lease_lost without committing
  /// anything.
  virtual bool finish(const request_id& id, std::string_view owner, record_state final_state,
                      const response& r, std::string_view last_error, const lease_terms& terms) = 0;
  /// Marks the record retryable and releases the lease. Fenced like finish().
  virtual bool release(const request_id& id, std::string_view owner,
                       std::string_view last_error) = 0;
  /// Commits. A failure whose outcome is unknown throws a storage_error with
  /// in_doubt() set.
  virtual void commit() = 0;
  virtual void rollback() noexcept = 0;
};

class store {
 public:
  store() = default;
  store(const store&) = delete;
  store& operator=(const store&) = delete;
  virtual ~store() = default;

  [[nodiscard]] virtual std::size_t shard_count() const = 0;
  /// The shard that owns (scope, key); see shard_map.hpp.
  [[nodiscard]] virtual std::size_t shard_of(const request_id& id) const = 0;
  /// The replay fast path: one read from the key's master, no transaction.
  /// Loads what the decision and a replay need: state, fingerprint, attempts,
  /// lease, recorded response and the database clock. The other fields are
  /// left empty (see inspect()).
  virtual std::optional<record> read(const request_id& id) = 0;
  /// The whole record, for tools and tests; no transaction.
  virtual std::optional<record> inspect(const request_id& id) = 0;
  /// Opens a transaction on the key's shard.
  virtual std::unique_ptr<store_tx> begin(const request_id& id) = 0;
  /// Opens a transaction on a shard by index (for application set-up).
  virtual std::unique_ptr<store_tx> begin_on_shard(std::size_t shard) = 0;
  /// Deletes at most `limit` terminal records of `shard` whose retention
  /// deadline has passed; returns how many were deleted.
  virtual std::size_t purge_expired(std::size_t shard, std::size_t limit) = 0;
  /// Applies the schema migrations this library version ships that the
  /// shard's schema version table does not list yet (every shard).
  virtual void migrate() = 0;
  /// The highest applied schema version of a shard (0 before any).
  virtual int schema_version(std::size_t shard) = 0;
};

}  // namespace orpheus
