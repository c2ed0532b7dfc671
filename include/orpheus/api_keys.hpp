// Callers who authenticate with an API key sent as a bearer token
// (`Authorization: Bearer <key>`, RFC 6750), read the same way by every
// front end (an HTTP header, gRPC metadata), and the table that maps each key
// to the client it stands for. The client is what a front end scopes
// idempotency keys by, so one client never sees, replays or blocks
// another's keys.
//
//   const auto keys = orpheus::api_keys::load("/etc/payments/api-keys");
//   std::optional<std::string> client = keys.client_of(authorization_value);
//   if (!client) ...  // 401, before any database work
//
// The Beast middleware's scope from it: orpheus::beast::bearer_scope().
//
// The table keeps SHA-256 digests of the keys, not the keys: a memory dump
// or an error message never shows one, and finding a presented key is a hash
// of it and a lookup of the digest.
//
// Thread safety: an api_keys is immutable after load() or parse(); any
// number of threads may call client_of() at once.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

namespace orpheus {

/// The token of an `Authorization` value of the Bearer scheme (RFC 6750
/// section 2.1): the scheme name in any case, one or more spaces, then a
/// token68 (letters, digits, `-._~+/`, then `=` padding only), nothing after
/// it but spaces. nullopt for another scheme or a malformed token.
[[nodiscard]] std::optional<std::string_view> bearer_token(std::string_view authorization) noexcept;

/// The API keys a service accepts, each standing for one client.
class api_keys {
 public:
  /// A shorter key is refused when the table is read: it could be guessed.
  static constexpr std::size_t min_key_bytes = 16;
  static constexpr std::size_t max_key_bytes = 512;
  /// A client id is 1 to this many bytes of letters, digits and `-._:@`.
  static constexpr std::size_t max_client_bytes = 128;

  /// The table from the text of a key file: one `<key> <client>` per line,
  /// separated by spaces or tabs; blank lines and lines starting with `#`
  /// are skipped; a line may end in CR LF. A key is a token68 of
  /// min_key_bytes to max_key_bytes; one client may have several keys (to
  /// rotate them); a key may appear once, its '=' padding aside (`k` and
  /// `k==` are one key). Anything else throws config_error naming the line,
  /// never the key; so does a table without keys.
  [[nodiscard]] static api_keys parse(std::string_view text);

  /// parse() of the file at `path`; config_error naming the path when it
  /// cannot be read.
  [[nodiscard]] static api_keys load(const std::string& path);

  /// The client whose key the `Authorization` value carries (bearer_token()),
  /// or nullopt: no value, another scheme, a malformed or an unknown key.
  [[nodiscard]] std::optional<std::string> client_of(std::string_view authorization) const;

  /// How many keys the table holds.
  [[nodiscard]] std::size_t size() const noexcept { return client_by_digest_.size(); }

 private:
  api_keys() = default;
  /// SHA-256 of a key (32 raw bytes) -> its client.
  std::unordered_map<std::string, std::string> client_by_digest_;
};

}  // namespace orpheus
