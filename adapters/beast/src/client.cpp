#include <utility>  // before Asio: Boost 1.74's awaitable.hpp needs std::exchange

#include "orpheus/beast/client.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <future>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "orpheus/beast/detail/resolve.hpp"
#include "orpheus/error.hpp"

namespace orpheus::beast {

namespace net = boost::asio;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;
using error_code = boost::system::error_code;
using steady = std::chrono::steady_clock;

error_info error_of(transport_failure f, std::string detail) {
  switch (f) {
    case transport_failure::connect:
      return error_info::of(error_class::unavailable, codes::downstream_unreachable,
                            "a downstream service could not be reached; retry later")
          .with_internal(std::move(detail));
    case transport_failure::timeout:
      return error_info::of(error_class::in_doubt, codes::downstream_timeout,
                            "a downstream service did not answer in time; retry with the same key")
          .with_internal(std::move(detail));
    case transport_failure::closed:
      break;
  }
  return error_info::of(error_class::in_doubt, codes::downstream_closed,
                        "the connection to a downstream service broke; retry with the same key")
      .with_internal(std::move(detail));
}

http_endpoint parse_http_url(std::string_view url) {
  constexpr std::string_view scheme = "http://";
  if (url.substr(0, scheme.size()) != scheme) {
    throw std::invalid_argument("expected http://host:port, got " + std::string(url));
  }
  url.remove_prefix(scheme.size());
  // Only an endpoint: found in review, "http://h:9000/api/v2" charged at
  // /charges (its 404 an in-doubt gateway error), and "http://u:p@h" made
  // the host "u:p@h". A lone trailing '/' is taken.
  const auto slash = url.find('/');
  if (slash != std::string_view::npos && slash + 1 != url.size()) {
    throw std::invalid_argument("expected http://host:port with no path, got http://" +
                                std::string(url));
  }
  url = url.substr(0, slash);
  if (url.find_first_of("@?# ") != std::string_view::npos) {
    throw std::invalid_argument("expected http://host:port (no user, query or fragment), got " +
                                std::string("http://") + std::string(url));
  }
  const auto colon = url.rfind(':');
  http_endpoint ep;
  ep.host = std::string(url.substr(0, colon));
  if (colon != std::string_view::npos) {
    const auto p = url.substr(colon + 1);
    unsigned port = 0;
    const auto [ptr, ec] = std::from_chars(p.data(), p.data() + p.size(), port);
    if (ec != std::errc{} || ptr != p.data() + p.size() || port == 0 || port > 65535) {
      throw std::invalid_argument("bad port in " + std::string(url));
    }
    ep.port = static_cast<unsigned short>(port);
  }
  if (ep.host.empty()) throw std::invalid_argument("no host in URL");
  return ep;
}

namespace {

// An open connection to one endpoint: used by one call at a time, on the io
// thread or (send() on an idle one) on the caller's thread.
// A pooled connection's socket is out of Asio while it is idle or used by
// send() on a caller's thread (parked_fd), and in the stream while the io
// thread uses it. Asio's reactor watches every socket it holds, edge
// triggered, for input and (once it has waited to write, as a connect does)
// output: a socket in it woke the io thread for every answer that came in
// and every acknowledgement of a request that went out, on calls the io
// thread had no part in (issue 8: half a context switch per payment on the
// bank's client, measured with scripts/bench-http). Only the io thread moves
// a socket in or out (park(), unpark()).
struct connection {
  explicit connection(net::io_context& ioc) : stream(ioc) {}
  ~connection() {
    if (parked_fd >= 0) ::close(parked_fd);
  }
  connection(const connection&) = delete;
  connection& operator=(const connection&) = delete;

  boost::beast::tcp_stream stream;
  boost::beast::flat_buffer buffer;
  steady::time_point idle_since;  // when it went back to the pool
  bool on_caller_thread = false;  // under pool_m: a send() is using it on its own thread
  tcp protocol = tcp::v4();       // of the connected socket, for unpark()
  int parked_fd = -1;             // the socket while out of Asio; -1 while in the stream

