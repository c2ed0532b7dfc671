// A request's identity and fingerprint from plain strings (identify.hpp).
// Moved here from the Beast middleware (issue 10, item 5), unchanged, so that
// any front end computes them the same way.
#include "orpheus/identify.hpp"

#include <algorithm>
#include <clocale>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "orpheus/detail/ascii.hpp"
#include "orpheus/detail/hex.hpp"

namespace orpheus {
namespace {

// Form bodies: the same fields in another order are the same request. Only
// the NAMES are ordered, stably: the order of a repeated field is part of its
// meaning. (Issue 7, defect 2: sorting whole "name=value" fields gave
// amount=100&...&amount=5 and amount=5&...&amount=100 one fingerprint, and
// the second payment was answered with the first one's replay.)
// Issue 9 (fuzzing): names are compared as a handler reads them, decoded
// ('+' is a space, %XX a byte): amount=100&%61mount=5 and
// %61mount=5&amount=100 were one fingerprint, though both send "amount"
// twice, in another order. The fields themselves are kept as sent.
std::string canonical_form(std::string_view body) {
  using detail::hex_digit_value;
  auto decoded_name = [&](std::string_view f) {
    f = f.substr(0, f.find('='));
    std::string out;
    for (std::size_t i = 0; i < f.size(); ++i) {
      if (f[i] == '+') {
        out += ' ';
      } else if (f[i] == '%' && i + 2 < f.size() && hex_digit_value(f[i + 1]) >= 0 &&
                 hex_digit_value(f[i + 2]) >= 0) {
        out += static_cast<char>(hex_digit_value(f[i + 1]) * 16 + hex_digit_value(f[i + 2]));
        i += 2;
      } else {
        out += f[i];
      }
    }
    return out;
  };
  std::vector<std::pair<std::string, std::string_view>> fields;  // decoded name, field
  while (!body.empty()) {
    const auto amp = body.find('&');
    const auto field = body.substr(0, amp);
    fields.emplace_back(decoded_name(field), field);
    body = amp == std::string_view::npos ? std::string_view{} : body.substr(amp + 1);
  }
  std::stable_sort(fields.begin(), fields.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::string out;
  for (const auto& f : fields) out.append(f.second).push_back('&');
  return out;
}

// Members of every object in `j`, however deep (bounded by the depth check
// that runs before parsing).
std::size_t members_in(const nlohmann::json& j) {
  std::size_t n = j.is_object() ? j.size() : 0;
  if (j.is_structured()) {
    for (const auto& v : j) n += members_in(v);
  }
  return n;
}

// A JSON number's decimal value, exactly: its sign, its digits without
// leading or trailing zeros, and the power of ten of the last one ("-1.50e2"
// is -, "15", 1). Zero has no digits (and no sign). Exponents beyond 10^15
// are clamped: such a number is no double's exact value anyway.
struct decimal_value {
  bool negative = false;
  std::string digits;
  long long exponent = 0;
  bool operator==(const decimal_value&) const = default;
};

std::optional<decimal_value> decimal_of(std::string_view s) {
  decimal_value d;
  std::size_t i = 0;
  if (i < s.size() && s[i] == '-') {
    d.negative = true;
    ++i;
  }
  long long fraction_digits = 0;
  bool any_digit = false;
  bool in_fraction = false;
  for (; i < s.size() && s[i] != 'e' && s[i] != 'E'; ++i) {
    if (s[i] == '.' && !in_fraction) {
      in_fraction = true;
    } else if (s[i] >= '0' && s[i] <= '9') {
      any_digit = true;
      if (in_fraction) ++fraction_digits;
      if (!d.digits.empty() || s[i] != '0') d.digits += s[i];
    } else {
      return std::nullopt;  // "null" (what an infinite double prints as), or not a number
    }
  }
  if (!any_digit) return std::nullopt;
  long long exponent = 0;
  if (i < s.size()) {
    ++i;
    bool negative_exponent = false;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) negative_exponent = s[i++] == '-';
    if (i == s.size()) return std::nullopt;
    constexpr long long clamp = 1'000'000'000'000'000;
    for (; i < s.size(); ++i) {
      if (s[i] < '0' || s[i] > '9') return std::nullopt;
      exponent = std::min(clamp, exponent * 10 + (s[i] - '0'));
    }
    if (negative_exponent) exponent = -exponent;
  }
  d.exponent = exponent - fraction_digits;
  while (!d.digits.empty() && d.digits.back() == '0') {
    d.digits.pop_back();
    ++d.exponent;
  }
  if (d.digits.empty()) return decimal_value{};  // zero, whatever its sign or exponent
  return d;
}

// The checks that come before a JSON body is parsed for its fingerprint, by
// SAX events (nothing is built): member names are counted (see below), and
// a number that the parser would not print back as the decimal value sent
// stops the parse. nlohmann holds an integer beyond 64 bits, and every number
// with a fraction or an exponent, as a double, so 100000000000000000001 and
// 100000000000000000000 were one payload (both print as 1e+20), as were
// 1.000000000000000001 and 1.0, and 1e-400 and 0.0 (found in review): a
// handler that reads amounts as decimals, or as big integers, would have been
// handed the second payload under the first one's key and answered with its
// replay. A number is kept when dump() prints its double as the same decimal
// value as sent: 1.50 is 1.5, 0.30000000000000004 is itself. (dump() does not
// always print the shortest text: 4.995e-24 prints as 4.9949999999999996e-24
// and is taken as sent. A number out of a double's range is no JSON to
// nlohmann: taken as sent before this.)
class json_body_check final : public nlohmann::json::json_sax_t {
 public:
  std::size_t names_read = 0;

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t value, const string_t& text) override {
    // nlohmann's lexer writes the C locale's decimal point into the text it
    // hands on (for strtod): "12,50" where LC_NUMERIC is de_DE (found in
    // review: every decimal was taken as sent in such a process).
    std::string sent = text;
    if (decimal_point_ != '.') std::replace(sent.begin(), sent.end(), decimal_point_, '.');
    const auto as_sent = decimal_of(sent);
    return as_sent && as_sent == decimal_of(nlohmann::json(value).dump());
  }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override {
    ++names_read;
    return true;
  }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;
  }

