// A failure's HTTP form: its status and its RFC 9457 problem+json body.
//
// The one place the library turns an error's transport-neutral class
// (error_class, orpheus/codes.hpp) into an HTTP status. The Beast adapter
// answers with it, and the core uses it for the failures it records itself
// (a non-retryable RPC failure under a success-only Post-RPC; a multi-step
// request undone before its pivot, when its flow has no failure responder): a
// recorded failure replays byte for byte, so it is written in its HTTP form
// when it is recorded (docs/errors.md says why this is in the core).
//
//   http_status_of(error_info::of(error_class::conflict, codes::in_progress, "busy")) == 409
#pragma once

#include "orpheus/error.hpp"
#include "orpheus/request.hpp"

namespace orpheus {

/// The HTTP status for `e`, in this order:
///  1. e.http_status, when a handler or an adapter chose one from 400 to 599
///     (a failure is never answered 2xx, nor with a status HTTP has not);
///  2. the library codes, made with the class the library gives them
///     (orpheus/codes.hpp), whose status is not their class's: fingerprint_mismatch
///     422, unauthenticated 401, downstream_timeout and gateway_timeout 504,
///     downstream_closed, gateway_error and charge_status_unknown 502,
///     card_declined 402;
///  3. the class: invalid_input 400, conflict 409, unavailable and in_doubt
///     503, rejected 422, internal 500.
/// A retryable failure is never answered with a status a client would not
/// retry: below 500 and other than 409 and 429, or 501, it is 503; and an
/// in-doubt one is never 429 ("not acted on"), but 503.
[[nodiscard]] int http_status_of(const error_info& e) noexcept;

/// The wait an answer to `e` announces (HTTP Retry-After, gRPC RetryInfo):
/// e.retry_after, else default_retry_after, from 0 to a day whatever a
/// handler asked (found in review: milliseconds::max() overflowed, and a
/// negative wait went out negative).
[[nodiscard]] std::chrono::milliseconds announced_retry_after(const error_info& e) noexcept;

/// An RFC 9457 problem+json response for `e` with http_status_of(e), and
/// members `code`, `retryable` and (when set) `in_doubt`.
[[nodiscard]] response problem_response(const error_info& e);

}  // namespace orpheus
