// What the manager reports while it works, for metrics: how each request
// ended, what happened to its key on the way, and how long each phase took,
// per shard. The core depends on nothing to report it; an adapter turns it
// into a metrics system's counters (orpheus/prometheus/observer.hpp for
// Prometheus).
//
//   struct my_observer : orpheus::observer {
//     void on_request(std::size_t shard, orpheus::request_outcome o) noexcept override { ... }
//   };
//   orpheus::config cfg;
//   cfg.observer = std::make_shared<my_observer>();
//
// Thread safety: the manager calls an observer from every thread that runs a
// request, at once; its methods must be thread-safe, quick and must not
// block (they run on the request's path, some inside a transaction's
// timing). They are noexcept: an observer cannot fail a request.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "orpheus/error.hpp"

namespace orpheus {

/// How one call of manager::process() or try_process() ended, or one
/// request the completer ran with its registered handler: one per call.
enum class request_outcome : std::uint8_t {
  recorded,             ///< this call ran the request and recorded its final answer
  replayed,             ///< answered with the recorded answer (database or replay cache)
  in_progress,          ///< another attempt holds the key (codes::in_progress, 409)
  mismatch,             ///< the key was used with another request (fingerprint_mismatch)
  retry_later,          ///< a failure safe to retry; nothing final recorded
  lease_lost,           ///< this attempt's lease was taken over; its result not recorded
  in_doubt,             ///< a commit's or the RPC's outcome is unknown (error_class::in_doubt)
  storage_unavailable,  ///< the database could not be reached or refused for now
  parked,               ///< the key is parked for an operator (codes::request_parked)
  refused,              ///< not retryable, nothing recorded (bad input, an internal error)
};

/// Something that happened to a key during a call, besides its outcome.
enum class request_event : std::uint8_t {
  new_key,             ///< a record was made for a key seen for the first time
  takeover,            ///< an attempt took over a lease that expired under another one
  retry,               ///< an attempt resumed a key left retryable by an earlier one
  attempts_exhausted,  ///< the key's attempts or retry window ran out (it is parked)
  parked,              ///< this call parked the key (any reason, attempts_exhausted too)
};

/// The timed parts of an attempt.
enum class request_phase : std::uint8_t {
  read,     ///< the replay fast path's read of the record (no transaction)
  acquire,  ///< transaction 1: the record or the lease taken, with Pre-RPC
  rpc,      ///< the RPC (each step's, for a multi-step request)
  record,   ///< transaction 2: Post-RPC and the recorded result
};

/// The outcome of a call that ended in `e`, by its code and class.
[[nodiscard]] request_outcome outcome_of(const error_info& e) noexcept;

/// Names for labels: "recorded", "new_key", "acquire", ...
[[nodiscard]] std::string_view to_string(request_outcome o) noexcept;
[[nodiscard]] std::string_view to_string(request_event e) noexcept;
[[nodiscard]] std::string_view to_string(request_phase p) noexcept;

/// The enumerators, in order, for an adapter that makes every series at
/// start-up.
inline constexpr request_outcome all_request_outcomes[] = {
    request_outcome::recorded,    request_outcome::replayed,
    request_outcome::in_progress, request_outcome::mismatch,
    request_outcome::retry_later, request_outcome::lease_lost,
    request_outcome::in_doubt,    request_outcome::storage_unavailable,
    request_outcome::parked,      request_outcome::refused};
inline constexpr request_event all_request_events[] = {
    request_event::new_key, request_event::takeover, request_event::retry,
    request_event::attempts_exhausted, request_event::parked};
inline constexpr request_phase all_request_phases[] = {request_phase::read, request_phase::acquire,
                                                       request_phase::rpc, request_phase::record};

/// Receives what the manager reports; every method does nothing by default.
/// `shard` is the key's shard (store::shard_of()).
class observer {
 public:
  observer() = default;
  observer(const observer&) = delete;
  observer& operator=(const observer&) = delete;
  virtual ~observer() = default;

  virtual void on_request(std::size_t shard, request_outcome outcome) noexcept;
  virtual void on_event(std::size_t shard, request_event event) noexcept;
  /// A phase that ran to its end or threw; `took` is wall-clock time.
  virtual void on_phase(std::size_t shard, request_phase phase,
                        std::chrono::nanoseconds took) noexcept;
};

}  // namespace orpheus
