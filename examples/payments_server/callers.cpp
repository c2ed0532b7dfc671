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
}

std::optional<std::string> callers::client_of(const orpheus::beast::http_request& req) const {
  const auto authorization = req.find(http::field::authorization);
  if (authorization != req.end() || !trust_client_id_header_) {
    if (!keys_ || authorization == req.end()) return std::nullopt;
    return keys_->client_of(sv(authorization->value()));
  }
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
