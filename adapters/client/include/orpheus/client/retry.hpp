// The client side of the Orpheus contract: what to retry, when, and how much.
//
//   orpheus::client::retry_policy policy;            // 5 attempts, 90 s, full jitter
//   auto budget = std::make_shared<orpheus::client::retry_budget>();  // one per client
//   const std::string key = orpheus::client::new_idempotency_key();   // UUIDv4
//
// What is retried (and why):
//   network errors, timeouts  the request may or may not have arrived: only a
//                             retry with the same key can find out
//   409                       another attempt with this key is in progress
//   429, 5xx except 501       the server is overloaded or failing; try later
//   other 4xx, 501            never: the request will not succeed as sent
//   "retryable": false        never, whatever the status: the server says in
//                             its problem+json body that the answer is final
//                             (a JSON boolean only: "yes", 1 or null count as
//                             absent, and the status decides)
// A server's Retry-After (seconds or an HTTP-date) is honoured as the least
// wait. Waits grow exponentially with full jitter (a random wait between 0 and
// the current backoff, as AWS's standard retry mode does), capped, and stop at
// the attempt cap or the overall deadline. A retry_budget shared by all calls
// of a client is spent by retries and refilled by successes, so a long outage
// becomes a trickle of retries rather than a storm.
//
// Thread safety: retry_budget is thread-safe; the rest are values.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <string_view>

#include "orpheus/transport.hpp"

namespace orpheus::client {

/// A new idempotency key: a UUIDv4 from a cryptographic random source.
[[nodiscard]] std::string new_idempotency_key();

/// An entity-level key, for operations that must happen once per entity
/// rather than once per request: entity_key("payment", "1234", "refund")
/// is "payment-1234-refund". Throws std::invalid_argument on parts that are
/// empty or not printable ASCII without spaces, or when the whole breaks the
/// key rule (orpheus::invalid_key_reason(): longer than 255 bytes).
[[nodiscard]] std::string entity_key(std::string_view entity, std::string_view id,
                                     std::string_view action);

/// What went wrong with one attempt (userver's error_kind, in small).
enum class error_kind {
  none,       ///< a final answer (2xx, or a 4xx that is not retried)
  network,    ///< connect failure, reset, connection closed early, 408
  timeout,    ///< no complete answer in time
  conflict,   ///< 409 or 425: another attempt with this key is in progress
  throttled,  ///< 429
  server,     ///< 5xx except 501
};

/// The kind of an HTTP status: conflict, throttled, server, network (408:
/// the server did not get the whole request), or none (final).
[[nodiscard]] error_kind kind_of_status(unsigned status) noexcept;

/// The kind of a call that got no answer: timeout, or network (connect,
/// closed). Both are retried, with the same key.
[[nodiscard]] constexpr error_kind kind_of_transport(transport_failure f) noexcept {
  return f == transport_failure::timeout ? error_kind::timeout : error_kind::network;
}

/// True for the kinds a client retries.
[[nodiscard]] constexpr bool retryable(error_kind k) noexcept { return k != error_kind::none; }

/// Parses Retry-After: delta-seconds or an HTTP-date in any of its three
/// forms (RFC 9110: IMF-fixdate, RFC 850, asctime; read the same whatever
/// the process's locale). nullopt when it is none of them; a date in the
/// past is 0; more than 9 digits, or a date more than a year away, is a
/// year.
/// An HTTP-date in any of its three forms as seconds since the Unix epoch
/// (`now` places an RFC 850 date's two-digit year); nullopt when `v` is
/// none of them or names no real date and time.
[[nodiscard]] std::optional<std::int64_t> http_date_seconds(
    std::string_view v, std::chrono::system_clock::time_point now);

[[nodiscard]] std::optional<std::chrono::milliseconds> parse_retry_after(
    std::string_view value, std::chrono::system_clock::time_point now);

/// The defaults are sized for a server on orpheus::config's defaults (lease
/// 30 s, rpc_timeout 20 s); docs/client.md "Sizing" explains the relations,
/// and a test checks them. Scale them together if the server's differ:
///  - attempt_timeout (30 s) >= the server's lease: longer than its RPC
///    timeout plus the time to record the answer, which the server bounds by
///    the lease. A shorter one (it was 10 s, under the 20 s RPC timeout) gave
///    up on attempts that were about to answer, and its retry met 409.
///  - deadline (90 s) >= lease + attempt_timeout + max_delay: a call outlives
///    one lease take-over (a first attempt that never answers holds its key
///    for a lease; the take-over then needs a whole attempt). It was 30 s,
///    the lease itself: a 409 whose Retry-After was the rest of the lease
///    ended the call (issue 7, defect 11).
///  - max_attempts (5) >= 3: the lost attempt, a 409 waited out, the
///    take-over.
struct retry_policy {
  int max_attempts = 5;                              ///< the first one included
  std::chrono::milliseconds base_delay{100};         ///< backoff before retry 1
  std::chrono::milliseconds max_delay{5000};         ///< backoff cap
  std::chrono::milliseconds deadline{90000};         ///< for the whole call
  std::chrono::milliseconds attempt_timeout{30000};  ///< for one attempt, lookup included
};

/// Throws orpheus::config_error (not retryable) on a policy that cannot work;
/// changes nothing. The contract of every validate(x) in Orpheus, as
/// orpheus::validate(const config&) and orpheus::validate(const request_id&).
void validate(const retry_policy& p);

/// The wait before retry number `retry` (1 for the first retry): a uniform
/// random value in [0, min(max_delay, base_delay * 2^(retry-1))], but never
/// less than the server's Retry-After. `random01` returns values in [0, 1).
[[nodiscard]] std::chrono::milliseconds backoff(
    const retry_policy& p, int retry, std::optional<std::chrono::milliseconds> retry_after,
    double random01);

/// A token bucket of retries, shared by every call of one client (AWS SDK
/// "retry quota"): a retry costs `retry_cost` (a timeout costs
/// `timeout_cost`), a success returns `refund`, up to `capacity`.
class retry_budget {
 public:
  /// Throws config_error when capacity is not positive or a cost or the
  /// refund is negative (NaN included).
  explicit retry_budget(double capacity = 500, double retry_cost = 5, double timeout_cost = 10,
                        double refund = 1);
  /// Takes the cost of one retry of `kind`; false (nothing taken) when the
  /// bucket cannot pay: stop retrying.
  bool try_spend(error_kind kind);
  void on_success();
  [[nodiscard]] double tokens() const;

 private:
  mutable std::mutex m_;
  double capacity_, tokens_, retry_cost_, timeout_cost_, refund_;
};

/// Time, injectable for tests: real time by default.
struct clock {
  std::function<std::chrono::steady_clock::time_point()> now = [] {
    return std::chrono::steady_clock::now();
  };
  std::function<std::chrono::system_clock::time_point()> wall_now = [] {
    return std::chrono::system_clock::now();
  };
  std::function<void(std::chrono::milliseconds)> sleep;  ///< empty: really sleep
  std::function<double()> random01;                      ///< empty: a seeded PRNG
};

}  // namespace orpheus::client
