// Fingerprints of form bodies (middleware::canonical_request): the order of
// different fields does not matter; the order of a repeated field does
// (issue 7, defect 2), and nothing else may be lost.
//
// Input: one application/x-www-form-urlencoded body, or two separated by
// "\n--\n".
//
// The payload of a form body is what any handler can read from it: its
// fields (cut at '&'), each a name and a value (cut at the first '='; no '='
// is a name alone), names and values decoded as
// application/x-www-form-urlencoded ('+' is a space, %XX a byte), grouped by
// decoded name, each group in the order sent.
//
// Properties, for every body:
//  - it is fingerprinted as "form:" + a body with the same payload, so two
//    bodies with one fingerprint are one payload whatever a handler does with
//    repeated names (first wins, last wins, a list);
//  - canonicalisation is stable: the canonical body gets the same text again;
// and for two bodies: one fingerprint implies equal payloads.
#include <boost/beast/http.hpp>
#include <map>
#include <optional>
#include <vector>

#include "fuzz_support.hpp"
#include "orpheus/beast/middleware.hpp"
#include "orpheus/detail/hex.hpp"

namespace {

namespace http = boost::beast::http;
using orpheus::fuzz::shown;

orpheus::beast::http_request post(std::string_view body) {
  orpheus::beast::http_request r{http::verb::post, "/v1/payments", 11};
  r.set(http::field::content_type, "application/x-www-form-urlencoded");
  r.body() = std::string(body);
  return r;
}

std::string canonical_body(std::string_view body) {
  static const std::string head = "POST /v1/payments\n\n";
  std::string all = orpheus::beast::middleware::canonical_request(post(body), {}, 64);
  FUZZ_CHECK(all.compare(0, head.size(), head) == 0, shown(all));
  return all.substr(head.size());
}

using orpheus::detail::hex_digit_value;

// WHATWG application/x-www-form-urlencoded percent-decoding.
std::string decoded(std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+') {
      out += ' ';
    } else if (s[i] == '%' && i + 2 < s.size() && hex_digit_value(s[i + 1]) >= 0 &&
               hex_digit_value(s[i + 2]) >= 0) {
      out += static_cast<char>(hex_digit_value(s[i + 1]) * 16 + hex_digit_value(s[i + 2]));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

using payload = std::map<std::string, std::vector<std::optional<std::string>>>;

payload payload_of(std::string_view body) {
  payload p;
  while (!body.empty()) {
    const auto amp = body.find('&');
    const auto field = body.substr(0, amp);
    body = amp == std::string_view::npos ? std::string_view{} : body.substr(amp + 1);
    const auto eq = field.find('=');
    auto& values = p[decoded(field.substr(0, eq))];
    if (eq == std::string_view::npos) {
      values.emplace_back(std::nullopt);
    } else {
      values.emplace_back(decoded(field.substr(eq + 1)));
    }
  }
  return p;
}

payload check_body(std::string_view body) {
  payload p = payload_of(body);
  const std::string c = canonical_body(body);
  FUZZ_CHECK(c.rfind("form:", 0) == 0, shown(c));
  const std::string_view form = std::string_view(c).substr(5);
  FUZZ_CHECK(payload_of(form) == p,
             "the canonical form " + shown(form) + " is not the payload of " + shown(body));
  FUZZ_CHECK(canonical_body(form) == c, "not stable: " + shown(form));
  return p;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  orpheus::fuzz::one_fingerprint_one_payload(data, size, check_body, canonical_body);
  return 0;
}
