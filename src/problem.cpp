#include "orpheus/problem.hpp"

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <string_view>

namespace orpheus {
namespace {

struct code_status {
  std::string_view code;
  int status;
};

// Library codes whose HTTP status is not their class's (docs/errors.md).
constexpr code_status kByCode[] = {
    {codes::fingerprint_mismatch, 422},  {codes::unauthenticated, 401},
    {codes::downstream_timeout, 504},    {codes::gateway_timeout, 504},
    {codes::downstream_closed, 502},     {codes::gateway_error, 502},
    {codes::charge_status_unknown, 502}, {codes::card_declined, 402},
    {codes::request_cancelled, 409},
};

int status_of_class(error_class c) noexcept {
  switch (c) {
    case error_class::invalid_input:
      return 400;
    case error_class::conflict:
      return 409;
    case error_class::unavailable:
    case error_class::in_doubt:
      return 503;
    case error_class::rejected:
      return 422;
    case error_class::internal:
      break;
  }
  return 500;
}

}  // namespace

int http_status_of(const error_info& e) noexcept {
  int status = status_of_class(e.kind);
  if (e.http_status && *e.http_status >= 400 && *e.http_status <= 599) {
    status = *e.http_status;
  } else if (const code_info* known = find_code(e.code); known && known->usual == e.kind) {
    // Only as the library emits it: a handler's own final failure named
    // gateway_error stays a 422, never a 502 that clients would retry.
    for (const auto& [code, s] : kByCode) {
      if (e.code == code) status = s;
    }
  }
  // "Try again later": a client does not retry other 4xx answers, nor 501
  // (found in review: a handler's retryable 501 went out as it was, and
  // HTTP clients gave up). 429 says the request was not acted on: never of a
  // call that may have been (found in review: a client took an in-doubt
  // 429 for "nothing happened").
  if (e.retryable() && ((status < 500 && status != 409 && status != 429) || status == 501 ||
                        (status == 429 && e.in_doubt()))) {
    status = 503;
  }
  return status;
}

std::chrono::milliseconds announced_retry_after(const error_info& e) noexcept {
  return std::clamp(e.retry_after.value_or(default_retry_after), std::chrono::milliseconds(0),
                    std::chrono::milliseconds(std::chrono::hours(24)));
}

response problem_response(const error_info& e) {
  const int status = http_status_of(e);
  nlohmann::json body = {
      {"type", "urn:orpheus:error:" + e.code},
      {"title", e.code},
      {"status", status},
      {"detail", e.message},
      {"code", e.code},
      {"retryable", e.retryable()},
  };
  if (e.in_doubt()) body["in_doubt"] = true;
  response r;
  r.status = status;
  r.headers.emplace_back("Content-Type", "application/problem+json");
  r.body = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return r;
}

}  // namespace orpheus
