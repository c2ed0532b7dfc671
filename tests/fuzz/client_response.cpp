// The client's reading of an answer: Retry-After (parse_retry_after) and a
// problem+json body's "retryable" (retry_loop::after).
//
// Input: "<status>\n<Retry-After>\n<Content-Type>\n<body>"; missing lines are
// empty (no such header).
//
// Properties:
//  - parse_retry_after: delta-seconds are read exactly (leading zeros aside,
//    more than 9 digits clamp to a year), white space around the value does
//    not matter, a date (in any of its three forms) gives a wait >= 0 that
//    shrinks as time passes, one second a second;
//  - retry_loop::after never throws, and decides as retry.hpp says: a 2xx, a
//    4xx other than 409/429, a 501, and any answer whose problem+json body
//    says "retryable": false (a JSON boolean) are final; anything else is
//    retried after max(jittered backoff, Retry-After), unless that wait
//    passes the deadline.
#include <boost/beast/http.hpp>
#include <chrono>
#include <nlohmann/json.hpp>

#include "fuzz_support.hpp"
#include "orpheus/client/client.hpp"
#include "orpheus/client/retry.hpp"

namespace {

namespace http = boost::beast::http;
using namespace std::chrono_literals;
using orpheus::fuzz::as;
using orpheus::fuzz::shown;

// 2026-11-22 12:00:00.250 UTC, and a steady time.
const std::chrono::system_clock::time_point wall_now =
    std::chrono::system_clock::time_point(1795348800s) + 250ms;
const std::chrono::steady_clock::time_point steady_now = std::chrono::steady_clock::time_point(1h);

std::string_view trimmed(std::string_view v) {
  while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
  while (!v.empty() && v.back() == ' ') v.remove_suffix(1);
  return v;
}

std::string ms(std::optional<std::chrono::milliseconds> v) {
  return v ? std::to_string(v->count()) + "ms" : "nullopt";
}

void check_retry_after(std::string_view value) {
  const auto wait = orpheus::client::parse_retry_after(value, wall_now);
  const auto t = trimmed(value);
  FUZZ_CHECK(orpheus::client::parse_retry_after(t, wall_now) == wait, shown(value));
  FUZZ_CHECK(!wait || *wait >= 0ms, shown(value) + " -> " + ms(wait));
  const bool digits = !t.empty() && t.find_first_not_of("0123456789") == std::string_view::npos;
  if (digits) {
    // Leading zeros are allowed (1*DIGIT): found by this target after the
    // parser learned it and the model here had not.
    auto n = t;
    while (n.size() > 1 && n.front() == '0') n.remove_prefix(1);
    const auto expected =
        n.size() > 9 ? std::chrono::milliseconds(std::chrono::hours(24 * 365))
                     : std::chrono::milliseconds(std::chrono::seconds(std::stol(std::string(n))));
    FUZZ_CHECK(wait == expected, shown(value) + " -> " + ms(wait));
    return;
  }
  if (!wait) return;
  // A date: an hour earlier, the wait is an hour longer (unless clamped).
  const auto earlier = orpheus::client::parse_retry_after(value, wall_now - 1h);
  FUZZ_CHECK(earlier.has_value(), shown(value));
  if (*wait > 0ms && *earlier + 1h < std::chrono::hours(24 * 365)) {
    FUZZ_CHECK(*earlier == *wait + 1h, shown(value) + ": " + ms(earlier) + " vs " + ms(wait));
  }
  FUZZ_CHECK(*earlier >= *wait, shown(value) + ": " + ms(earlier) + " vs " + ms(wait));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto lines = orpheus::fuzz::split(orpheus::fuzz::text_of(data, size), "\n", 4);
  auto line = [&](std::size_t i) { return i < lines.size() ? lines[i] : std::string_view{}; };

  unsigned status = 0;
  for (const char c : line(0).substr(0, 6)) {
    if (c >= '0' && c <= '9') status = status * 10 + static_cast<unsigned>(c - '0');
  }
  status = 100 + status % 900;
  const std::string_view retry_after = line(1);
  const std::string_view content_type = line(2);
  const std::string_view body = line(3);
  check_retry_after(retry_after);

  orpheus::client::http_response res{static_cast<http::status>(status), 11};
  if (!retry_after.empty())
    res.set(http::field::retry_after, as<boost::beast::string_view>(retry_after));
  if (!content_type.empty())
    res.set(http::field::content_type, as<boost::beast::string_view>(content_type));
  res.body() = std::string(body);

  orpheus::client::client_options o;
  o.time.now = [] { return steady_now; };
  o.time.wall_now = [] { return wall_now; };
  o.time.random01 = [] { return 0.5; };
  const orpheus::client::prepared_request req(http::verb::post, "/v1/payments", "{}", {}, "key-1");
  orpheus::client::retry_loop loop(o, req);
  const auto wait = loop.after(res, std::nullopt);  // must not throw
  const auto result = std::move(loop).result();

  // retry.hpp's decision, restated.
  const auto kind = orpheus::client::kind_of_status(status);
  bool final_answer = !orpheus::client::retryable(kind);
  // What the client saw: Beast keeps the field as set, minus white space.
  const auto sent_type = res[http::field::content_type];
  // Media types are case-insensitive (RFC 9110 section 8.3.1): found by this
  // target after the client learned it and the model here had not.
  constexpr std::string_view problem_json = "application/problem+json";
  if (sent_type.size() >= problem_json.size() &&
      boost::beast::iequals(sent_type.substr(0, problem_json.size()),
                            as<boost::beast::string_view>(problem_json))) {
    const auto problem = nlohmann::json::parse(body, nullptr, false);
    if (problem.is_object() && problem.contains("retryable") && problem["retryable"].is_boolean() &&
        !problem["retryable"].get<bool>()) {
      final_answer = true;
    }
  }
  FUZZ_CHECK(result.attempts == 1 && result.response && result.response->body() == body,
             "the answer was not kept");
  if (final_answer) {
    FUZZ_CHECK(!wait && result.why == orpheus::client::stop_reason::answered,
               "status " + std::to_string(status) + " retried; body " + shown(body));
    FUZZ_CHECK(result.last_error == orpheus::client::error_kind::none, std::to_string(status));
    return 0;
  }
  const auto ra_field = res[http::field::retry_after];
  const auto server_wait = ra_field.empty()
                               ? std::nullopt
                               : orpheus::client::parse_retry_after(
                                     std::string_view(ra_field.data(), ra_field.size()), wall_now);
  // Retry 1 with random01 = 0.5: half the base delay.
  const auto expected = std::max(o.policy.base_delay / 2, server_wait.value_or(0ms));
  if (expected >= o.policy.deadline) {
    FUZZ_CHECK(!wait && result.why == orpheus::client::stop_reason::deadline,
               ms(expected) + " past the deadline; got " + ms(wait));
  } else {
    FUZZ_CHECK(wait == expected, "waits " + ms(wait) + ", expected " + ms(expected) +
                                     " for Retry-After " + shown(retry_after));
  }
  return 0;
}
