#include "orpheus/payment/charge.hpp"

#include "orpheus/error.hpp"

namespace orpheus::payment {
namespace {

// The outcome is unknown: retryable, and flagged in doubt so nobody reads it
// as "nothing happened".
[[noreturn]] void unknown_outcome(int status, std::string code, const std::string& detail) {
  throw error(error_info{
      status, std::move(code),
      "the gateway's outcome is unknown (" + detail + "); a retry asks it before charging again",
      true, true, std::chrono::milliseconds(1000)});
}

std::chrono::milliseconds left(const attempt& a) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(a.deadline() -
                                                               std::chrono::steady_clock::now());
}

}  // namespace

std::string classify(const gateway_answer& answer) {
  switch (answer.status) {
    case gateway_status::charged:
      return answer.charge_id;
    case gateway_status::declined:
      throw non_retryable_error("card_declined", "the payment was declined: " + answer.detail, 402);
    case gateway_status::invalid:
      throw non_retryable_error("invalid_payment",
                                "the gateway refused the payment: " + answer.detail, 422);
    case gateway_status::connect_failed:
      throw retryable_error("gateway_unreachable", "could not reach the gateway: " + answer.detail,
                            503);
    case gateway_status::timeout:
      unknown_outcome(504, "gateway_timeout", answer.detail);
    case gateway_status::not_found:  // a status answer where a charge answer was due
    case gateway_status::server_error:
    case gateway_status::reset:
      break;
  }
  unknown_outcome(502, "gateway_error", answer.detail);
}

std::string charge_once(gateway& g, const attempt& a, const charge_request& r,
                        std::string_view step) {
  const std::string key = a.downstream_key(step);
  auto time_left = [&] {
    const auto t = left(a);
    if (t.count() <= 0) unknown_outcome(504, "gateway_timeout", "no time left before the deadline");
    return t;
  };
  if (a.is_retry()) {
    // An earlier attempt may have charged: ask before acting again.
    const auto known = g.status(key, time_left());
    if (known.status != gateway_status::not_found) return classify(known);
  }
  return classify(g.charge(r, key, time_left()));
}

}  // namespace orpheus::payment
