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
//    earlier attempt, and charges only if the gateway says it never arrived
//    (not_found; from a gateway that does not deduplicate, only once the
//    earlier call can no longer land: gateway::deduplicates()). Any other answer to that query that
//    is not "charged" or "declined" (refused, 409 busy, 429, 5xx, timeout, reset, no connection)
//    leaves the earlier charge unknown: retryable and in doubt, no charge;
//  - classifies what the gateway said about a charge, in one place
//    (charge_id_of()):
//      charged                          the charge (success)
//      declined                         non_retryable_error card_declined, 402
//      invalid                          non_retryable_error invalid_payment, 422
//      in_progress (409)                retryable, 503, in doubt: a charge with
//                                       this key is still running at the gateway
//      throttled (429)                  retryable, 503 (the gateway did not act)
//      server error, timeout, reset     retryable, 502/504, in doubt: the
//                                       charge may have happened; the retry
//                                       asks before charging again
//      could not connect                retryable, 503 (nothing was sent)
//  - gives the gateway only the time left before a.deadline().
//
// In doubt (error_info::in_doubt): set on every retryable error after which a
// charge under this attempt's downstream key may exist and may still be
// running at the gateway. The manager keeps the key's lease until
// a.deadline() for such an outcome instead of releasing it at once, so that
// the retry (which asks the gateway first) never overlaps a charge still in
// flight (issue 7, defect 5: a released lease let the retry's status query
// race the first charge, and the bank's 409 for it was recorded as final).
// Never read in_doubt as "nothing happened".
//
// Thread safety: as thread-safe as the gateway.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "orpheus/request.hpp"
#include "orpheus/transport.hpp"

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
  in_progress,     ///< 409/425: a request with this key is still being processed
  throttled,       ///< 429: the gateway refused to look at the request now
  unauthorized,    ///< 401/403: this service's credentials refused (in doubt: a proxy may say so)
};

/// The gateway_status of a gateway's HTTP status code, for adapters of HTTP
/// gateways: 2xx charged, 402 declined, 404 not_found (take these two only
/// with the gateway's own word in the body, that the card was declined or
/// the key is unknown: a proxy or a quota page on the way answers them bare,
/// having asked nobody; see gateway::status()), 408 and 504 timeout,
/// 409 and 425 in_progress, 429 throttled, 401 and 403 unauthorized, other
/// 5xx and 421 (a server on the way, not the gateway) server_error, other 4xx
/// invalid; anything else (1xx, 3xx) server_error, an unknown outcome. A
/// gateway whose body says more (a decline answered with 200) refines it.
/// Never map 409 or 429 to `invalid`: that records a charge that may exist as
/// a final failure (issue 7, defect 5).
[[nodiscard]] gateway_status status_of_http(unsigned http_status) noexcept;

/// The gateway_status of a call that got no answer (orpheus/transport.hpp):
/// connect -> connect_failed (nothing was sent: a plain retry), timeout ->
/// timeout, closed -> reset (both unknown outcomes).
[[nodiscard]] constexpr gateway_status status_of_transport(transport_failure f) noexcept {
  switch (f) {
    case transport_failure::connect:
      return gateway_status::connect_failed;
    case transport_failure::timeout:
      return gateway_status::timeout;
    case transport_failure::closed:
      break;
  }
  return gateway_status::reset;
}

struct gateway_answer {
  gateway_status status = gateway_status::server_error;
  std::string charge_id;  ///< set when charged
  std::string detail;     ///< for logs and the record (error_info::internal), never for clients
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
  /// declined, not_found, or a failure of the query itself. not_found only
  /// when the gateway itself says it has no charge under the key (its own
  /// answer: a body or a code that says so), never for a bare 404 that a
  /// proxy, a load balancer or a gateway mid-deploy may send without
  /// looking: charge_once() charges again on not_found, and a gateway that
  /// does not deduplicate would then charge twice. Anything it cannot read
  /// as its own word is server_error (unknown).
  virtual gateway_answer status(const std::string& idempotency_key,
                                std::chrono::milliseconds timeout) = 0;
  /// Whether a charge sent again under the same key is answered with the
  /// first one's outcome (this interface's contract: the default). A
  /// gateway that does not deduplicate says false, and charge_once() then
  /// believes a status query's not_found only once an earlier call whose
  /// outcome was unknown can no longer land (attempt::
  /// earlier_may_land_until(): config::in_doubt_window after that
  /// attempt's lease). Found in review: a charge still on its way to such a
  /// gateway when its caller timed out was not found yet, and the retry
  /// charged a second time. Such a gateway's status() must be strictest
  /// about not_found: never status_of_http() of a bare 404 (see status()).
  [[nodiscard]] virtual bool deduplicates() const noexcept { return true; }
};

/// The charge id. Throws orpheus::error classified as above; a retryable
/// error is of class in_doubt when a charge under the downstream key may
/// exist. `step` names the charge in the downstream key
/// (attempt::downstream_key()): each charge of one request needs its own.
/// In a multi-step request (orpheus/steps.hpp) whose steps charge more than
/// once, pass each step's name (a.step()): under the default two steps share
/// one key, and the gateway answers the second with the first's charge (a
/// compensation's refund needs a name of its own: there a.step() is the
/// name of the step it undoes, docs/steps.md). The
/// default is kept as it is because changing it would change the key of a
/// request in flight across an upgrade, and its retry would charge again.
std::string charge_once(gateway& g, const attempt& a, const charge_request& r,
                        std::string_view step = "charge");

/// The time left before the attempt's deadline, for a gateway call. With
/// none left nothing may be sent (the call could outlive the lease): throws
/// a retryable gateway_timeout on a first attempt (nothing was ever sent
/// under its key), an in-doubt one on a retry (an earlier call is unknown).
[[nodiscard]] std::chrono::milliseconds time_left(const attempt& a);

/// The charge id a charge's answer carries (exposed for gateways with their
/// own flow): answer.charge_id for `charged`; for everything else, throws the
/// orpheus::error classified as above. Not for status answers: on a retry,
/// charge_once() treats every status answer but charged, declined and
/// not_found as unknown.
[[nodiscard]] std::string charge_id_of(const gateway_answer& answer);

}  // namespace orpheus::payment
