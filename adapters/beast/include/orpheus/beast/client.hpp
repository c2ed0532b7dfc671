// An HTTP/1.1 client with kept-alive connections, for calling a downstream
// service from the RPC phase (the payments gateway), for the retrying client
// helper (orpheus::client), and for tests. It is not a retrying client: one
// call is one request, sent once (see "Re-sending" below for the only
// exception), under one deadline.
//
//   orpheus::beast::http_client bank;   // one per process or per downstream
//   http_request req{http::verb::post, "/charges", 11};
//   req.set("Idempotency-Key", key);
//   try {
//     auto res = bank.send(orpheus::beast::parse_http_url("http://127.0.0.1:9000"),
//                          std::move(req), std::chrono::seconds(2));
//   } catch (const orpheus::beast::transport_error& e) {
//     switch (e.error_kind()) { ... }   // connect: not sent; timeout, closed: in doubt
//   }
//
// Connections. The client owns one io_context and one io thread. It keeps a
// pool of open connections per endpoint (host:port): at most
// `max_connections_per_endpoint` open at once, whether busy or idle; a call
// beyond that waits for one (FIFO), within its deadline. A connection goes
// back to the pool only after a complete response that allows it (HTTP/1.1
// without `Connection: close`, a framed body, nothing unread behind it); a
// timeout, an error, `Connection: close`, HTTP/1.0 or a response read to EOF
// closes it. An idle connection is never used after `idle_timeout`, and is
// closed within an eighth of it after that.
//
// send() on an idle pooled connection writes and reads on the calling
// thread (poll() against the deadline), without the io thread: on a busy
// core, handing each call to the io thread and back cost two context
// switches. Opening a connection, waiting for one, async_send() and a
// request sent again (below) go through the io thread. The rules are the
// same on both paths. An idle connection is not watched by the io thread
// either: its socket leaves Asio when it goes back to the pool and returns
// only when the io thread uses it, so traffic on the callers' threads never
// wakes the io thread.
//
// One deadline per call covers waiting for a connection, the host name
// lookup (skipped for numeric addresses; names are cached for
// `lookup_cache_ttl`), connect, write and read.
//
// Re-sending. A request is sent a second time, on a new connection, only
// when the server's application cannot have received all of it from the
// first connection:
//   1. an idle connection taken from the pool is checked before anything is
//      written to it; one the server has closed (EOF, reset, or unexpected
//      bytes waiting) is closed and replaced, and nothing was sent on it;
//   2. a write that fails on a reused connection before the whole request was
//      handed to the kernel: the server never had a complete request, so it
//      cannot have acted on it. (On a new connection this is `closed`.)
// Once the whole request was written, an EOF or a reset before any byte of
// the response is NOT re-sent by default (delivery::at_most_once): the server
// may have read the request, acted on it and died before answering, so the
// outcome is in doubt and the caller gets `closed`; its own retry with the
// same idempotency key finds out what happened. With delivery::idempotent
// (GET of a status, or any request the server deduplicates and the caller
// accepts getting executed twice) such a request lost on a *reused*
// connection - the classic race with a server closing an idle connection -
// is re-sent once on a new connection. Nothing is ever re-sent after a byte
// of the response arrived, after a timeout, or on a new connection.
//
// Errors: send() throws transport_error, whose error_kind() classifies it:
//   connect  nothing of the request was sent (no connection could be opened,
//            none of the endpoint's came free before the deadline, the
//            deadline passed while looking up or connecting, or the client
//            was shutting down): safe to retry as is;
//   timeout  the deadline passed while writing or reading: in doubt once
//            anything may have been written - retry only with the same
//            idempotency key;
//   closed   the connection broke before a complete answer: in doubt - retry
//            only with the same idempotency key.
// Any HTTP status is an answer, not an error. std::logic_error: send() from
// the client's own io thread (it would wait for itself).
//
// Thread safety: send() and async_send() may be called from any threads at
// once. Lifetimes: the client must outlive every send() and every
// async_send() it started; ~http_client() ends the calls still running (their
// callbacks get `connect` or `closed`), closes every connection and joins its
// thread. Destroyed by an async_send() callback (on the io thread), it does
// not wait: the io thread ends the other calls (their callbacks run after the
// destructor returned, and must not touch the client or what owned it), waits
// for a send() still running on another thread, then ends. It waits for a host name lookup still
// running in Asio's resolver thread (getaddrinfo cannot be interrupted); numeric addresses never
// look up.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "orpheus/beast/server.hpp"
#include "orpheus/error.hpp"
#include "orpheus/transport.hpp"

