#include "orpheus/request.hpp"

#include <openssl/rand.h>

#include <array>
#include <optional>
#include <span>
#include <vector>

#include "orpheus/detail/hex.hpp"
#include "sha256.hpp"

namespace orpheus {
namespace {

// Keys and scopes: 1..max bytes of printable ASCII, no space at either end
// (it would not survive an HTTP header round trip). `what` names the part.
std::optional<std::string> token_problem(std::string_view what, std::string_view v,
                                         std::size_t max) {
  if (v.empty()) return std::string(what) + " is empty";
  if (v.size() > max) {
    return std::string(what) + " is longer than " + std::to_string(max) + " bytes";
  }
  for (const char c : v) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u > 0x7E) return std::string(what) + " has a byte outside printable ASCII";
  }
  if (v.front() == ' ' || v.back() == ' ') {
    return std::string(what) + " starts or ends with a space";
  }
  return std::nullopt;
}

std::string_view without_white_space(std::string_view v) {
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
  return v;
}

}  // namespace

std::optional<std::string> invalid_key_reason(std::string_view key) {
  return token_problem("idempotency key", key, max_key_bytes);
}

std::optional<std::string> invalid_scope_reason(std::string_view scope) {
  return token_problem("scope", scope, max_scope_bytes);
}

std::string key_header_value(std::string_view key) {
  // Bare, unless the bare form would read as something else: a leading
  // quote (an sf-string) or a comma (a list of values, below).
  if (key.empty() || (key.front() != '"' && key.find(',') == std::string_view::npos)) {
    return std::string(key);
  }
  std::string quoted = "\"";
  for (const char c : key) {
    if (c == '"' || c == '\\') quoted += '\\';
    quoted += c;
  }
  return quoted + '"';
}

std::optional<std::string> key_of_header_value(std::string_view value) {
  std::string_view v = without_white_space(value);
  if (v.empty() || v.front() != '"') {
    // A comma outside quotes separates the values of a list: a header sent
    // twice, which a proxy may join as "k1, k1" (RFC 9110, section 5.3).
    // Read as one key, a retry would run again under a new key (found in
    // review).
    if (v.find(',') != std::string_view::npos) return std::nullopt;
    return std::string(v);
  }
  if (v.size() < 2 || v.back() != '"') return std::nullopt;
  v = v.substr(1, v.size() - 2);
  std::string out;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (v[i] == '\\') {
      if (i + 1 >= v.size() || (v[i + 1] != '"' && v[i + 1] != '\\')) return std::nullopt;
      out += v[++i];
    } else if (v[i] == '"') {
      return std::nullopt;
    } else {
      out += v[i];
    }
  }
  return out;
}

void validate(const request_id& id) {
  if (auto why = invalid_key_reason(id.key)) throw bad_input_error(codes::invalid_key, *why);
  if (auto why = invalid_scope_reason(id.scope)) throw bad_input_error(codes::invalid_scope, *why);
  if (!detail::is_lowercase_hex(id.fingerprint, 64)) {
    throw bad_input_error(codes::invalid_fingerprint,
                          "fingerprint must be 64 lowercase hex characters "
                          "(SHA-256, see orpheus::fingerprint_of)");
  }
}

std::string random_token(std::size_t bytes) {
  std::vector<unsigned char> b(bytes);
  if (RAND_bytes(b.data(), static_cast<int>(b.size())) != 1) {
    throw retryable_error(codes::no_randomness, "no randomness for a token; retry later");
  }
  return detail::lowercase_hex(b);
}

std::string fingerprint_of(std::string_view canonical) {
  return detail::lowercase_hex(detail::sha256(canonical));
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
  return "ork_" + detail::lowercase_hex(std::span(d).first(20));
}

}  // namespace orpheus