  /// The socket, wherever it is (-1 once closed).
  [[nodiscard]] int fd() { return parked_fd >= 0 ? parked_fd : stream.socket().native_handle(); }
  /// On the io thread, with nothing pending on the stream: takes the socket
  /// out of Asio. False when it could not (the socket is then closed).
  bool park() noexcept {
    if (parked_fd >= 0) return true;
    error_code ec;
    const int fd = stream.socket().release(ec);
    if (ec) {
      stream.socket().close(ec);
      return false;
    }
    parked_fd = fd;
    return true;
  }
  /// On the io thread: the socket back into the stream. False when it could
  /// not (the socket is then closed).
  bool unpark() noexcept {
    if (parked_fd < 0) return stream.socket().is_open();
    error_code ec;
    stream.socket().assign(protocol, parked_fd, ec);
    if (ec) ::close(parked_fd);
    parked_fd = -1;
    return !ec;
  }
  /// Closes the socket, wherever it is; the stream's timer is left alone
  /// (stream.close() on the io thread cancels it).
  void close_socket() noexcept {
    if (parked_fd >= 0) {
      ::close(parked_fd);
      parked_fd = -1;
    }
    error_code ignored;
    stream.socket().close(ignored);
  }
  /// On the io thread: the socket and the stream's timer.
  void close() noexcept {
    close_socket();
    stream.close();
  }
};
using connection_ptr = std::shared_ptr<connection>;

// A call waiting for a connection of an endpoint at its limit.
struct waiter {
  explicit waiter(net::io_context& ioc) : timer(ioc) {}
  net::steady_timer timer;  // expires at the call's deadline; cancelled to wake it
  bool granted = false;
  connection_ptr conn;  // with granted: a pooled connection, or null: open one
};

struct endpoint_pool {
  std::deque<connection_ptr> idle;  // the most recently used at the back
  std::size_t open = 0;             // connections busy, idle or being opened
  std::deque<std::shared_ptr<waiter>> waiters;
};

struct cached_lookup {
  std::vector<tcp::endpoint> addresses;
  steady::time_point until;
};

// Where a call failed. Everything before the write sent nothing.
enum class stage { lookup, connect, write, read };

bool is_timeout(const error_code& ec) {
  return ec == boost::beast::error::timeout || ec == net::error::timed_out;
}

// The one place that decides an error's kind (see the header).
transport_error failure(const std::string& where, stage s, const error_code& ec) {
  const std::string what = where + ": " + ec.message();
  // Before the write nothing was sent, whatever ended it: the deadline too
  // (found in review: a lookup or a connect that timed out was reported in
  // doubt; the payment wrapper then held the key to its deadline, and the
  // client helper took a request that never left for one that may have).
  if (s == stage::lookup || s == stage::connect) {
    return {transport_error::kind::connect,
            is_timeout(ec) ? what + " (the deadline passed before a connection was made)" : what};
  }
  if (is_timeout(ec)) return {transport_error::kind::timeout, what};
  return {transport_error::kind::closed, what};
}

transport_error shutting_down(const std::string& where) {
  return {transport_error::kind::connect, where + ": the HTTP client is shutting down"};
}

// Rule 1 of the header: is an idle connection still usable? Any byte waiting
// on a connection that owes us nothing (an early 408, a stray answer), an EOF
// or an error means it is not. A non-blocking peek: no round trip.
bool still_open(connection& c) {
  for (;;) {
    char byte = 0;
    const auto n = ::recv(c.fd(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }
}

// A pooled connection's socket as Beast's synchronous streams see it, for
// send() on the caller's thread: each read or write waits at most until the
// call's deadline (poll), then fails with beast::error::timeout. The socket
// stays as Asio left it (non-blocking); only this thread uses it meanwhile.
class deadline_socket {
 public:
  deadline_socket(int fd, steady::time_point deadline) : fd_(fd), deadline_(deadline) {}

  template <class Buffers>
  std::size_t read_some(const Buffers& buffers, error_code& ec) {
    // Beast reads into one buffer (a flat_buffer's prepare()).
    const net::mutable_buffer b = *net::buffer_sequence_begin(buffers);
    if (b.size() == 0) return done(ec, 0);  // not EOF: nothing was asked for
    for (;;) {
      const auto n = ::recv(fd_, b.data(), b.size(), MSG_DONTWAIT);
      if (n > 0) return done(ec, n);
      if (n == 0) {
        ec = net::error::eof;
        return 0;
      }
      if (!retry(POLLIN, ec)) return 0;
    }
  }
  template <class Buffers>
  std::size_t write_some(const Buffers& buffers, error_code& ec) {
    // All the pieces (the serializer gives the header in several) in one
    // sendmsg: one system call, and one segment with TCP_NODELAY.
    std::array<iovec, 16> parts{};
    std::size_t n_parts = 0;
    for (auto it = net::buffer_sequence_begin(buffers);
         it != net::buffer_sequence_end(buffers) && n_parts < parts.size(); ++it) {
      const net::const_buffer b = *it;
      if (b.size() == 0) continue;
      parts[n_parts++] = iovec{const_cast<void*>(b.data()), b.size()};  // NOLINT: sendmsg's type
    }
    msghdr msg{};
    msg.msg_iov = parts.data();
    msg.msg_iovlen = n_parts;
    for (;;) {
      const auto n = ::sendmsg(fd_, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n >= 0) return done(ec, n);
      if (!retry(POLLOUT, ec)) return 0;
    }
  }
  // The throwing forms the stream concepts ask for.
  template <class Buffers>
  std::size_t read_some(const Buffers& buffers) {
    error_code ec;
    return or_throw(read_some(buffers, ec), ec);
  }
  template <class Buffers>
  std::size_t write_some(const Buffers& buffers) {
    error_code ec;
    return or_throw(write_some(buffers, ec), ec);
  }

 private:
  static std::size_t or_throw(std::size_t n, const error_code& ec) {
    if (ec) throw boost::system::system_error(ec);
    return n;
  }
  static std::size_t done(error_code& ec, ssize_t n) {
    ec = {};
    return static_cast<std::size_t>(n);
  }
  // After a failed recv/send: true to try again (interrupted, or the socket
  // became ready before the deadline); false with `ec` set otherwise.
  bool retry(short events, error_code& ec) {
    if (errno == EINTR) return true;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      ec = error_code(errno, boost::system::system_category());
      return false;
    }
    for (;;) {
      const auto left =
          std::chrono::ceil<std::chrono::milliseconds>(deadline_ - steady::now()).count();
      if (left <= 0) {
        ec = boost::beast::error::timeout;
        return false;
      }
      pollfd p{fd_, events, 0};
      const int r = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 60'000)));
      if (r > 0) return true;  // ready, or an error the next call reports
      if (r < 0 && errno != EINTR) {
        ec = error_code(errno, boost::system::system_category());
        return false;
      }
    }
  }

  int fd_;
  steady::time_point deadline_;
};

// What both paths of a call share. Sets Host and Content-Length; returns
// "host:port".
std::string address(const http_endpoint& to, http_request& req) {
  std::string host_port = to.host + ":" + std::to_string(to.port);
  req.set(http::field::host, host_port);
  req.prepare_payload();
  return host_port;
}

// Step 4's rule: a request written whole and lost before a byte of the
// answer came back is sent again (once, on a new connection) only when it
// is idempotent; never after a timeout.
bool resend_after_read(const http::response_parser<http::string_body>& parser, const connection& c,
                       delivery d, const error_code& ec) {
  const bool nothing_back = !parser.got_some() && c.buffer.size() == 0;
  return nothing_back && d == delivery::idempotent && !is_timeout(ec);
}

// Step 5's rule: back to the pool only after a complete answer that allows
// it: not HTTP/1.0 or Connection: close, not delimited by EOF, nothing
// unread behind it.
bool reusable(const http_response& res, const http_request& req, const connection& c) {
  // A 101 (the only 1xx a call returns, see interim()) switched the
  // connection to another protocol: never lent again.
  return res.result_int() >= 200 && !res.need_eof() && req.keep_alive() && c.buffer.size() == 0;
}

// Found in review: an interim answer (100 Continue, 102 Processing, 103
// Early Hints) was returned as THE answer, and the connection went back to
// the pool with the final answer still on its way, for the next call to read
// as its own: a charge told "declined" while the bank charged it. A client
// reads past any number of them to the final answer (RFC 9110 section 15.2),
// within the call's one deadline. 101 Switching Protocols is final here
// (nothing asks for an upgrade) and closes the connection.
bool interim(const http::response_parser<http::string_body>& parser) {
  const unsigned status = parser.get().result_int();
  return status >= 100 && status < 200 && status != 101;
}

// How a call that send() could not finish on its own thread goes on through
// the io thread.
enum class fallback {
  any,          // no connection was taken: as async_send() would
  new_only,     // a taken connection failed before the whole request was
                // written (rule 2): on a new connection, never re-sent again
  sent_before,  // the whole request was written, nothing came back, and the
                // request is idempotent: as new_only, and a failure that
                // sends nothing is still in doubt (`closed`), not `connect`
};

}  // namespace

struct http_client::impl {
  explicit impl(http_client_options o) : options(o) {}

