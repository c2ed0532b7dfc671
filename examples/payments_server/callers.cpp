#include "callers.hpp"

#include <utility>

#include "orpheus/error.hpp"

namespace examples::payments_server {

namespace http = boost::beast::http;

namespace {
constexpr std::string_view scope_prefix = "client:";

std::string_view sv(boost::beast::string_view v) { return {v.data(), v.size()}; }
}  // namespace

callers::callers(std::optional<orpheus::api_keys> keys, bool trust_client_id_header)
    : keys_(std::move(keys)), trust_client_id_header_(trust_client_id_header) {
  if (!keys_ && !trust_client_id_header_) {
    throw orpheus::config_error(
        "no way to authenticate callers: give --api-keys FILE (or, for local testing only, "
        "--trust-client-id-header)");
  }
  // Found in review: with both, a request without Authorization could name
  // a key holder in X-Client-Id and read, replay, block or make its payments.
  if (keys_ && trust_client_id_header_) {
    throw orpheus::config_error(
        "--trust-client-id-header cannot be combined with --api-keys: a caller without a key "
        "could name a key holder in X-Client-Id");
  }
}

std::optional<std::string> callers::client_of(const orpheus::beast::http_request& req) const {
  // One credential at most (found in review: req[] is the first field alone,
  // so a second Authorization, or an X-Client-Id a proxy appended after the
  // client's own, was ignored).
  if (keys_) {
    if (req.count(http::field::authorization) != 1) return std::nullopt;
    return keys_->client_of(sv(req[http::field::authorization]));
  }
  // --trust-client-id-header (and no keys): a request that sends a bearer
  // token is refused, not believed for its header.
  if (req.find(http::field::authorization) != req.end()) return std::nullopt;
  if (req.count("X-Client-Id") != 1) return std::nullopt;
  const auto id = sv(req["X-Client-Id"]);
  if (id.empty()) return std::nullopt;
  return std::string(id);
}

std::optional<std::string> callers::scope_of(const orpheus::beast::http_request& req) const {
  auto client = client_of(req);
  if (!client) return std::nullopt;
  return std::string(scope_prefix) + *client;
}

std::string_view callers::client_of_scope(std::string_view scope) {
  return scope.substr(scope.rfind(scope_prefix, 0) == 0 ? scope_prefix.size() : 0);
}

}  // namespace examples::payments_server
