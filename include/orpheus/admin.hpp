// Operations on the records for a person or a tool (orpheusctl): look at one
// key with its history, list records by state, count them per shard, requeue
// or resolve a parked request, purge, migrate. docs/operations.md.
//
//   orpheus::admin ops(store, cfg);                  // cfg: the servers' config
//   for (const auto& r : ops.list(orpheus::record_state::parked, 10min, 100))
//     std::cout << r.scope << ' ' << r.key << ": " << r.last_error << '\n';
//   ops.requeue("merchant-7", "order-42", "bank back up, ticket 1234");
//
// Nothing here runs an RPC: a requeued request resumes when its client (or,
// later, a completer) retries it, with is_retry() true and its stored Pre-RPC
// result. Every change is one short transaction under the record's lock, like
// an attempt's, and leaves a history row (runner "operator").
//
// Thread safety: like the store it uses.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "orpheus/manager.hpp"
#include "orpheus/store.hpp"

namespace orpheus {

/// One row of a record's history (table orpheus_attempts), oldest first.
/// A row is written for each attempt that did not finish the record, and for
/// each parking, requeue and resolution; the attempt that finished a record
/// is the record itself (its attempts, state and updated_us).
struct history_entry {
  int attempt = 0;         ///< the record's attempt count when the row was written
  std::int64_t at_us = 0;  ///< database clock, microseconds since the epoch
  /// retryable: the attempt failed safely and released the key;
  /// in_doubt: its outcome downstream was unknown (the key was held to its
  ///   deadline); abandoned: its lease expired before it finished (found
  ///   by the next attempt); parked; compensating: a multi-step request
  ///   turned back (orpheus/steps.hpp); requeued; cancelled; resolved.
  std::string outcome;
  std::string runner;  ///< "client" or "completer" (a request), or "operator" (this class)
  std::string step;    ///< the step of a multi-step request; empty: a single RPC
  std::string error;   ///< the error, or the operator's note
};

/// A record, its shard and its history.
struct record_report {
  std::size_t shard = 0;
  record rec;
  std::vector<history_entry> history;
};

/// A line of list().
struct record_summary {
  std::size_t shard = 0;
  std::string scope;
  std::string key;
  record_state state = record_state::in_progress;
  int attempts = 0;
  std::int64_t created_us = 0;
  std::int64_t updated_us = 0;
  std::string last_error;
  std::int64_t db_now_us = 0;  ///< the shard's clock when listed
};

/// Records per state on one shard.
struct shard_stats {
  std::size_t shard = 0;
  std::int64_t in_progress = 0;
  std::int64_t retryable = 0;
  std::int64_t succeeded = 0;
  std::int64_t failed = 0;
  std::int64_t parked = 0;
};

/// What requeue() and resolve() did.
struct admin_result {
  enum class status {
    done,
    not_found,  ///< no record with this scope and key
    refused,    ///< the record is not in a state that allows it (see `why`)
  };
  status result = status::done;
  std::string why;  ///< for not_found and refused: a sentence for the operator
  [[nodiscard]] bool ok() const noexcept { return result == status::done; }
};

class admin {
 public:
  /// `c` is the configuration the servers run with: a requeue grants
  /// c.retry_window again, and a resolved record is kept c.retention.
  /// Throws config_error for a configuration validate() refuses.
  admin(store& s, config c);

  /// The record of (scope, key) with its history; nullopt when there is none.
  /// Throws bad_input_error for a key or scope the library would refuse.
  std::optional<record_report> show(std::string_view scope, std::string_view key);

  /// Up to `limit` records in `state`, unchanged for at least `older_than`
  /// (by updated_us, on each shard's clock), least recently changed first,
  /// from every shard. A scan of the table per shard: for operators, not for
  /// request paths.
  std::vector<record_summary> list(record_state state, std::chrono::milliseconds older_than,
                                   std::size_t limit);

  /// Records per state, per shard (a scan of each shard's table).
  std::vector<shard_stats> stats();

  /// A parked request becomes retryable again: the attempts it made stop
  /// counting against config::max_attempts and its retry window starts
  /// again. Its next attempt resumes where it stopped (is_retry() true, the
  /// stored Pre-RPC result). Refused unless the record is parked.
  admin_result requeue(std::string_view scope, std::string_view key, std::string_view note);

  /// Records an outcome decided by a person (after checking downstream what
  /// really happened): `r` is replayed from now on, as succeeded when its
  /// status is below 400 and as failed otherwise. Only for a parked or
  /// retryable record: refused for a finished one and for one in progress,
  /// even under an expired lease (its call may still be running downstream;
  /// wait for a take-over or for it to park). Nothing of the handler runs:
  /// the application's own rows for the request are the operator's to set
  /// right. Throws bad_input_error when r.status is not 200..599 (a final status).
  admin_result resolve(std::string_view scope, std::string_view key, const response& r,
                       std::string_view note);

  /// Cancels a multi-step request (orpheus/steps.hpp) that has not passed
  /// its pivot: its next attempt (a completer's, or its client's retry)
  /// runs the compensations of the finished steps, last first, and records
  /// the failure codes::request_cancelled. The attempts made so far stop
  /// counting against config::max_attempts. Only for a parked or retryable
  /// record (as resolve()); refused for a request of a single RPC (nothing
  /// to compensate: check downstream and resolve() it), for one past its
  /// pivot (it only goes forward), and for one already going backwards.
  /// A compensation that cannot undo its step (a void refused after a
  /// capture) parks the request again. A request made with plain process()
  /// has no completer: its compensations run only on its client's retry
  /// (docs/steps.md#cancel).
  admin_result cancel(std::string_view scope, std::string_view key, std::string_view note);

  /// Purges expired records (never a parked one, never one under a live
  /// lease) and their history, `batch_limit` rows per statement, on every
  /// shard, until none is left. Returns the rows deleted (records and
  /// history), as store::purge_expired() counts them.
  std::size_t purge(std::size_t batch_limit);

 private:
  store& store_;
  config config_;
};

}  // namespace orpheus
