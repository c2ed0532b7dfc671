#include "orpheus/client/retry.hpp"

#include <openssl/rand.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <ctime>
#include <span>
#include <stdexcept>

#include "orpheus/beast/server.hpp"
#include "orpheus/detail/hex.hpp"
#include "orpheus/error.hpp"
#include "orpheus/request.hpp"

namespace orpheus::client {

std::string new_idempotency_key() {
  std::array<unsigned char, 16> b{};
  if (RAND_bytes(b.data(), static_cast<int>(b.size())) != 1) {
    throw std::runtime_error("no cryptographic randomness for an idempotency key");
  }
  b[6] = static_cast<unsigned char>((b[6] & 0x0F) | 0x40);  // version 4
  b[8] = static_cast<unsigned char>((b[8] & 0x3F) | 0x80);  // RFC 4122 variant
  // 8-4-4-4-12 hex digits.
  const std::span<const unsigned char> all(b);
  std::string out = orpheus::detail::lowercase_hex(all.first(4));
  for (const std::size_t at : {4, 6, 8})
    out += '-' + orpheus::detail::lowercase_hex(all.subspan(at, 2));
  return out + '-' + orpheus::detail::lowercase_hex(all.subspan(10));
}

std::string entity_key(std::string_view entity, std::string_view id, std::string_view action) {
  std::string out;
  for (const auto part : {entity, id, action}) {
    if (part.empty()) throw std::invalid_argument("entity_key: empty part");
    for (const char c : part) {
      if (c <= 0x20 || c > 0x7E) throw std::invalid_argument("entity_key: not printable ASCII");
    }
    if (!out.empty()) out += '-';
    out.append(part);
  }
  if (auto why = invalid_key_reason(out)) throw std::invalid_argument("entity_key: " + *why);
  return out;
}

error_kind kind_of_status(unsigned status) noexcept {
  // 425 Too Early (RFC 8470): the same for a client, "not now, this key is
  // busy"; found in review, it was a final answer.
  if (status == 409 || status == 425) return error_kind::conflict;
  // The server did not get the whole request in time and closed (RFC 9110
  // section 15.5.9: the client may repeat it); found in review, it ended the
  // call as an answer.
  if (status == 408) return error_kind::network;
  if (!beast::retry_later_status(status)) return error_kind::none;
  return status == 429 ? error_kind::throttled : error_kind::server;
}

std::optional<std::chrono::milliseconds> parse_retry_after(
    std::string_view v, std::chrono::system_clock::time_point now) {
  while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
  while (!v.empty() && v.back() == ' ') v.remove_suffix(1);
  if (v.empty()) return std::nullopt;
  if (std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    // 1*DIGIT: leading zeros are allowed (found in review: "0000000001" was
    // read as longer than a year).
    while (v.size() > 1 && v.front() == '0') v.remove_prefix(1);
    if (v.size() > 9) return std::chrono::hours(24 * 365);  // absurd: clamp, do not overflow
    return std::chrono::seconds(std::stol(std::string(v)));
  }
  // IMF-fixdate: "Sun, 06 Nov 1994 08:49:37 GMT".
  std::tm tm{};
  const std::string s(v);
  const char* end = strptime(s.c_str(), "%a, %d %b %Y %H:%M:%S GMT", &tm);
  if (end == nullptr || *end != '\0') return std::nullopt;
  // Compared in seconds before anything is converted: a year after 2262 (or
  // before 1678) does not fit system_clock's nanoseconds, and converting it
  // overflowed (issue 9, fuzzing: "Fri, 31 Dec 9999 23:59:59 GMT" was
  // undefined behaviour). Further than a year away is clamped, as above.
  const std::chrono::seconds at(timegm(&tm));
  const auto since_epoch = now.time_since_epoch();
  const auto now_s = std::chrono::floor<std::chrono::seconds>(since_epoch);
  if (at <= now_s) return std::chrono::milliseconds(0);
  if (at - now_s > std::chrono::hours(24 * 365)) return std::chrono::hours(24 * 365);
  return std::chrono::duration_cast<std::chrono::milliseconds>(at - since_epoch);
}

void validate(const retry_policy& p) {
  if (p.max_attempts < 1) throw config_error("retry_policy: max_attempts < 1");
  if (p.base_delay.count() <= 0 || p.max_delay < p.base_delay) {
    throw config_error("retry_policy: need 0 < base_delay <= max_delay");
  }
  if (p.deadline.count() <= 0 || p.attempt_timeout.count() <= 0) {
    throw config_error("retry_policy: deadline and attempt_timeout must be positive");
  }
  // Found in review: milliseconds::max() passed, and now + deadline
  // overflowed, so every call stopped at once with "deadline".
  constexpr std::chrono::milliseconds week = std::chrono::hours(24 * 7);
  if (p.deadline > week || p.attempt_timeout > week || p.max_delay > week) {
    throw config_error("retry_policy: deadline, attempt_timeout and max_delay are at most a week");
  }
}

std::chrono::milliseconds backoff(const retry_policy& p, int retry,
                                  std::optional<std::chrono::milliseconds> retry_after,
                                  double random01) {
  const int shift = std::clamp(retry - 1, 0, 30);
  const double ceiling =
      std::min(static_cast<double>(p.max_delay.count()),
               static_cast<double>(p.base_delay.count()) * static_cast<double>(1LL << shift));
  const auto jittered = std::chrono::milliseconds(static_cast<long>(ceiling * random01));
  return std::max(jittered, retry_after.value_or(std::chrono::milliseconds(0)));
}

retry_budget::retry_budget(double capacity, double retry_cost, double timeout_cost, double refund)
    : capacity_(capacity),
      tokens_(capacity),
      retry_cost_(retry_cost),
      timeout_cost_(timeout_cost),
      refund_(refund) {
  // Written as !(x >= 0) so that NaN is refused too.
  if (!(capacity > 0) || !(retry_cost >= 0) || !(timeout_cost >= 0) || !(refund >= 0)) {
    throw config_error(
        "retry_budget: capacity must be positive and the costs and refund not negative");
  }
}

bool retry_budget::try_spend(error_kind kind) {
  const double cost = kind == error_kind::timeout ? timeout_cost_ : retry_cost_;
  std::lock_guard lock(m_);
  if (tokens_ < cost) return false;
  tokens_ -= cost;
  return true;
}

void retry_budget::on_success() {
  std::lock_guard lock(m_);
  tokens_ = std::min(capacity_, tokens_ + refund_);
}

double retry_budget::tokens() const {
  std::lock_guard lock(m_);
  return tokens_;
}

}  // namespace orpheus::client
