// A small asynchronous HTTP/1.1 server on Boost.Beast, for services that
// wrap their handlers with orpheus::beast::middleware (and for the examples
// and tests). Asio stays inside server.cpp: including this header costs only
// Beast's message types.
//
//   orpheus::beast::server s({.port = 8080}, [&](http_request&& req, responder respond) {
//     respond(make_text(200, "ok"));            // may be called later, on any thread
//   });
//   s.start();
//
// Limits are enforced before the handler runs: a header block over
// `header_limit` is answered 431, a body over `body_limit` 413, a malformed
// request 400; then the connection is closed. Idle and slow connections are
// closed after `read_timeout`. None of these affects other connections.
//
// Thread safety: the handler is called on an io thread and must not block;
// `respond` may be called from any thread; only its first call is written. A
// handler that throws gets a 500 (unless it already answered) and the
// connection is closed; the server carries on.
#pragma once

#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

namespace orpheus::beast {

using http_request = boost::beast::http::request<boost::beast::http::string_body>;
using http_response = boost::beast::http::response<boost::beast::http::string_body>;
using responder = std::function<void(http_response)>;
using handler = std::function<void(http_request&&, responder)>;

struct server_options {
  std::string address = "127.0.0.1";
  unsigned short port = 0;  ///< 0: any free port (see server::port())
  std::size_t io_threads = 1;
  std::size_t header_limit = std::size_t{8} * 1024;
  std::size_t body_limit = std::size_t{64} * 1024;
  std::chrono::seconds read_timeout{30};
};

/// Passed to a responder, closes the connection without any answer: the
/// fault of a server that did the work and then lost the reply (used by the
/// bank simulator's fault injection).
http_response drop_connection();

/// A response with a body and a Content-Type.
http_response make_response(unsigned status, std::string body,
                            const std::string& content_type = "text/plain");

class server {
 public:
  /// Binds and listens at once; throws std::runtime_error when it cannot.
  server(server_options options, handler h);
  server(const server&) = delete;
  server& operator=(const server&) = delete;
  ~server();  ///< stop()

  [[nodiscard]] unsigned short port() const;
  /// Starts the io threads and returns.
  void start();
  /// Stops accepting, closes connections, joins the io threads. Idempotent.
  void stop();

  struct impl;  ///< implementation detail (server.cpp)

 private:
  std::shared_ptr<impl> impl_;
};

}  // namespace orpheus::beast
