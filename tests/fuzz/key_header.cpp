// Idempotency keys: orpheus::validate(), the middleware's reading of the
// Idempotency-Key header, and the client's keys as the server reads them.
//
// Input: "<X-Client-Id>\n<Idempotency-Key value>[\n<fingerprint>]"; an input
// without a newline is the header value alone (client "c1").
//
// Properties:
//  - the key rule is defined once, in the core (invalid_key_reason(),
//    invalid_scope_reason()), and that definition says exactly what the
//    documented rule, restated below as valid_token(), says;
//  - validate() accepts exactly the documented keys and scopes (1..255 bytes
//    of 0x20..0x7E, no space at either end) and fingerprints (64 lowercase
//    hex), and refuses the rest with bad_input_error naming the first bad part;
//  - the middleware reads a header value as a bare token (no comma: that is
//    a list of values) or as an RFC 8941 sf-string, nothing else: it accepts a value exactly when
//    that reading is a valid key, the key it returns is that reading, the quoted and bare forms of
//    an accepted key read back as the same key, and a refusal is a 400 problem+json that never
//    echoes the key;
//  - the client (prepared_request) accepts the keys the server accepts, and
//    each reaches the server as exactly that key: two different client keys
//    never become one server key; a key it refuses is refused with the
//    core's reason.
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <variant>

#include "fuzz_support.hpp"
#include "orpheus/beast/middleware.hpp"
#include "orpheus/client/client.hpp"
#include "orpheus/detail/hex.hpp"
#include "orpheus/manager.hpp"
#include "orpheus/request.hpp"

namespace {

namespace http = boost::beast::http;
using orpheus::fuzz::as;
using orpheus::fuzz::shown;
using orpheus::fuzz::split;

// The middleware's identify() never touches the store: every call to this
// backend fails.
class no_backend final : public orpheus::store_backend {
 public:
  [[nodiscard]] std::size_t shard_count() const override { return 1; }
  [[nodiscard]] const orpheus::sql_dialect& dialect() const override { return dialect_; }
  [[nodiscard]] std::span<const orpheus::detail::migration> migrations() const override {
    return {};
  }
  std::unique_ptr<orpheus::backend_tx> begin(std::size_t) override { fail(); }
  orpheus::sql_rows read(std::size_t, std::string_view,
                         std::span<const orpheus::sql_value>) override {
    fail();
  }
  void exclusively(std::size_t, const std::function<void(orpheus::tx&)>&) override { fail(); }

 private:
  [[noreturn]] static void fail() { throw std::logic_error("key_header: the store was used"); }
  orpheus::sql_dialect dialect_{.bounded_delete = [](std::string_view, std::string_view,
                                                     std::string_view) { return std::string(); }};
};

// The documented rule for keys and scopes (request.hpp, README), restated
// here as the oracle the one definition in the core is checked against.
bool valid_token(std::string_view v, std::size_t max) {
  if (v.empty() || v.size() > max || v.front() == ' ' || v.back() == ' ') return false;
  for (const char c : v) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u > 0x7E) return false;
  }
  return true;
}

bool valid_fingerprint(std::string_view f) { return orpheus::detail::is_lowercase_hex(f, 64); }

// The core's definition of the rule says what the documented rule says.
void check_rule(std::string_view v) {
  FUZZ_CHECK(!orpheus::invalid_key_reason(v) == valid_token(v, orpheus::max_key_bytes),
             "key rule for " + shown(v));
  FUZZ_CHECK(!orpheus::invalid_scope_reason(v) == valid_token(v, orpheus::max_scope_bytes),
             "scope rule for " + shown(v));
}

// The key as an RFC 8941 sf-string.
std::string sf_string(std::string_view key) {
  std::string out = "\"";
  for (const char c : key) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + '"';
}

// What a header value means, restated from the IETF draft: optional white
// space around a bare token, or an sf-string whose only escapes are \" and
// \\. nullopt: broken quoting, or a bare comma (a list, RFC 9110 5.3).
std::optional<std::string> meaning(std::string_view v) {
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
  if (v.empty() || v.front() != '"') {
    if (v.find(',') != std::string_view::npos) return std::nullopt;  // a list of values
    return std::string(v);
  }
  if (v.size() < 2 || v.back() != '"') return std::nullopt;
  std::string out;
  for (std::size_t i = 1; i + 1 < v.size(); ++i) {
    if (v[i] == '"') return std::nullopt;
    if (v[i] == '\\') {
      if (i + 2 >= v.size() || (v[i + 1] != '"' && v[i + 1] != '\\')) return std::nullopt;
      ++i;
    }
    out += v[i];
  }
  return out;
}

orpheus::beast::middleware& the_middleware() {
  static auto* store = new orpheus::store(std::make_unique<no_backend>());
  static auto* manager = new orpheus::manager(*store);
  static auto* pool = new orpheus::work_pool(1, 1);
  static auto* mw = [] {
    orpheus::beast::middleware_options o;
    o.scope = [](const orpheus::beast::http_request& r) -> std::optional<std::string> {
      const auto id = r["X-Client-Id"];
      if (id.empty()) return std::nullopt;
      return "client:" + std::string(id);
    };
    return new orpheus::beast::middleware(*manager, *pool, std::move(o));
  }();
  return *mw;
}