 private:
  // As nlohmann's lexer reads it (lexer.hpp: get_decimal_point()).
  const char decimal_point_ = [] {
    const std::lconv* c = std::localeconv();
    return c == nullptr || c->decimal_point == nullptr ? '.' : *c->decimal_point;
  }();
};

std::string canonical_body(std::string_view content_type, std::string_view body,
                           std::size_t max_json_depth) {
  const auto type = detail::ascii_lower(content_type);
  if (type.rfind("application/json", 0) == 0 && !json_nested_deeper_than(body, max_json_depth)) {
    // Parsed and dumped again: key order and white space do not matter. A
    // body that does not parse is fingerprinted as it is (the handler will
    // refuse it anyway). So is one with a number the parser cannot hold
    // exactly (json_body_check). So is one with a member name twice in an
    // object: the parser keeps the last, and {"amount":100,"amount":5} and
    // {"amount":5} were one fingerprint, though a handler whose parser keeps
    // the first reads 100 (found in review). A repeated name shows as fewer
    // members parsed than names read: counted, nothing stored per name
    // (this runs on the io thread, for every request).
    json_body_check check;
    if (nlohmann::json::sax_parse(body, &check)) {
      auto j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
      if (!j.is_discarded() && members_in(j) == check.names_read) return "json:" + j.dump();
    }
  }
  if (type.rfind("application/x-www-form-urlencoded", 0) == 0) {
    return "form:" + canonical_form(body);
  }
  return "raw:" + std::string(body);
}

error_info bad_request(std::string_view code, std::string message) {
  return error_info::of(error_class::invalid_input, code, std::move(message));
}

}  // namespace

bool is_json_content_type(std::string_view content_type) {
  return detail::ascii_lower(content_type).rfind("application/json", 0) == 0;
}

// Issue 7, defect 14(a): nlohmann's dump() (and the handler's own use of the
// value) recurses once per level, so 100000 '[' overflowed the io thread's
// stack.
bool json_nested_deeper_than(std::string_view text, std::size_t limit) {
  std::size_t depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return true;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return false;
}

std::string canonical_request(const request_text& r, std::size_t max_json_depth) {
  std::string out;
  out.append(r.method).push_back(' ');
  out.append(r.target).push_back('\n');
  for (const auto& [name, value] : r.headers) {
    out.append(detail::ascii_lower(name)).push_back(':');
    out.append(value).push_back('\n');
  }
  out.push_back('\n');
  out.append(canonical_body(r.content_type, r.body, max_json_depth));
  return out;
}

std::variant<identity, error_info> identify(
    const request_text& r, std::optional<std::string_view> key_header_value,
    const std::function<std::optional<std::string>()>& scope, const identify_options& options) {
  const std::string header(options.key_header);
  identity who;
  if (key_header_value) {
    // The header's reading and the key rule are the core's: the client
    // helper sends with the same pair, so a key it accepts is a key this
    // accepts.
    std::optional<std::string> key = key_of_header_value(*key_header_value);
    if (!key) {
      const std::string_view v = *key_header_value;
      if (v.find(',') != std::string_view::npos && v.find('"') == std::string_view::npos) {
        return bad_request(codes::invalid_key,
                           header +
                               " holds more than one value (sent twice, or a comma "
                               "outside quotes): send one key, quoted if it has a comma");
      }
      return bad_request(codes::invalid_key, header + " is not a valid token or quoted string");
    }
    // The key rule too, before the caller is asked for (found in review: a
    // key too long or not printable was a 401 without a caller, where
    // docs/http.md says a broken key is a 400 whoever sends it).
    if (auto why = invalid_key_reason(*key)) return bad_request(codes::invalid_key, *why);
    who.id.key = std::move(*key);
    who.key_sent = true;
  } else if (options.key_required) {
    return bad_request(codes::missing_key, "this request needs an " + header + " header");
  } else {
    // No key where none is required: no deduplication, as with any API. The
    // request runs once under a key of its own. 128 random bits per made-up
    // key (issue 7.14(b): a thread_local mt19937_64 seeded once was
    // predictable and repeated in a forked child).
    who.id.key = "orpheus-unkeyed-" + random_token();
  }
  // Before anything parses the body (in the Beast middleware, on the io
  // thread).
  if (is_json_content_type(r.content_type) &&
      json_nested_deeper_than(r.body, options.max_json_depth)) {
    return bad_request(codes::invalid_request, "the JSON body is nested deeper than " +
                                                   std::to_string(options.max_json_depth) +
                                                   " levels");
  }
  std::optional<std::string> caller = scope ? scope() : std::nullopt;
  if (!caller) {
    return error_info::of(error_class::invalid_input, codes::unauthenticated, "no caller identity");
  }
  who.id.scope = std::move(*caller);
  // The key passed its rule above (or was made up here), and the fingerprint
  // is SHA-256 hex by construction: of validate()'s three rules only the
  // scope's is left.
  if (auto why = invalid_scope_reason(who.id.scope)) return bad_request(codes::invalid_scope, *why);
  who.id.fingerprint = fingerprint_of(canonical_request(r, options.max_json_depth));
  return who;
}

}  // namespace orpheus
