// A small asynchronous HTTP/1.1 server on Boost.Beast, for services that
// wrap their handlers with orpheus::beast::middleware (and for the examples
// and tests). Asio stays inside server.cpp: including this header costs only
// Beast's message types.
//
//   orpheus::beast::server s({.port = 8080}, [](http_request&& req, responder respond) {
//     if (req.target() == "/healthz") return respond(make_response(200, "ok\n"));
//     respond(make_response(404, "not found\n"));  // or later, from any thread
//   });
//   s.start();
//
// A complete program that wraps its handler with the middleware:
// examples/3_wrap_beast_handler/main.cpp; a complete service:
// examples/payments_server (routes.cpp, main.cpp).
//
// Limits are enforced before the handler runs: a header block over
// `header_limit` is answered 431, a body over `body_limit` 413, a malformed
// request 400 (so is a chunk's size line or a trailer block longer than
// `header_limit` + 64 KiB: a connection holds no more bytes than that unparsed); then the
// connection is closed, once the client has read the answer: what it still sends is read and
// dropped until it closes, for at most `read_timeout` (and 2 s without a byte), so that it reads
// the answer instead of a reset. A keep-alive connection with no new request for `idle_timeout` is
// closed, and so is one whose request header does not arrive within `header_timeout` (a new
// connection's clock starts at accept) or whose body does not arrive within `read_timeout`. None of
// these affects other connections.
//
// Accepting never stops for good (issue 7: one EMFILE used to end the accept
// loop): with no file descriptor left the server waits `accept_backoff` and
// tries again. `max_connections` is kept under the descriptor limit (see
// server_options), so that open connections meet it first. With
// `max_connections` open it accepts no more until one
// closes (the kernel's listen backlog holds the rest); while a newcomer waits
// there, the connection idle longest (a kept-alive one waiting for its next
// request, or a new one that has sent nothing yet) is closed to make room (an
// idle connection may be closed at any time, RFC 9112 section 9.6; one with a
// request in flight never is), looking again every `accept_backoff` while
// none is idle. The io threads run from start() to stop(), whether or not
// any I/O is pending.
//
// Thread safety: the handler is called on an io thread and must not block;
// `respond` may be called from any thread; only its first call is written. A
// handler that throws gets a 500 (unless it already answered) and the
// connection is closed; the server carries on. The server frames every
// answer (Content-Length): the body of a 204 or 304 answer is dropped, as
// HTTP has no room for it; a 1xx, which is never a final answer, becomes a
// 500 with the connection closed; and an answer to HEAD goes out as its
// headers alone. Both 500s are problem+json, code unclassified_error,
// "in_doubt": true (the handler may have acted), and "retryable": true with
// Retry-After for a method HTTP lets a client send again
// (idempotent_by_http()), false for any other: this server does not know
// whether a key was sent.
#pragma once

#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "orpheus/error.hpp"

namespace orpheus::beast {

using http_request = boost::beast::http::request<boost::beast::http::string_body>;
using http_response = boost::beast::http::response<boost::beast::http::string_body>;
using responder = std::function<void(http_response)>;
using handler = std::function<void(http_request&&, responder)>;

/// The largest server_options::header_limit: Beast 1.74 holds no header
/// field longer than 65,535 bytes.
inline constexpr std::size_t max_header_limit = 65535;

struct server_options {
  std::string address = "127.0.0.1";
  unsigned short port = 0;  ///< 0: any free port (see server::port())
  std::size_t io_threads = 1;
  /// 1 to max_header_limit (config_error otherwise).
  std::size_t header_limit = std::size_t{8} * 1024;
  std::size_t body_limit = std::size_t{64} * 1024;
  /// Connections served at once; 0: no cap. Never more than the process's
  /// file descriptor limit (RLIMIT_NOFILE, `ulimit -n`) minus
  /// descriptor_reserve: a higher figure is lowered to that when the server
  /// is made, and a warning logged (see max_connections() below).
  std::size_t max_connections = 1024;
  /// Descriptors kept for everything else the process opens: its database
  /// connections and files, downstream calls, logs. A descriptor limit not
  /// above it is a config_error (unless max_connections is 0).
  std::size_t descriptor_reserve = 128;
  /// A keep-alive connection waiting this long for its next request is closed.
  std::chrono::milliseconds idle_timeout{std::chrono::seconds(60)};
  /// A request's header block must arrive within this, from its first byte
  /// (from accept on a new connection): slow-header clients are cut off.
  std::chrono::milliseconds header_timeout{std::chrono::seconds(10)};
  /// A request's body, and the writing of an answer, must finish within this;
  /// also the longest the rest of a refused request (400, 413, 431) is read
  /// and dropped before its connection is closed.
  std::chrono::milliseconds read_timeout{std::chrono::seconds(30)};
  /// After accept() fails for want of file descriptors (EMFILE, ENFILE),
  /// wait this long before accepting again, instead of spinning.
  std::chrono::milliseconds accept_backoff{100};
};

/// Passed to a responder, closes the connection without any answer: the
/// fault of a server that did the work and then lost the reply (used by the
/// bank simulator's fault injection).
http_response drop_connection();

/// The statuses that mean "not now, try again": 429 and every 5xx except 501.
/// With 409 (another attempt is in progress), these are what orpheus::client
/// retries and what the middleware's one-lambda handle() does not record --
/// unless the answer says_final().
[[nodiscard]] constexpr bool retry_later_status(unsigned status) noexcept {
  return status == 429 || (status >= 500 && status != 501);
}

/// RFC 9110, section 9.2.2: GET, HEAD, OPTIONS, TRACE, PUT and DELETE, which
/// a client may send again on its own.
[[nodiscard]] bool idempotent_by_http(boost::beast::http::verb v);

/// True when `res` is application/problem+json whose "retryable" member is
/// the JSON boolean false: the server recorded it as final, whatever its
/// status. "yes", 1, null or a body that is not JSON do not count.
[[nodiscard]] bool says_final(const http_response& res);

/// True when `res` is application/problem+json whose "in_doubt" member is
/// the JSON boolean true: the request reached a server that may have acted
/// on it, whatever the status (a 429, say, which otherwise means not).
[[nodiscard]] bool says_in_doubt(const http_response& res);

/// A response with a body and a Content-Type.
http_response make_response(unsigned status, std::string body,
                            const std::string& content_type = "text/plain");

class server {
 public:
  /// Binds and listens at once; throws std::runtime_error when it cannot,
  /// and config_error for a header_limit out of range.
  server(server_options options, handler h);
  server(const server&) = delete;
  server& operator=(const server&) = delete;
  ~server();  ///< stop()

  [[nodiscard]] unsigned short port() const;
  /// The cap in force: server_options::max_connections, lowered to the file
  /// descriptor limit minus descriptor_reserve. Connections held open and
  /// silent thus meet the cap, where the idlest makes room for a newcomer,
  /// before they can use up the descriptors, where nothing can.
  [[nodiscard]] std::size_t max_connections() const;
  /// Starts the io threads and returns.
  void start();
  /// Closes the listening socket; open connections are still served (their
  /// answers in flight are written). The first step of a graceful shutdown:
  /// stop_accepting(), drain the work pool, then stop(). Idempotent.
  void stop_accepting();
  /// Stops accepting, closes connections, joins the io threads; answers
  /// given after this are dropped. Idempotent.
  void stop();
  /// Connections open now (for tests and metrics).
  [[nodiscard]] std::size_t connections() const;

 private:
  struct impl;           // server.cpp
  friend class session;  // server.cpp: a connection, holds the impl alive
  std::shared_ptr<impl> impl_;
};

}  // namespace orpheus::beast
