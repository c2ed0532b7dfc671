// From a request as a front end sees it to its request_id: the key, the
// caller's scope and the fingerprint, with no HTTP library in sight.
//
// The Beast middleware (orpheus/beast/middleware.hpp) is one front end built
// on this; another (gRPC metadata, a message queue) fills a request_text
// from its own types and gets the same keys, the same fingerprints and the
// same refusals:
//
//   orpheus::request_text text{.method = "POST", .target = "/v1/payments",
//                              .content_type = "application/json", .body = body};
//   auto who = orpheus::identify(text, key_value, [&] { return caller(); }, {});
//   if (auto* refused = std::get_if<orpheus::error_info>(&who)) ... // 400 / 401
//   const orpheus::identity& id = std::get<orpheus::identity>(who);
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "orpheus/error.hpp"
#include "orpheus/request.hpp"

namespace orpheus {

/// What the fingerprint is taken of, in the front end's own strings.
struct request_text {
  std::string_view method;        ///< "POST"
  std::string_view target;        ///< "/v1/payments?x=1", as sent
  std::string_view content_type;  ///< the Content-Type value, or empty
  std::string_view body;
  /// The headers that are part of the fingerprint: (name, value) in the
  /// configured order; a header the request lacks has an empty value.
  std::vector<std::pair<std::string, std::string>> headers;
};

/// The text the fingerprint is taken of: method, target, the headers (names
/// lower-cased) and the body. A JSON body (content type application/json) is
/// parsed and printed again, so key order and spacing do not matter, unless it
/// is nested deeper than `max_json_depth`, does not parse, names a member
/// twice in one object (the parser keeps the last; a handler's may keep the
/// first), or holds a number that the parser, holding it as a double,
/// does not print back as the decimal value sent (an integer beyond 64 bits,
/// 1.000000000000000001, 1e-400; rarely, a number whose double it prints
/// with more digits, 4.995e-24): then it is taken as it is. A form body
/// (application/x-www-form-urlencoded) has its fields ordered by decoded name; a repeated field
/// keeps the order it was sent in. Any other body is taken byte for byte.
[[nodiscard]] std::string canonical_request(const request_text& r, std::size_t max_json_depth = 64);

/// Whether `content_type` names JSON (application/json, any parameters).
[[nodiscard]] bool is_json_content_type(std::string_view content_type);

/// Whether a JSON text nests arrays and objects deeper than `limit`: one
/// pass, no recursion, brackets inside strings ignored. For refusing a body
/// before anything recursive (a parser, a printer) touches it.
[[nodiscard]] bool json_nested_deeper_than(std::string_view text, std::size_t limit);

struct identify_options {
  /// Named in the messages of the 400s.
  std::string_view key_header = "Idempotency-Key";
  /// A request without a key is refused (400 missing_key); otherwise it runs
  /// under a random key of its own.
  bool key_required = true;
  /// A JSON body nested deeper is refused (400 invalid_request).
  std::size_t max_json_depth = 64;
};

struct identity {
  request_id id;
  /// False when the key was made up (no key sent, none required): nobody
  /// can send it again, so its record need not be kept (retention 0).
  bool key_sent = false;
};

/// The request's identity, or the error to answer with instead, checked in
/// this order: the key header's value (nullopt: no such header) must read as
/// a key (key_of_header_value()) that keeps the key rule
/// (invalid_key_reason()), else 400 invalid_key; a missing key where one is
/// required is 400 missing_key; a JSON body nested deeper than allowed is 400
/// invalid_request; `scope` is asked last (nullopt: 401 unauthenticated),
/// then its rule (invalid_scope_reason(), 400 invalid_scope). The identity
/// passes validate(). Touches no database.
[[nodiscard]] std::variant<identity, error_info> identify(
    const request_text& r, std::optional<std::string_view> key_header_value,
    const std::function<std::optional<std::string>()>& scope, const identify_options& options);

}  // namespace orpheus
