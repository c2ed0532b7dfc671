// Every error code the library and its adapters emit, in one table, and the
// transport-neutral class of each.
//
// A code is a client's handle on a failure: it goes into every problem+json
// body and every record. Handlers may use codes of their own; these are the
// ones clients can rely on. docs/errors.md lists the same codes, and a unit
// test (tests/unit/codes_test.cpp) fails when the two disagree or when
// library code passes a code as a string literal instead of a name from here.
//
// The class says what a caller should do, whatever the transport (HTTP
// today, gRPC later): an adapter maps it to its own status.
//
//   invalid_input  the request is malformed (a bad key, a reused key with
//                  another payload): fix it; never retried
//   conflict       the key is busy with another attempt: retry later, same key
//   unavailable    nothing final happened: retry later, same key
//   in_doubt       the outcome is unknown: only a retry with the same key is
//                  safe, and it finds out what happened
//   rejected       a final refusal (a declined card): recorded, not retried
//   internal       a failure the caller cannot fix (a bug, a permanent
//                  database error, a key out of attempts): not retried
#pragma once

#include <span>
#include <string_view>

namespace orpheus {

enum class error_class { invalid_input, conflict, unavailable, in_doubt, rejected, internal };

/// True for conflict, unavailable and in_doubt.
[[nodiscard]] constexpr bool retryable(error_class c) noexcept {
  return c == error_class::conflict || c == error_class::unavailable || c == error_class::in_doubt;
}

/// "invalid_input", "conflict", ...
[[nodiscard]] std::string_view to_string(error_class c) noexcept;

namespace codes {
// The core.
inline constexpr std::string_view invalid_key = "invalid_key";
inline constexpr std::string_view invalid_scope = "invalid_scope";
inline constexpr std::string_view invalid_fingerprint = "invalid_fingerprint";
inline constexpr std::string_view missing_key = "missing_key";
inline constexpr std::string_view invalid_request = "invalid_request";
inline constexpr std::string_view unauthenticated = "unauthenticated";
inline constexpr std::string_view invalid_config = "invalid_config";
inline constexpr std::string_view fingerprint_mismatch = "fingerprint_mismatch";
inline constexpr std::string_view in_progress = "in_progress";
inline constexpr std::string_view lease_lost = "lease_lost";
inline constexpr std::string_view storage_unavailable = "storage_unavailable";
inline constexpr std::string_view commit_in_doubt = "commit_in_doubt";
inline constexpr std::string_view attempts_exhausted = "attempts_exhausted";
inline constexpr std::string_view retry_window_exhausted = "retry_window_exhausted";
inline constexpr std::string_view request_parked = "request_parked";
inline constexpr std::string_view handler_unknown = "handler_unknown";
inline constexpr std::string_view step_failed_after_pivot = "step_failed_after_pivot";
inline constexpr std::string_view compensation_failed = "compensation_failed";
inline constexpr std::string_view request_cancelled = "request_cancelled";
inline constexpr std::string_view unclassified = "unclassified_error";
inline constexpr std::string_view post_rpc_failed = "post_rpc_failed";
inline constexpr std::string_view storage_error = "storage_error";
inline constexpr std::string_view nested_transaction = "nested_transaction";
inline constexpr std::string_view pre_state_unreadable = "pre_state_unreadable";
inline constexpr std::string_view deadline_exceeded = "deadline_exceeded";
inline constexpr std::string_view no_randomness = "no_randomness";
// The Beast middleware.
inline constexpr std::string_view overloaded = "overloaded";
inline constexpr std::string_view server_stopping = "server_stopping";
inline constexpr std::string_view downstream_throttled = "downstream_throttled";
inline constexpr std::string_view downstream_failed = "downstream_failed";
inline constexpr std::string_view downstream_in_progress = "downstream_in_progress";
inline constexpr std::string_view downstream_unreachable = "downstream_unreachable";
inline constexpr std::string_view downstream_timeout = "downstream_timeout";
inline constexpr std::string_view downstream_closed = "downstream_closed";
// The gRPC adapter.
inline constexpr std::string_view reply_unreadable = "reply_unreadable";
// The payment wrapper.
inline constexpr std::string_view card_declined = "card_declined";
inline constexpr std::string_view invalid_payment = "invalid_payment";
inline constexpr std::string_view gateway_unreachable = "gateway_unreachable";
inline constexpr std::string_view gateway_throttled = "gateway_throttled";
inline constexpr std::string_view gateway_unauthorized = "gateway_unauthorized";
inline constexpr std::string_view gateway_in_progress = "gateway_in_progress";
inline constexpr std::string_view gateway_timeout = "gateway_timeout";
inline constexpr std::string_view gateway_error = "gateway_error";
inline constexpr std::string_view charge_status_unknown = "charge_status_unknown";
inline constexpr std::string_view earlier_charge_may_land = "earlier_charge_may_land";
}  // namespace codes

/// One row of the registry. `usual` is the class the code is emitted with;
/// a few codes vary, and say so in docs/errors.md (post_rpc_failed is in
/// doubt when the RPC was; unclassified_error follows config::unclassified,
/// and is retryable when nothing ran: identifying the caller failed).
struct code_info {
  std::string_view code;
  error_class usual;
  std::string_view emitted_by;  ///< "core", "beast", "payment"
};

/// Every code above, once.
[[nodiscard]] std::span<const code_info> known_codes() noexcept;

/// The registry row of `code`, or nullptr for a code the library does not emit.
[[nodiscard]] const code_info* find_code(std::string_view code) noexcept;

}  // namespace orpheus
