#include "orpheus/request.hpp"

#include <openssl/rand.h>

#include <array>
#include <nlohmann/json.hpp>
#include <vector>

#include "sha256.hpp"

namespace orpheus {
namespace {

std::string hex(const unsigned char* data, std::size_t n) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out(n * 2, '0');
  for (std::size_t i = 0; i < n; ++i) {
    out[2 * i] = digits[data[i] >> 4];
    out[2 * i + 1] = digits[data[i] & 0xF];
  }
  return out;
}

// Keys and scopes: 1..255 bytes of printable ASCII, no space at either end
// (it would not survive an HTTP header round trip).
void check_token(std::string_view what, std::string_view code, std::string_view v,
                 std::size_t max) {
  if (v.empty()) {
    throw bad_input_error(code, std::string(what) + " is empty");
  }
  if (v.size() > max) {
    throw bad_input_error(code,
                          std::string(what) + " is longer than " + std::to_string(max) + " bytes");
  }
  for (const char c : v) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u > 0x7E) {
      throw bad_input_error(code, std::string(what) + " has a byte outside printable ASCII");
    }
  }
  if (v.front() == ' ' || v.back() == ' ') {
    throw bad_input_error(code, std::string(what) + " starts or ends with a space");
  }
}

}  // namespace

void validate(const request_id& id) {
  check_token("idempotency key", codes::invalid_key, id.key, max_key_bytes);
  check_token("scope", codes::invalid_scope, id.scope, max_scope_bytes);
  const bool hex64 = id.fingerprint.size() == 64 &&
                     id.fingerprint.find_first_not_of("0123456789abcdef") == std::string::npos;
  if (!hex64) {
    throw bad_input_error(codes::invalid_fingerprint,
                          "fingerprint must be 64 lowercase hex characters "
                          "(SHA-256, see orpheus::fingerprint_of)");
  }
}

std::string random_token(std::size_t bytes) {
  std::vector<unsigned char> b(bytes);
  if (RAND_bytes(b.data(), static_cast<int>(b.size())) != 1) {
    throw retryable_error("no_randomness", "no randomness for a token; retry later");
  }
  return hex(b.data(), b.size());
}

std::string fingerprint_of(std::string_view canonical) {
  const auto d = detail::sha256(canonical);
  return hex(d.data(), d.size());
}

std::string attempt::downstream_key(std::string_view name) const {
  // Length-prefixed fields, so that ("a", "b:c") and ("a:b", "c") differ.
  std::string input = "orpheus-downstream-v1";
  for (std::string_view part : {std::string_view(id_->scope), std::string_view(id_->key), name}) {
    input += std::to_string(part.size());
    input += ':';
    input.append(part);
  }
  const auto d = detail::sha256(input);
  return "ork_" + hex(d.data(), 20);
}

response problem_response(const error_info& e) {
  nlohmann::json body = {
      {"type", "urn:orpheus:error:" + e.code},
      {"title", e.code},
      {"status", e.http_status},
      {"detail", e.message},
      {"code", e.code},
      {"retryable", e.retryable},
  };
  if (e.in_doubt) body["in_doubt"] = true;
  response r;
  r.status = e.http_status;
  r.headers.emplace_back("Content-Type", "application/problem+json");
  r.body = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return r;
}

}  // namespace orpheus
