#include "orpheus/payment/charge.hpp"

#include <algorithm>
#include <chrono>

#include "orpheus/error.hpp"

namespace orpheus::payment {
namespace {

// The outcome is unknown: retryable, and flagged in doubt so nobody reads it
// as "nothing happened", and so the manager keeps the lease until the
// attempt's deadline instead of letting a retry overlap a charge that may
// still be running at the gateway.
//
// The gateway's own words (`detail`) are internal: logged and recorded, never
// sent to the client, whose message is fixed text (issue 7.13).
[[noreturn]] void unknown_outcome(std::string_view code, const std::string& detail) {
  throw error(error_info::of(error_class::in_doubt, code,
                             "the gateway's outcome is unknown; a retry asks it before charging "
                             "again")
                  .with_internal("gateway: " + detail));
}

[[noreturn]] void refused(std::string_view code, std::string message, const std::string& detail) {
  throw error(error_info::of(error_class::rejected, code, std::move(message))
                  .with_internal("gateway: " + detail));
}

[[noreturn]] void not_yet(std::string_view code, std::string message, const std::string& detail) {
  throw error(error_info::of(error_class::unavailable, code, std::move(message))
                  .with_internal("gateway: " + detail));
}

}  // namespace

std::chrono::milliseconds time_left(const attempt& a) {
  const auto t = std::chrono::duration_cast<std::chrono::milliseconds>(
      a.deadline() - std::chrono::steady_clock::now());
  if (t.count() > 0) return t;
  // Nothing is sent without time left. On a first attempt nothing was ever
  // sent under this key: retryable, not in doubt. On a retry the earlier
  // call is still unknown.
  if (!a.is_retry()) {
    throw retryable_error(codes::gateway_timeout, "no time left before the deadline to call", 504);
  }
  unknown_outcome(codes::gateway_timeout, "no time left before the deadline to ask");
}

gateway_status status_of_http(unsigned http_status) noexcept {
  if (http_status >= 200 && http_status < 300) return gateway_status::charged;
  switch (http_status) {
    case 402:
      return gateway_status::declined;
    case 404:
      return gateway_status::not_found;
    case 408:
    case 504:
      return gateway_status::timeout;
    case 409:  // the gateway is still processing a request with this key
    case 425:  // Too Early: the same, in RFC 8470's words
      return gateway_status::in_progress;
    case 429:
      return gateway_status::throttled;
    case 401:  // this service's credentials (a key rotated, a permission missing)
    case 403:
      return gateway_status::unauthorized;
    case 421:
      // Misdirected Request: a server on the way that will not answer for the
      // gateway's host (RFC 9110, 15.5.20), not the gateway's word on the
      // payment. Found in review: it was invalid, a final refusal recorded
      // for a payment that could still go through. Unknown, as a 5xx.
      return gateway_status::server_error;
    default:
      break;
  }
  if (http_status >= 400 && http_status < 500) return gateway_status::invalid;
  // 5xx, and statuses a payment API has no business sending (1xx, 3xx): the
  // outcome is unknown, never a refusal.
  return gateway_status::server_error;
}

std::string charge_id_of(const gateway_answer& answer) {
  switch (answer.status) {
    case gateway_status::charged:
      // Found in review: "charged" with no charge id was a success with an
      // empty reference. Charged by the gateway's word, with nothing to
      // show for it: unknown, the key held, and a retry asks again.
      if (answer.charge_id.empty()) {
        unknown_outcome(codes::gateway_error, "charged, without a charge id: " + answer.detail);
      }
      return answer.charge_id;
    case gateway_status::declined:
      refused(codes::card_declined, "the payment was declined", answer.detail);
    case gateway_status::invalid:
      refused(codes::invalid_payment, "the gateway refused the payment", answer.detail);
    case gateway_status::connect_failed:
      not_yet(codes::gateway_unreachable, "could not reach the gateway", answer.detail);
    case gateway_status::throttled:
      // A 429 is an answer to this request alone: the gateway did not act on
      // it. Retryable, not in doubt (issue 7, defect 5: it was invalid_payment).
      not_yet(codes::gateway_throttled, "the gateway asked to slow down", answer.detail);
    case gateway_status::unauthorized:
      // The gateway refused this service's credentials, most likely before
      // looking at the payment, and the same request goes through once they
      // are put right (found in review: it was invalid_payment, a final
      // failure replayed for good, during a key rotation say). In doubt all
      // the same: a proxy between may answer 403 for a call it passed on,
      // and holding the key costs only the lease (a second review).
      unknown_outcome(codes::gateway_unauthorized,
                      "the gateway refused this service's credentials: " + answer.detail);
    case gateway_status::in_progress:
      // A 409: a charge with this key is still running at the gateway, so its
      // outcome is unknown (issue 7, defect 5: it was invalid_payment, a
      // final failure recorded over money that was being charged).
      unknown_outcome(codes::gateway_in_progress, answer.detail);
    case gateway_status::timeout:
      unknown_outcome(codes::gateway_timeout, answer.detail);
    case gateway_status::not_found:  // a status answer where a charge answer was due
    case gateway_status::server_error:
    case gateway_status::reset:
      break;
  }
  unknown_outcome(codes::gateway_error, answer.detail);
}

std::string charge_once(gateway& g, const attempt& a, const charge_request& r,
                        std::string_view step) {
  const std::string key = a.downstream_key(step);
  if (a.is_retry()) {
    // An earlier attempt may have charged: ask before acting again. Only
    // three answers settle it; anything else (a refused query, a 409 because
    // the first charge is still running, a 429, 5xx, no answer) leaves the
    // earlier charge unknown, and charging now could charge twice or record a
    // final failure over money taken (issue 7, defect 5).
    // When the query left: an earlier call that lands while it is answered
    // is not in its answer (found in review: the time was read after it).
    const auto asked = std::chrono::steady_clock::now();
    const auto known = g.status(key, time_left(a));
    switch (known.status) {
      case gateway_status::charged:
      case gateway_status::declined:
        return charge_id_of(known);
      case gateway_status::not_found:
        // A gateway that charges a key again may still act on an earlier
        // call it has not seen yet (found in review: a charge slower than
        // the caller's timeout was not found by the retry, which charged
        // again). Until that call can no longer land, not_found says nothing.
        // Retryable, not in doubt: nothing was sent now, so the earlier
        // call's window is not pushed back (as an in-doubt hold would), and
        // the retry comes when it has ended.
        if (!g.deduplicates() && asked < a.earlier_may_land_until()) {
          const auto left = std::chrono::ceil<std::chrono::milliseconds>(
              a.earlier_may_land_until() - std::chrono::steady_clock::now());
          throw error(error_info::of(error_class::unavailable, codes::earlier_charge_may_land,
                                     "an earlier attempt's charge may still reach the gateway; "
                                     "retry with the same key after Retry-After")
                          .with_http_status(503)
                          .with_retry_after(std::max(left, std::chrono::milliseconds(1000)))
                          .with_internal("gateway: no charge under this key yet, and it does "
                                         "not deduplicate: charging now could charge twice"));
        }
        break;
      default:
        unknown_outcome(codes::charge_status_unknown,
                        "the status query did not settle the earlier charge: " + known.detail);
    }
  }
  return charge_id_of(g.charge(r, key, time_left(a)));
}

}  // namespace orpheus::payment