  net::io_context ioc;  // first: destroyed last, after what runs on it
  http_client_options options;
  net::executor_work_guard<net::io_context::executor_type> work{net::make_work_guard(ioc)};
  std::thread thread;
  net::steady_timer sweeper{ioc};  // closes connections idle past idle_timeout
  // Set (under m) by ~http_client() run on the io thread itself (a callback
  // let go of the client's last owner): the io thread then deletes this
  // impl once the calls in flight, a send() on a caller's thread too, have
  // ended (uncount()).
  bool owned_by_io_thread = false;

  // The io thread's alone.
  std::unordered_set<tcp::resolver*> lookups_running;
  std::unordered_map<std::string, cached_lookup> lookups;

  // The pools, shared by the io thread and send() on callers' threads (which
  // takes an idle connection and talks on it itself: no hand-off to the io
  // thread and back, two context switches per call on a busy core).
  std::mutex pool_m;
  std::atomic<bool> stopping{false};
  std::unordered_map<std::string, endpoint_pool> pools;  // by "host:port"
  std::unordered_set<connection*> live;                  // every open connection

  // Any thread: the calls started and not yet called back.
  std::mutex m;
  std::condition_variable idle_cv;
  std::size_t in_flight = 0;

  /// One call fewer. The last one wakes ~http_client(), or, once the io
  /// thread owns this impl, lets its run() end (and the impl be deleted):
  /// after that, the caller must not touch the impl.
  void uncount() noexcept {
    bool end_run = false;
    {
      const std::lock_guard lock(m);
      if (--in_flight == 0) {
        idle_cv.notify_all();
        end_run = owned_by_io_thread;
      }
    }
    if (end_run) {
      try {
        net::post(ioc, [this] { work.reset(); });
      } catch (...) {  // NOLINT(bugprone-empty-catch): the io thread then lives on, idle
      }
    }
  }