orpheus::beast::http_request post(std::string_view client, std::string_view key_header) {
  orpheus::beast::http_request r{http::verb::post, "/v1/payments", 11};
  if (!client.empty()) r.set("X-Client-Id", as<boost::beast::string_view>(client));
  r.set("Idempotency-Key", as<boost::beast::string_view>(key_header));
  r.set(http::field::content_type, "application/json");
  r.body() = R"({"amount":1250,"currency":"EUR","customer":"cus_1"})";
  return r;
}

// The key the middleware reads from `req`, or nullopt with a checked refusal.
std::optional<std::string> identified(const orpheus::beast::http_request& req) {
  const auto who = the_middleware().identify(req);
  if (const auto* res = std::get_if<orpheus::beast::http_response>(&who)) {
    FUZZ_CHECK(res->result_int() == 400 || res->result_int() == 401,
               std::to_string(res->result_int()));
    FUZZ_CHECK(res->find("Idempotency-Key") == res->end(), "an invalid key was echoed");
    const auto problem = nlohmann::json::parse(res->body(), nullptr, false);
    FUZZ_CHECK(problem.is_object() && problem.value("retryable", true) == false &&
                   problem.value("status", 0) == static_cast<int>(res->result_int()),
               res->body());
    return std::nullopt;
  }
  const auto& id = std::get<orpheus::request_id>(who);
  orpheus::validate(id);  // must not throw: identify() validated it
  FUZZ_CHECK(id.scope == "client:" + std::string(req["X-Client-Id"]), shown(id.scope));
  FUZZ_CHECK(id.fingerprint == orpheus::fingerprint_of(
                                   orpheus::beast::middleware::canonical_request(req, {}, 64)),
             id.fingerprint);
  return id.key;
}

void check_validate(const std::string& scope, const std::string& key, const std::string& fp) {
  const orpheus::request_id id{scope, key, fp};
  std::string_view expected;
  if (!valid_token(key, orpheus::max_key_bytes)) {
    expected = orpheus::codes::invalid_key;
  } else if (!valid_token(scope, orpheus::max_scope_bytes)) {
    expected = orpheus::codes::invalid_scope;
  } else if (!valid_fingerprint(fp)) {
    expected = orpheus::codes::invalid_fingerprint;
  }
  try {
    orpheus::validate(id);
    FUZZ_CHECK(expected.empty(),
               "accepted " + shown(key) + " / " + shown(scope) + " / " + shown(fp));
  } catch (const orpheus::bad_input_error& e) {
    FUZZ_CHECK(e.code() == expected, e.code() + " for " + shown(key) + " / " + shown(scope));
    FUZZ_CHECK(orpheus::http_status_of(e.info()) == 400 && !e.retryable(), e.what());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto parts = split(orpheus::fuzz::text_of(data, size), "\n", 3);
  // Beast drops the white space around a field value, as any HTTP parser does.
  std::string_view client_sent = parts.size() > 1 ? parts[0] : std::string_view("c1");
  while (!client_sent.empty() && (client_sent.front() == ' ' || client_sent.front() == '\t'))
    client_sent.remove_prefix(1);
  while (!client_sent.empty() && (client_sent.back() == ' ' || client_sent.back() == '\t'))
    client_sent.remove_suffix(1);
  const std::string client(client_sent);
  const std::string value(parts.size() > 1 ? parts[1] : parts[0]);
  const std::string fp(parts.size() > 2 ? parts[2] : orpheus::fingerprint_of(value));

  check_rule(value);
  check_validate("client:" + client, value, fp);
  check_validate(value, "key-1", fp);

  // The server's reading of the header.
  const auto req = post(client, value);
  const auto key = identified(req);
  const auto meant = meaning(value);
  const bool acceptable = !client.empty() && meant && valid_token(*meant, orpheus::max_key_bytes) &&
                          valid_token("client:" + client, orpheus::max_scope_bytes);
  FUZZ_CHECK(key.has_value() == acceptable,
             "header " + shown(value) + " accepted: " + std::to_string(key.has_value()));
  if (key) {
    FUZZ_CHECK(*key == *meant, shown(value) + " read as " + shown(*key));
    FUZZ_CHECK(identified(post(client, sf_string(*key))) == key, "quoted form of " + shown(*key));
    if (key->front() != '"' && key->find(',') == std::string::npos) {
      FUZZ_CHECK(identified(post(client, *key)) == key, "bare form of " + shown(*key));
    }
  }

  // The client's key, as the server reads it.
  std::optional<orpheus::client::prepared_request> sent;
  try {
    sent.emplace(http::verb::post, "/v1/payments", R"({"amount":1250})",
                 std::vector<std::pair<std::string, std::string>>{
                     {"Content-Type", "application/json"}, {"X-Client-Id", "c1"}},
                 value);
  } catch (const std::invalid_argument& e) {
    // Refused before anything is sent: only what the server refuses too.
    const auto why = orpheus::invalid_key_reason(value);
    FUZZ_CHECK(why && *why == e.what(),
               "the client refuses the key " + shown(value) + ": " + e.what());
    return 0;
  }
  FUZZ_CHECK(
      sent->message("Idempotency-Key")["Idempotency-Key"] == orpheus::key_header_value(value),
      "the client wrote " + shown(value) + " its own way");
  const auto on_server = identified(sent->message("Idempotency-Key"));
  FUZZ_CHECK(on_server == sent->key(), "client key " + shown(sent->key()) +
                                           " reached the server as " +
                                           (on_server ? shown(*on_server) : std::string("a 400")));
  return 0;
}