namespace orpheus::beast {

struct http_endpoint {
  std::string host;
  unsigned short port = 80;
};

/// Parses "http://host:port" (or "http://host:port/"). Throws
/// std::invalid_argument otherwise: a path, a user, a query or a fragment
/// would be dropped, and the calls go to paths of their own.
http_endpoint parse_http_url(std::string_view url);

/// The error a downstream call that got no answer stands for, whatever
/// reports it: connect is `unavailable` (code downstream_unreachable, 503:
/// nothing was sent), timeout and closed are `in_doubt` (downstream_timeout
/// 504, downstream_closed 502). `detail` is internal.
[[nodiscard]] error_info error_of(transport_failure f, std::string detail);

/// A call that ended without a complete answer. error_kind() says whether the
/// request may have reached the server (see the file comment), in the core's
/// words (orpheus/transport.hpp), which the client helper and the payment
/// wrapper share: connect (nothing was sent: no connection, or the client
/// shut down), timeout and closed (both in doubt).
///
/// It is an orpheus::error (error_of()): one that escapes an RPC phase is
/// classified by what it is -- a retry, in doubt unless nothing was sent --
/// not as an unclassified exception recorded as a final 500.
class transport_error : public error {
 public:
  using kind = orpheus::transport_failure;
  transport_error(kind k, const std::string& what) : error(error_of(k, what)), kind_(k) {}
  [[nodiscard]] kind error_kind() const noexcept { return kind_; }

 private:
  kind kind_;
};

/// Whether the client may deliver a request twice (see "Re-sending").
enum class delivery {
  /// Never re-sent once written completely: a lost answer is `closed`.
  at_most_once,
  /// Re-sent once on a new connection when written completely on a reused
  /// connection that then closed before any byte of the answer.
  idempotent,
};

struct http_client_options {
  /// Connections open at once to one host:port, busy or idle; more calls wait.
  std::size_t max_connections_per_endpoint = 16;
  /// An idle pooled connection is closed after this. Keep it below the
  /// servers' own idle timeouts (Node 5 s, orpheus::beast::server 60 s), so
  /// that the client, not the server, closes idle connections.
  std::chrono::milliseconds idle_timeout{std::chrono::seconds(4)};
  /// A host name's addresses are reused this long for new connections (0:
  /// look up for every new connection).
  std::chrono::milliseconds lookup_cache_ttl{std::chrono::seconds(5)};
};

/// What an asynchronous call ends with: exactly one of the two is set.
struct http_result {
  std::optional<http_response> response;
  std::optional<transport_error> error;
};

/// A kept-alive HTTP/1.1 client; see the file comment.
class http_client {
 public:
  /// Starts the io thread. Throws config_error when
  /// max_connections_per_endpoint is 0.
  explicit http_client(http_client_options options = {});
  http_client(const http_client&) = delete;
  http_client& operator=(const http_client&) = delete;
  /// Ends the calls still running, closes every connection, joins the thread.
  ~http_client();

  /// Sends `req` to `to` and reads the answer, all within `timeout`. Sets
  /// Host and Content-Length. Blocks the calling thread; throws
  /// transport_error.
  http_response send(const http_endpoint& to, http_request req, std::chrono::milliseconds timeout,
                     delivery d = delivery::at_most_once);

  /// The same, without blocking: `done` is called once, on the client's io
  /// thread (it must not block, nor throw: an exception from it ends the
  /// process), with the answer or the error.
  void async_send(const http_endpoint& to, http_request req, std::chrono::milliseconds timeout,
                  std::function<void(http_result)> done, delivery d = delivery::at_most_once);

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

/// Sends `req` through a process-wide http_client (created on first use,
/// destroyed at exit). A convenience for tests and tools; a service should
/// own its http_client and size its pool.
http_response send(const http_endpoint& to, http_request req, std::chrono::milliseconds timeout);

}  // namespace orpheus::beast
