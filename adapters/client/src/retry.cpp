#include "orpheus/client/retry.hpp"

#include <openssl/rand.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
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

namespace {

// HTTP-date (RFC 9110 section 5.6.7) in its three forms, read with fixed
// English names. Found in review: strptime() read only the first form, and
// its %a and %b follow LC_TIME, so in a program that had called setlocale()
// not even that one; an RFC 850 or asctime date was ignored and the client
// retried at its own short backoff until its attempts ran out.
class date_reader {
 public:
  explicit date_reader(std::string_view s) : s_(s) {}
  [[nodiscard]] bool done() const noexcept { return s_.empty(); }
  bool text(std::string_view t) noexcept {
    if (!s_.starts_with(t)) return false;
    s_.remove_prefix(t.size());
    return true;
  }
  /// Exactly n digits.
  bool digits(std::size_t n, int& out) noexcept {
    if (s_.size() < n) return false;
    int v = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (s_[i] < '0' || s_[i] > '9') return false;
      v = v * 10 + (s_[i] - '0');
    }
    s_.remove_prefix(n);
    out = v;
    return true;
  }
  /// One of `names`; its index.
  template <std::size_t N>
  bool one_of(const std::array<std::string_view, N>& names, int& out) noexcept {
    for (std::size_t i = 0; i < N; ++i) {
      if (text(names[i])) {
        out = static_cast<int>(i);
        return true;
      }
    }
    return false;
  }
  /// hh:mm:ss
  bool time_of_day(int& h, int& m, int& sec) noexcept {
    return digits(2, h) && text(":") && digits(2, m) && text(":") && digits(2, sec);
  }

 private:
  std::string_view s_;
};

constexpr std::array<std::string_view, 7> day_names = {"Mon", "Tue", "Wed", "Thu",
                                                       "Fri", "Sat", "Sun"};
constexpr std::array<std::string_view, 7> long_day_names = {
    "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"};
constexpr std::array<std::string_view, 12> month_names = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                                          "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};

}  // namespace

std::optional<std::int64_t> http_date_seconds(std::string_view v,
                                              std::chrono::system_clock::time_point now) {
  int year = 0;
  int month = 0;
  int day = 0;
  int h = 0;
  int m = 0;
  int sec = 0;
  int ignored = 0;
  const auto imf = [&] {  // Sun, 06 Nov 1994 08:49:37 GMT
    date_reader r(v);
    return r.one_of(day_names, ignored) && r.text(", ") && r.digits(2, day) && r.text(" ") &&
           r.one_of(month_names, month) && r.text(" ") && r.digits(4, year) && r.text(" ") &&
           r.time_of_day(h, m, sec) && r.text(" GMT") && r.done();
  };
  const auto rfc850 = [&] {  // Sunday, 06-Nov-94 08:49:37 GMT
    date_reader r(v);
    return r.one_of(long_day_names, ignored) && r.text(", ") && r.digits(2, day) && r.text("-") &&
           r.one_of(month_names, month) && r.text("-") && r.digits(2, year) && r.text(" ") &&
           r.time_of_day(h, m, sec) && r.text(" GMT") && r.done();
  };
  const auto asctime = [&] {  // Sun Nov  6 08:49:37 1994
    date_reader r(v);
    return r.one_of(day_names, ignored) && r.text(" ") && r.one_of(month_names, month) &&
           r.text(" ") && (r.text(" ") ? r.digits(1, day) : r.digits(2, day)) && r.text(" ") &&
           r.time_of_day(h, m, sec) && r.text(" ") && r.digits(4, year) && r.done();
  };
  bool two_digit_year = false;
  if (!imf()) {
    if (rfc850()) {
      two_digit_year = true;
    } else if (!asctime()) {
      return std::nullopt;
    }
  }
  if (h > 23 || m > 59 || sec > 60) return std::nullopt;  // 60: a leap second
  const auto instant = [&](int y) -> std::optional<std::chrono::sys_seconds> {
    const std::chrono::year_month_day ymd{std::chrono::year(y),
                                          std::chrono::month(static_cast<unsigned>(month + 1)),
                                          std::chrono::day(static_cast<unsigned>(day))};
    if (!ymd.ok()) return std::nullopt;
    return std::chrono::sys_days(ymd) + std::chrono::hours(h) + std::chrono::minutes(m) +
           std::chrono::seconds(sec);
  };
  if (!two_digit_year) {
    const auto at = instant(year);
    if (!at) return std::nullopt;
    return at->time_since_epoch().count();
  }
  // RFC 9110: a two-digit year that would put the date more than 50 years
  // in the future is the most recent past year with the same last two
  // digits. So the date is the one of its three readings around this
  // century that falls in (now - 50 years, now + 50 years] (the later
  // bound is the RFC's; the earlier, which it leaves open, takes the nearer
  // reading). Each reading is checked as a whole date: 29-Feb-00 is 2000
  // from 1975, where 1900 had none (found in review).
  const auto now_s = std::chrono::floor<std::chrono::seconds>(now);
  const int this_year = static_cast<int>(
      std::chrono::year_month_day(std::chrono::floor<std::chrono::days>(now)).year());
  const int base = this_year - this_year % 100 + year;
  for (const int y : {base - 100, base, base + 100}) {
    const auto at = instant(y);
    if (at && *at > now_s - std::chrono::years(50) && *at <= now_s + std::chrono::years(50)) {
      return at->time_since_epoch().count();
    }
  }
  return std::nullopt;  // 29 February of a year that has none
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
  const auto date = http_date_seconds(v, now);
  if (!date) return std::nullopt;
  // Compared in seconds before anything is converted: a year after 2262 (or
  // before 1678) does not fit system_clock's nanoseconds, and converting it
  // overflowed (issue 9, fuzzing: "Fri, 31 Dec 9999 23:59:59 GMT" was
  // undefined behaviour). Further than a year away is clamped, as above.
  const std::chrono::seconds at(*date);
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
