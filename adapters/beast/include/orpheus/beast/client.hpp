// A minimal synchronous HTTP/1.1 client with a deadline, for calling a
// downstream service from the RPC phase (and for tests). It is not the
// retrying client helper: it makes exactly one attempt.
//
//   auto res = orpheus::beast::send(orpheus::beast::parse_http_url("http://127.0.0.1:9000"),
//                                   req, std::chrono::seconds(2));
//
// Errors: throws transport_error, whose kind() tells what happened. Every kind
// means "the outcome is unknown" for a request that may have been sent:
// treat it as retryable, never as "nothing happened".
#pragma once

#include <chrono>
#include <stdexcept>
#include <string>
#include <string_view>

#include "orpheus/beast/server.hpp"

namespace orpheus::beast {

struct http_endpoint {
  std::string host;
  unsigned short port = 80;
};

/// Parses "http://host:port" (an optional trailing path is ignored). Throws
/// std::invalid_argument otherwise.
http_endpoint parse_http_url(std::string_view url);

class transport_error : public std::runtime_error {
 public:
  enum class kind {
    connect,  ///< could not connect: the request was not sent
    timeout,  ///< no complete answer before the deadline
    closed,   ///< the connection broke or closed before a complete answer
  };
  transport_error(kind k, const std::string& what) : std::runtime_error(what), kind_(k) {}
  [[nodiscard]] kind error_kind() const noexcept { return kind_; }

 private:
  kind kind_;
};

/// Sends `req` on a new connection and reads the response, all before
/// `timeout` has passed. Sets Host and Content-Length.
http_response send(const http_endpoint& to, http_request req, std::chrono::milliseconds timeout);

}  // namespace orpheus::beast
