// A downstream payment call, made the Orpheus way. Use it as (part of) the
// RPC phase:
//
//   [&](const orpheus::attempt& a, const payment& p) {
//     return orpheus::payment::charge_once(gateway, a, {p.id, p.amount, p.currency});
//   }
//
// What it does:
//  - passes a.downstream_key("charge") to the gateway as its idempotency key:
//    the same on every attempt, so the gateway deduplicates too;
//  - on a retry (a.is_retry()), asks the gateway first what became of the
//    earlier attempt, and charges only if it never arrived;
//  - classifies what the gateway said, in one place:
//      charged                          the charge (success)
//      declined                         non_retryable_error card_declined, 402
//      invalid                          non_retryable_error invalid_payment, 422
//      server error, timeout, reset     retryable, 502/504, and in doubt: the
//                                       charge may have happened; the retry
//                                       asks before charging again
//      could not connect                retryable, 503 (nothing was sent)
//  - gives the gateway only the time left before a.deadline().
//
// Thread safety: as thread-safe as the gateway.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "orpheus/request.hpp"

namespace orpheus::payment {

struct charge_request {
  std::string reference;  ///< the caller's payment id, for the gateway's records
  std::int64_t amount = 0;
  std::string currency;
};

/// What a gateway said, before classification.
enum class gateway_status {
  charged,
  declined,        ///< a business refusal (insufficient funds, card blocked)
  invalid,         ///< the gateway refused the request as malformed
  not_found,       ///< (status query only) no charge was made with this key
  server_error,    ///< 5xx: the gateway failed; it may or may not have charged
  timeout,         ///< no answer in time: unknown outcome
  reset,           ///< the connection broke after sending: unknown outcome
  connect_failed,  ///< nothing was sent
};

struct gateway_answer {
  gateway_status status = gateway_status::server_error;
  std::string charge_id;  ///< set when charged
  std::string detail;     ///< for logs and error messages
};

/// The downstream service. Implementations do one call each, no retries.
class gateway {
 public:
  gateway() = default;
  gateway(const gateway&) = delete;
  gateway& operator=(const gateway&) = delete;
  virtual ~gateway() = default;
  /// Charges once per `idempotency_key` (the gateway deduplicates).
  virtual gateway_answer charge(const charge_request& r, const std::string& idempotency_key,
                                std::chrono::milliseconds timeout) = 0;
  /// What became of the charge made with `idempotency_key`: charged,
  /// declined, not_found, or a failure of the query itself.
  virtual gateway_answer status(const std::string& idempotency_key,
                                std::chrono::milliseconds timeout) = 0;
};

/// The charge id. Throws orpheus::error classified as above.
std::string charge_once(gateway& g, const attempt& a, const charge_request& r,
                        std::string_view step = "charge");

/// The classification alone (exposed for gateways with their own flow).
/// Returns the charge id for `charged`; throws for everything else.
std::string classify(const gateway_answer& answer);

}  // namespace orpheus::payment
