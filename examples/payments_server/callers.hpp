// Who is calling: the client a request authenticates as. Its idempotency keys
// are scoped by it (client:<id>), and its payments are found by it.
//
//   --api-keys FILE             `Authorization: Bearer <key>`, the key looked
//                               up in FILE (one `<key> <client>` per line)
//   --trust-client-id-header    X-Client-Id names the client, unchecked: for
//                               local testing only; a request that sends
//                               Authorization is refused
//
// One of the two, never both: a caller without a key could then name a key
// holder in X-Client-Id.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "orpheus/api_keys.hpp"
#include "orpheus/beast/server.hpp"

namespace examples::payments_server {

class callers {
 public:
  /// Throws orpheus::config_error unless exactly one way is on.
  callers(std::optional<orpheus::api_keys> keys, bool trust_client_id_header);

  /// The client `req` authenticates as, or nullopt (401).
  [[nodiscard]] std::optional<std::string> client_of(const orpheus::beast::http_request& req) const;

  /// The idempotency scope of `req`'s client (middleware_options::scope).
  [[nodiscard]] std::optional<std::string> scope_of(const orpheus::beast::http_request& req) const;

  /// The client a scope made by scope_of() names.
  [[nodiscard]] static std::string_view client_of_scope(std::string_view scope);

 private:
  std::optional<orpheus::api_keys> keys_;
  bool trust_client_id_header_;
};

}  // namespace examples::payments_server
