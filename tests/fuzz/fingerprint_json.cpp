// Fingerprints of JSON bodies (middleware::canonical_request): key order and
// white space do not matter, and nothing else may be lost.
//
// Input: one body, or two separated by "\n--\n".
//
// Properties, for every body:
//  - a body is fingerprinted either as "json:" + a text that parses to the
//    same value as the body, or as "raw:" + its bytes, the latter only when
//    it is not JSON, is nested deeper than max_json_depth, names a member
//    twice in one object (the parser would keep only the last), or holds a
//    number the parser reads as a double that prints as other text than
//    sent (it may be another decimal value: 1.000000000000000001 is 1.0). So the
//    canonical text determines the payload: two bodies with one fingerprint
//    are one payload;
//  - canonicalisation is stable: the canonical body, sent again, gets the
//    same canonical text;
// and for two bodies: one fingerprint implies equal payloads (nlohmann
// equality when they parse, the same bytes when they do not).
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>
#include <utility>
#include <variant>
#include <vector>

#include "fuzz_support.hpp"
#include "orpheus/beast/middleware.hpp"

namespace {

namespace http = boost::beast::http;
using orpheus::fuzz::shown;

constexpr std::size_t max_depth = 64;  // middleware_options::max_json_depth

orpheus::beast::http_request post(std::string_view body) {
  orpheus::beast::http_request r{http::verb::post, "/v1/payments", 11};
  r.set(http::field::content_type, "application/json; charset=utf-8");
  r.body() = std::string(body);
  return r;
}

// The canonical body: canonical_request() minus the request line and the
// (empty) header block.
std::string canonical_body(std::string_view body) {
  static const std::string head = "POST /v1/payments\n\n";
  std::string all = orpheus::beast::middleware::canonical_request(post(body), {}, max_depth);
  FUZZ_CHECK(all.compare(0, head.size(), head) == 0, shown(all));
  return all.substr(head.size());
}

// Nesting depth of a parsed value, without recursion.
std::size_t depth_of(const nlohmann::json& root) {
  std::size_t deepest = 0;
  std::vector<std::pair<const nlohmann::json*, std::size_t>> todo{{&root, 0}};
  while (!todo.empty()) {
    const auto [j, d] = todo.back();
    todo.pop_back();
    if (!j->is_structured()) continue;
    deepest = std::max(deepest, d + 1);
    for (const auto& child : *j) todo.emplace_back(&child, d + 1);
  }
  return deepest;
}

// Whether a JSON text names a member twice in one object, or holds a number
// read as a double that prints as other text, by SAX events.
class repeated_names final : public nlohmann::json::json_sax_t {
 public:
  bool found = false;
  bool reprinted = false;
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t value, const string_t& text) override {
    reprinted = reprinted || nlohmann::json(value).dump() != text;
    return true;
  }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    open_.emplace_back();
    return true;
  }
  bool key(string_t& name) override {
    for (const auto& n : open_.back()) found = found || n == name;
    open_.back().push_back(name);
    return true;
  }
  bool end_object() override {
    open_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;
  }

 private:
  std::vector<std::vector<std::string>> open_;
};

bool names_a_member_twice_or_reprints_a_number(std::string_view body) {
  repeated_names sax;
  nlohmann::json::sax_parse(body, &sax);
  return sax.found || sax.reprinted;
}

// What a body means: its value when it is JSON, else its bytes. (nlohmann
// reads a NUL byte as the end of the text: "1\0x" is 1.)
using payload = std::variant<std::string, nlohmann::json>;

payload payload_of(std::string_view body) {
  auto value = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) return std::string(body);
  return value;
}

payload check_body(std::string_view body) {
  payload p = payload_of(body);
  const std::string c = canonical_body(body);
  if (c.rfind("json:", 0) == 0) {
    const auto* value = std::get_if<nlohmann::json>(&p);
    FUZZ_CHECK(value != nullptr, shown(body) + " is not JSON but -> " + shown(c));
    const std::string_view text = std::string_view(c).substr(5);
    const auto back = nlohmann::json::parse(text, nullptr, false);
    FUZZ_CHECK(!back.is_discarded() && back == *value,
               "the canonical text " + shown(text) + " is not the payload of " + shown(body));
    FUZZ_CHECK(canonical_body(text) == c, "not stable: " + shown(text));
  } else {
    FUZZ_CHECK(c == "raw:" + std::string(body), shown(body) + " -> " + shown(c));
    // Taken as it is only when it is not JSON, nested too deep (the
    // middleware counts the brackets of the whole text, past a NUL too),
    // names a member twice or holds a number that may not be what it says.
    const auto* value = std::get_if<nlohmann::json>(&p);
    FUZZ_CHECK(value == nullptr || depth_of(*value) > max_depth ||
                   body.find('\0') != std::string_view::npos ||
                   names_a_member_twice_or_reprints_a_number(body),
               "JSON taken as raw bytes: " + shown(body));
  }
  return p;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  orpheus::fuzz::one_fingerprint_one_payload(data, size, check_body, canonical_body);
  return 0;
}