  net::awaitable<http_response> call(http_endpoint to, http_request req,
                                     steady::time_point deadline, delivery d, fallback how);
  net::awaitable<connection_ptr> acquire(endpoint_pool& pool, const std::string& where,
                                         steady::time_point deadline, bool reuse);
  net::awaitable<connection_ptr> open(const http_endpoint& to, const std::string& where,
                                      steady::time_point deadline);
  /// Under pool_m: takes an idle connection still usable (rule 1); those
  /// found unusable leave the pool and go to `closing`, for the caller to
  /// close (on the io thread: close(); elsewhere: close_on_io_thread()).
  connection_ptr take_idle(endpoint_pool& pool, std::vector<connection_ptr>& closing);
  /// A connection off the pool and out of `live`, closed on the io thread
  /// (its stream's timer is the io thread's).
  void close_on_io_thread(const connection_ptr& c) noexcept;
  /// The io thread's half of a call: `done` once, on the io thread.
  void start_call(const http_endpoint& to, http_request req, steady::time_point deadline,
                  delivery d, fallback how, std::function<void(http_result)> done);
  /// On the io thread.
  void give_back(endpoint_pool& pool, connection_ptr c);
  /// On a caller's thread: gives back, or hands to the io thread a connection
  /// or slot a waiter is owed.
  void give_back_here(endpoint_pool& pool, connection_ptr c) noexcept;
  void close(connection& c);
  void shutdown();
  void sweep();
  /// send() on the caller's thread, on an idle pooled connection. Returns
  /// nothing when the call must go on through the io thread, as `then` says:
  /// no idle connection (any), a write that failed (new_only: nothing whole
  /// was sent), or an idempotent request lost before its answer
  /// (sent_before).
  std::optional<http_response> send_here(const http_endpoint& to, http_request& req,
                                         steady::time_point deadline, delivery d, fallback& then);
};

// One call, top to bottom. It holds one of the endpoint's connection slots
// from step 1 to step 5, whether or not a connection is open in it. `how`:
// see fallback (any for async_send()).
net::awaitable<http_response> http_client::impl::call(http_endpoint to, http_request req,
                                                      steady::time_point deadline, delivery d,
                                                      fallback how) {
  const std::string host_port = address(to, req);
  const std::string where = "http://" + host_port;
  endpoint_pool* pool_ptr = nullptr;
  {
    const std::lock_guard lock(pool_m);
    pool_ptr = &pools[host_port];  // unordered_map: references survive rehashing
  }
  auto& pool = *pool_ptr;
  // Once the request was written whole, a failure of a later sending that
  // sends nothing (no connection, shutting down) is still in doubt: the
  // first may have been acted on.
  bool sent_whole = how == fallback::sent_before;
  const auto in_doubt_once_sent = [&](const transport_error& e) {
    // The text says so too (found in review: it read as if nothing left).
    return sent_whole && e.error_kind() == transport_error::kind::connect
               ? transport_error(transport_error::kind::closed,
                                 "sent whole once, on a connection that closed with no answer "
                                 "(it may have been acted on); sending it again failed: " +
                                     std::string(e.what()))
               : e;
  };

  // 1. A pooled connection still open, or a free slot to open one (waiting
  //    for either within the deadline).
  connection_ptr c;
  try {
    c = co_await acquire(pool, where, deadline, how == fallback::any);
  } catch (const transport_error& e) {
    throw in_doubt_once_sent(e);
  }
  try {
    for (;;) {
      const bool reused = c != nullptr;
      // 2. A new connection: the lookup (if a name), connect.
      if (!c) c = co_await open(to, where, deadline);
      c->stream.expires_at(deadline);

      // 3. The request. A write that fails has not handed the whole request
      //    to the kernel, so the server cannot hold a complete request: on a
      //    reused connection (which the server may have closed as we took
      //    it) it is sent again on a new one (rule 2).
      error_code ec;
      co_await http::async_write(c->stream, req, net::redirect_error(net::use_awaitable, ec));
      if (ec) {
        close(*c);
        c.reset();
        if (reused && !stopping && !is_timeout(ec)) continue;
        throw failure(where, stage::write, ec);
      }

      // 4. The answer. Once the whole request is written the server may have
      //    acted on it, so a connection lost now is in doubt: re-sent only
      //    as resend_after_read() says, and only from a reused connection.
      std::optional<http::response_parser<http::string_body>> parser;
      bool got_interim = false;
      for (;;) {
        parser.emplace();
        if (req.method() == http::verb::head) parser->skip(true);
        co_await http::async_read(c->stream, c->buffer, *parser,
                                  net::redirect_error(net::use_awaitable, ec));
        if (ec || !interim(*parser)) break;
        got_interim = true;  // the server has the request: never re-sent
      }
      if (ec) {
        const bool again =
            reused && !stopping && !got_interim && resend_after_read(*parser, *c, d, ec);
        close(*c);
        c.reset();
        if (again) {
          sent_whole = true;
          continue;
        }
        throw failure(where, stage::read, ec);
      }
      auto res = parser->release();

      // 5. Back to the pool, or closed.
      if (!reusable(res, req, *c) || stopping) {
        close(*c);
        c.reset();
      }
      give_back(pool, std::move(c));
      co_return res;
    }
  } catch (const transport_error& e) {
    if (c) close(*c);
    give_back(pool, nullptr);
    throw in_doubt_once_sent(e);
  } catch (...) {
    if (c) close(*c);
    give_back(pool, nullptr);
    throw;
  }
}

connection_ptr http_client::impl::take_idle(endpoint_pool& pool,
                                            std::vector<connection_ptr>& closing) {
  // The most recently used first. One idle too long (the sweeper has not
  // come by yet), or closed by the server, is closed and replaced; nothing
  // was sent on it (rule 1).
  const auto now = steady::now();
  while (!pool.idle.empty()) {
    auto c = std::move(pool.idle.back());
    pool.idle.pop_back();
    if (now - c->idle_since < options.idle_timeout && still_open(*c)) return c;
    live.erase(c.get());
    c->close_socket();  // before its slot is free (the limit)
    --pool.open;
    closing.push_back(std::move(c));
  }
  return nullptr;
}

void http_client::impl::close_on_io_thread(const connection_ptr& c) noexcept {
  // The socket now, so that the slot it leaves is not reused while it is
  // still open (nothing else uses it: it is off the pool). The stream's
  // timer (no wait pending on it) is cancelled on the io thread.
  c->close_socket();
  try {
    net::post(ioc, [c] { c->stream.close(); });
  } catch (...) {  // NOLINT(bugprone-empty-catch): out of memory; the socket is closed
  }
}

net::awaitable<connection_ptr> http_client::impl::acquire(endpoint_pool& pool,
                                                          const std::string& where,
                                                          steady::time_point deadline, bool reuse) {
  std::shared_ptr<waiter> w;
  {
    const std::lock_guard lock(pool_m);
    if (stopping) throw shutting_down(where);
    if (reuse) {
      std::vector<connection_ptr> closing;
      auto c = take_idle(pool, closing);
      for (const auto& gone : closing) gone->close();  // on the io thread: now
      if (c) {
        // Back into Asio; one that cannot be is closed, and a new one is
        // opened in its slot.
        if (!c->unpark()) {
          live.erase(c.get());
          c->close();
          c.reset();
        }
        co_return c;
      }
    }
    if (pool.open < options.max_connections_per_endpoint) {
      ++pool.open;
      co_return nullptr;
    }
    if (!reuse && !pool.idle.empty()) {
      // A new connection wanted and an idle one holding a slot: close the
      // oldest and take its slot (waiting would wait for nothing).
      const connection_ptr oldest = std::move(pool.idle.front());
      pool.idle.pop_front();
      live.erase(oldest.get());
      oldest->close();
      co_return nullptr;
    }
    // At the limit: wait in line for a connection or a slot given back.
    w = std::make_shared<waiter>(ioc);
    w->timer.expires_at(deadline);
    pool.waiters.push_back(w);
  }
  error_code ec;
  co_await w->timer.async_wait(net::redirect_error(net::use_awaitable, ec));
  const std::lock_guard lock(pool_m);
  if (w->granted) {
    if (w->conn && (!reuse || !still_open(*w->conn))) {
      live.erase(w->conn.get());
      w->conn->close();
      w->conn.reset();  // keep the slot: open a new connection in it
    }
    co_return std::move(w->conn);
  }
  std::erase(pool.waiters, w);
  if (stopping) throw shutting_down(where);
  // Nothing of this request was sent: `connect`, not `timeout` (found in
  // review: a timeout reads as in doubt, so a payment that never left held
  // its key until the attempt's deadline). A re-sending reports it as
  // `closed` (in_doubt_once_sent).
  throw transport_error(transport_error::kind::connect,
                        where + ": no connection free before the deadline");
}

net::awaitable<connection_ptr> http_client::impl::open(const http_endpoint& to,
                                                       const std::string& where,
                                                       steady::time_point deadline) {
  if (stopping) throw shutting_down(where);
  std::vector<tcp::endpoint> addresses;
  error_code ec;
  const auto numeric = net::ip::make_address(to.host, ec);
  if (!ec) {
    addresses.emplace_back(numeric, to.port);
  } else {
    const std::string key = to.host + ":" + std::to_string(to.port);
    const auto now = steady::now();
    if (const auto it = lookups.find(key); it != lookups.end() && it->second.until > now) {
      addresses = it->second.addresses;
    } else {
      // Raced against the deadline: getaddrinfo() cannot be interrupted
      // (issue 7, defect 14). shutdown() cancels it, which takes effect when
      // getaddrinfo() returns.
      tcp::resolver resolver(ioc);
      lookups_running.insert(&resolver);
      ec = {};
      const auto found = co_await detail::async_resolve_before(
          resolver, to.host, std::to_string(to.port), deadline,
          net::redirect_error(net::use_awaitable, ec));
      lookups_running.erase(&resolver);
      if (stopping) throw shutting_down(where);
      if (ec) throw failure(where, stage::lookup, ec);
      for (const auto& e : found) addresses.push_back(e.endpoint());
      if (options.lookup_cache_ttl.count() > 0)
        lookups[key] = cached_lookup{addresses, now + options.lookup_cache_ttl};
    }
  }
  auto c = std::make_shared<connection>(ioc);
  {
    const std::lock_guard lock(pool_m);
    if (stopping) throw shutting_down(where);
    live.insert(c.get());
  }
  c->stream.expires_at(deadline);
  ec = {};
  const tcp::endpoint connected =
      co_await c->stream.async_connect(addresses, net::redirect_error(net::use_awaitable, ec));
  if (ec) {
    close(*c);
    throw failure(where, stage::connect, ec);
  }
  c->protocol = connected.protocol();
  c->stream.socket().set_option(tcp::no_delay(true), ec);  // one small request, one answer
  // Asio opens sockets without SOCK_CLOEXEC: a kept-alive connection
  // inherited by a spawned process would outlive our close() there.
  ::fcntl(c->stream.socket().native_handle(), F_SETFD, FD_CLOEXEC);
  co_return c;
}

// `c`: a reusable connection, or null when the call's slot is free again.
// The first waiter gets either; otherwise a connection goes idle.
void http_client::impl::give_back(endpoint_pool& pool, connection_ptr c) {
  const std::lock_guard lock(pool_m);
  if (!pool.waiters.empty()) {
    auto w = std::move(pool.waiters.front());
    pool.waiters.pop_front();
    // The waiter runs on this thread, on the stream (one given back by a
    // send() on a caller's thread comes parked). One that cannot go back
    // into Asio is closed: the waiter opens a new one in its slot.
    if (c && !c->unpark()) {
      live.erase(c.get());
      c->close();
      c.reset();
    }
    w->granted = true;
    w->conn = std::move(c);
    w->timer.cancel();
    return;
  }
  if (c && !c->park()) {  // closed: its slot is free
    live.erase(c.get());
    c->close();
    c.reset();
  }
  if (!c) {
    --pool.open;
    return;
  }
  c->idle_since = steady::now();
  pool.idle.push_back(std::move(c));
}

void http_client::impl::give_back_here(endpoint_pool& pool, connection_ptr c) noexcept {
  // Takes pool_m itself: call it without (found in review: the comment said
  // "under pool_m", and a caller believing it would deadlock). `keep` runs
  // under it.
  const auto keep = [&] {
    if (!c) {
      --pool.open;
    } else {
      c->idle_since = steady::now();
      pool.idle.push_back(std::move(c));
    }
  };
  {
    const std::lock_guard lock(pool_m);
    if (pool.waiters.empty()) return keep();  // nobody to wake: no need for the io thread
  }
  // A waiter's timer is the io thread's to cancel.
  try {
    net::post(ioc, [this, &pool, c]() mutable { give_back(pool, std::move(c)); });
  } catch (...) {
    const std::lock_guard lock(pool_m);
    keep();  // out of memory: the waiter finds it at its deadline, or gives up
  }
}

void http_client::impl::close(connection& c) {
  {
    const std::lock_guard lock(pool_m);
    live.erase(&c);
  }
  c.close();  // what is pending on it completes with operation_aborted
}

void http_client::impl::sweep() {
  {
    const std::lock_guard lock(pool_m);
    if (stopping) return;
    const auto now = steady::now();
    for (auto& entry : pools) {
      endpoint_pool& pool = entry.second;  // not a binding: clang 14 cannot capture one
      std::erase_if(pool.idle, [&](const connection_ptr& c) {
        if (now - c->idle_since < options.idle_timeout) return false;
        live.erase(c.get());
        c->close();
        --pool.open;
        return true;
      });
    }
  }
  // Often enough that no connection stays open much past idle_timeout (none
  // is used past it: take_idle() checks).
  sweeper.expires_after(std::max(std::chrono::milliseconds(5), options.idle_timeout / 8));
  sweeper.async_wait([this](const error_code& ec) {
    if (!ec) sweep();
  });
}

// On the io thread: every call still running ends soon after this.
void http_client::impl::shutdown() {
  sweeper.cancel();
  const std::lock_guard lock(pool_m);
  stopping = true;
  for (auto* c : live) {
    if (c->on_caller_thread) {
      // Its caller is in poll() or recv() on it: wake it (EOF), and let it
      // close the socket itself, so that no descriptor is closed under it.
      ::shutdown(c->fd(), SHUT_RDWR);
    } else {
      c->close();  // what is pending on it completes with operation_aborted
    }
  }
  std::erase_if(live, [](connection* c) { return !c->on_caller_thread; });
  for (auto* r : lookups_running) r->cancel();
  for (auto& [host_port, pool] : pools) {
    pool.idle.clear();
    for (auto& w : pool.waiters) w->timer.cancel();
  }
}

std::optional<http_response> http_client::impl::send_here(const http_endpoint& to,
                                                          http_request& req,
                                                          steady::time_point deadline, delivery d,
                                                          fallback& then) {
  const std::string host_port = address(to, req);
  connection_ptr c;
  endpoint_pool* pool = nullptr;
  std::vector<connection_ptr> closing;
  {
    const std::lock_guard lock(pool_m);
    if (stopping) return std::nullopt;  // the io thread's path says so
    const auto it = pools.find(host_port);
    if (it == pools.end()) return std::nullopt;
    pool = &it->second;
    c = take_idle(*pool, closing);
    if (c) c->on_caller_thread = true;
  }
  for (const auto& gone : closing) close_on_io_thread(gone);  // never throws
  if (!c) return std::nullopt;

  // Ends the use of the connection on this thread, on every way out: back
  // to the pool after a complete answer that allows it, else closed (its
  // slot free).
  struct user {
    impl& i;
    endpoint_pool& pool;
    connection_ptr c;
    bool keep = false;
    user(impl& owner, endpoint_pool& p, connection_ptr conn)
        : i(owner), pool(p), c(std::move(conn)) {}
    user(const user&) = delete;
    user& operator=(const user&) = delete;
    ~user() {
      {
        const std::lock_guard lock(i.pool_m);
        c->on_caller_thread = false;
        if (!keep || i.stopping) {
          i.live.erase(c.get());
          keep = false;
        }
      }
      if (!keep) i.close_on_io_thread(c);
      i.give_back_here(pool, keep ? std::move(c) : nullptr);
    }
  } in_use(*this, *pool, std::move(c));
  connection& conn = *in_use.c;

  const std::string where = "http://" + host_port;
  deadline_socket io(conn.fd(), deadline);  // parked: idle connections are
  // 3. The request. Beast's synchronous write fails only before the whole
  //    request is with the kernel (rule 2: the io thread sends it again on a
  //    new connection); shutdown() ends it the same way (nothing complete
  //    was sent: `connect`).
  error_code ec;
  http::write(io, req, ec);
  if (ec) {
    if (stopping) throw shutting_down(where);
    if (is_timeout(ec)) throw failure(where, stage::write, ec);
    then = fallback::new_only;
    return std::nullopt;
  }
  // 4. The answer, as in call(): past any interim ones.
  std::optional<http::response_parser<http::string_body>> parser;
  bool got_interim = false;
  for (;;) {
    parser.emplace();
    if (req.method() == http::verb::head) parser->skip(true);
    http::read(io, conn.buffer, *parser, ec);
    if (ec || !interim(*parser)) break;
    got_interim = true;
  }
  if (ec) {
    if (!stopping && !got_interim && resend_after_read(*parser, conn, d, ec)) {
      then = fallback::sent_before;
      return std::nullopt;
    }
    throw failure(where, stage::read, ec);
  }
  auto res = parser->release();
  // 5. As in call() (the guard closes it when the client is stopping).
  in_use.keep = reusable(res, req, conn);
  return res;
}

http_client::http_client(http_client_options options) : impl_(std::make_unique<impl>(options)) {
  if (options.max_connections_per_endpoint == 0)
    throw config_error("http_client_options: max_connections_per_endpoint is 0");
  net::post(impl_->ioc, [i = impl_.get()] { i->sweep(); });
  impl_->thread = std::thread([i = impl_.get()] {
    i->ioc.run();
    if (i->owned_by_io_thread)
      delete i;  // NOLINT(cppcoreguidelines-owning-memory): see ~http_client
  });
}

http_client::~http_client() {
  if (std::this_thread::get_id() == impl_->thread.get_id()) {
    // Destroyed by a callback on the io thread (an async_send() callback
    // that let go of the client's last owner). Waiting here for the calls
    // in flight would wait for this thread, and joining it would join
    // itself (found in review: a deadlock, or std::terminate). The io thread
    // ends those calls (their callbacks get `connect` or `closed`), then
    // deletes the impl and ends.
    // The work guard stays until the last call in flight, this callback's
    // own and a send() on another thread (the review of the first version:
    // run() ended under it, and it used the deleted impl), is uncounted.
    impl* i = impl_.release();
    try {
      {
        const std::lock_guard lock(i->m);
        i->owned_by_io_thread = true;
      }
      i->shutdown();
      i->thread.detach();
    } catch (...) {  // a mutex or the thread failed: no way left to end the calls
      std::terminate();
    }
    return;
  }
  net::post(impl_->ioc, [i = impl_.get()] { i->shutdown(); });
  {
    std::unique_lock lock(impl_->m);
    impl_->idle_cv.wait(lock, [&] { return impl_->in_flight == 0; });
  }
  impl_->work.reset();
  impl_->ioc.stop();
  impl_->thread.join();
}

void http_client::impl::start_call(const http_endpoint& to, http_request req,
                                   steady::time_point deadline, delivery d, fallback how,
                                   std::function<void(http_result)> done) {
  {
    const std::lock_guard lock(m);
    ++in_flight;
  }
  const auto finished = [this, done = std::move(done)](const std::exception_ptr& e,
                                                       http_response res) {
    http_result r;
    if (!e) {
      r.response = std::move(res);
    } else {
      try {
        std::rethrow_exception(e);
      } catch (const transport_error& te) {
        r.error = te;
      } catch (const std::exception& other) {
        // Not an I/O error (bad_alloc, say): nothing says what the server
        // saw, so in doubt.
        r.error = transport_error(transport_error::kind::closed, other.what());
      }
    }
    done(std::move(r));
    uncount();
  };
  try {
    net::co_spawn(ioc, call(to, std::move(req), deadline, d, how), finished);
  } catch (...) {  // never started: not in flight
    uncount();
    throw;
  }
}

void http_client::async_send(const http_endpoint& to, http_request req,
                             std::chrono::milliseconds timeout,
                             std::function<void(http_result)> done, delivery d) {
  impl_->start_call(to, std::move(req), steady::now() + timeout, d, fallback::any, std::move(done));
}

http_response http_client::send(const http_endpoint& to, http_request req,
                                std::chrono::milliseconds timeout, delivery d) {
  if (impl_->ioc.get_executor().running_in_this_thread())
    throw std::logic_error("http_client::send() on its own io thread would wait for itself");
  const auto deadline = steady::now() + timeout;
  // Counted like a call in flight until the io thread's half (if any) is
  // counted too: ~http_client() waits for it.
  {
    const std::lock_guard lock(impl_->m);
    ++impl_->in_flight;
  }
  const struct uncounted {
    impl& i;
    ~uncounted() { i.uncount(); }
  } counted{*impl_};
  fallback then = fallback::any;
  try {
    if (auto res = impl_->send_here(to, req, deadline, d, then)) return std::move(*res);
  } catch (const transport_error&) {
    throw;
  } catch (const std::exception& other) {
    // Not an I/O error (bad_alloc, say): nothing says what the server saw.
    throw transport_error(transport_error::kind::closed, other.what());
  }
  std::promise<http_result> result;
  auto answer = result.get_future();
  impl_->start_call(to, std::move(req), deadline, d, then,
                    [&result](http_result r) { result.set_value(std::move(r)); });
  auto r = answer.get();
  // A fresh exception, made on this thread (found by TSan in CI): the one
  // from the io thread shares std::runtime_error's reference-counted text
  // with the io thread's own copy, whose last release may come there after
  // this thread read it (the count is libstdc++'s, unseen by TSan). The
  // same kind and text.
  if (r.error) throw transport_error(r.error->error_kind(), r.error->info().internal);
  return std::move(*r.response);
}

http_response send(const http_endpoint& to, http_request req, std::chrono::milliseconds timeout) {
  static http_client shared;
  return shared.send(to, std::move(req), timeout);
}

}  // namespace orpheus::beast
