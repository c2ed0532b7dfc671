#include <utility>  // before Asio: Boost 1.74's awaitable.hpp needs std::exchange

#include "orpheus/beast/server.hpp"

#include <poll.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdio>
#include <exception>
#include <iterator>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "orpheus/codes.hpp"
#include "orpheus/log.hpp"
#include "orpheus/problem.hpp"

namespace orpheus::beast {

namespace net = boost::asio;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;

namespace {

// The boolean member `name` of a problem+json answer, if it has one.
std::optional<bool> problem_flag(const http_response& res, std::string_view name) {
  // Media types are case-insensitive (RFC 9110 section 8.3.1; found in
  // review: "Application/Problem+JSON" read as not final, and was retried).
  constexpr std::string_view problem_json = "application/problem+json";
  const auto type = res[http::field::content_type];
  if (type.size() < problem_json.size() ||
      !boost::beast::iequals(type.substr(0, problem_json.size()),
                             boost::beast::string_view(problem_json.data(), problem_json.size()))) {
    return std::nullopt;
  }
  const auto problem = nlohmann::json::parse(res.body(), nullptr, /*allow_exceptions=*/false);
  if (!problem.is_object()) return std::nullopt;
  const auto it = problem.find(name);
  if (it == problem.end() || !it->is_boolean()) return std::nullopt;
  return it->get<bool>();
}

}  // namespace

bool says_final(const http_response& res) { return problem_flag(res, "retryable") == false; }

bool says_in_doubt(const http_response& res) { return problem_flag(res, "in_doubt") == true; }

http_response make_response(unsigned status, std::string body, const std::string& content_type) {
  http_response r{static_cast<http::status>(status), 11};
  r.set(http::field::content_type, content_type);
  r.body() = std::move(body);
  r.prepare_payload();
  return r;
}

bool idempotent_by_http(http::verb v) {
  return v == http::verb::get || v == http::verb::head || v == http::verb::options ||
         v == http::verb::trace || v == http::verb::put || v == http::verb::delete_;
}

// What a handler that threw, or whose answer could not be framed, is
// answered (found in review: a bare text 500 said nothing of a retry):
// problem+json, in doubt, since the handler may have acted. A request HTTP
// lets a client send again (GET, PUT, ...) is retryable; any other is final,
// as the middleware answers an unkeyed POST: this server does not know
// whether a key was sent, and one sent again without it runs again (found
// in the review of the first version, which said retryable to every method).
namespace {
http_response handler_failed(http::verb method) {
  const bool again = idempotent_by_http(method);
  const error_info e =
      again ? error_info::of(error_class::in_doubt, codes::unclassified,
                             "the request's handler failed and may have carried it out; "
                             "send it again")
                  .with_http_status(500)
            : error_info::of(error_class::internal, codes::unclassified,
                             "the request's handler failed and may have carried it out; "
                             "send it again only with the same idempotency key, never without "
                             "one or under a new one");
  const response p = problem_response(e);
  http_response r{static_cast<http::status>(p.status), 11};
  for (const auto& [name, value] : p.headers) r.set(name, value);
  auto body = nlohmann::json::parse(p.body);
  body["in_doubt"] = true;
  r.body() = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (again) {
    r.set(http::field::retry_after,
          std::to_string((announced_retry_after(e).count() + 999) / 1000));
  }
  r.keep_alive(false);
  r.prepare_payload();
  return r;
}
}  // namespace

http_response drop_connection() {
  http_response r;
  r.result(static_cast<unsigned>(0));  // not a status any handler sends
  return r;
}

namespace {

// Frames an answer (Content-Length), as Beast's prepare_payload() does, but
// first drops what cannot go on the wire: a 204 or 304 answer has no
// body (RFC 9110, sections 6.4.1 and 15.4.5; found in review: a handler's
// 204 with "{}" made prepare_payload() throw on an io thread, and the
// process ended), and an answer to HEAD is its headers alone (a body after
// them would read as the start of the next answer on a kept-alive
// connection). False when it cannot be framed.
bool framed(http_response& res, bool head) {
  const unsigned status = res.result_int();
  // A 1xx is never a final answer (a client reads it as interim and waits
  // for the real one): found in review.
  if (status < 200) return false;
  if (status == 204 || status == 304) res.body().clear();
  try {
    res.prepare_payload();
  } catch (const std::exception&) {
    return false;
  }
  if (head) res.body().clear();  // Content-Length stays what GET's would be
  return true;
}

}  // namespace

class session;

// Everything a running server owns. Sessions hold a shared_ptr to it, so the
// io_context outlives every connection and every pending answer.
struct server::impl : std::enable_shared_from_this<server::impl> {
  server_options options;
  handler on_request;
  net::io_context ioc;
  // The acceptor and its back-off timer live on one strand: stop() and
  // stop_accepting() close them from another io thread.
  net::strand<net::io_context::executor_type> accept_strand{net::make_strand(ioc)};
  tcp::acceptor acceptor{accept_strand};
  net::steady_timer backoff{accept_strand};
  net::steady_timer cap_timer{accept_strand};  // make_room's next look
  std::vector<std::thread> threads;
  // Keeps the io threads running from start() to stop(). Found in review:
  // with every connection's request in a handler and no accept pending (at
  // max_connections, or after stop_accepting()), the io_context had no work
  // left, run() returned, and the io threads ended: no answer was written
  // again, and the server never accepted again.
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  mutable std::mutex mutex;  // guards what follows
  std::vector<std::weak_ptr<session>> sessions;
  std::size_t open = 0;   // sessions alive
  bool accepting = true;  // false after stop_accepting() or stop()
  bool paused = false;    // at max_connections: no accept pending
  bool watching = false;  // at max_connections: wait_for_newcomer's loop runs
  bool stopped = false;

  void accept();
  void on_accept(boost::beast::error_code ec, tcp::socket s);
  void accept_next();
  void wait_for_newcomer();
  void make_room();
  void session_closed();

  // Posts `f` to the io_context unless the server has stopped: after stop()
  // nothing runs the io_context, so a posted answer would never be written
  // (nor freed). Returns false when dropped.
  template <class Executor, class F>
  bool post_unless_stopped(const Executor& where, F&& f) {
    std::lock_guard lock(mutex);
    if (stopped) return false;
    net::post(where, std::forward<F>(f));
    return true;
  }
};

template <class Fields>
std::size_t field_count(const Fields& fields) {
  return static_cast<std::size_t>(std::distance(fields.begin(), fields.end()));
}

// Beast's reads ask for up to this many bytes at a time (read_size()).
constexpr std::size_t beast_read_size = std::size_t{64} * 1024;

// A session's read buffer holds at most a header block and one read of
// bytes not parsed yet. Beast 1.74 limits the header block and the body, but
// not a chunk's size line nor the trailers (found in review: one request
// whose chunk line never ended grew the buffer by every byte sent, until
// read_timeout or the end of memory). Past the bound the read fails with
// buffer_overflow, answered 400.
class session : public std::enable_shared_from_this<session> {
 public:
  session(tcp::socket&& socket, std::shared_ptr<server::impl> owner)
      : owner_(std::move(owner)),
        stream_(std::move(socket)),
        buffer_(owner_->options.header_limit + beast_read_size) {}  // at most 128 KiB
  session(const session&) = delete;
  session& operator=(const session&) = delete;
  ~session() { owner_->session_closed(); }

  void run() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->read(); });
  }

  // Called by stop(), on an io thread (posted before the loop stops).
  void close() {
    closing_ = true;
    boost::beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
  }

  // Since when this connection has waited for its next request, or, new,
  // for its first byte (steady clock ticks); -1 while it has a request.
  [[nodiscard]] std::int64_t idle_since() const noexcept { return idle_since_.load(); }

  // At max_connections: close this connection if it is still idle, from its
  // own strand. Nothing is in flight on it: an idle connection is one the
  // server may close at any time (RFC 9112, section 9.6), as idle_timeout
  // does.
  void close_if_idle() {
    net::post(stream_.get_executor(), [self = shared_from_this()] {
      if (self->idle_since_.load() >= 0) self->close();
    });
  }

  boost::beast::tcp_stream::executor_type executor() { return stream_.get_executor(); }

 private:
  // Three clocks, so that each kind of slow client is cut off by its own
  // limit: idle_timeout until a keep-alive connection's next request starts,
  // header_timeout for its header block, read_timeout for its body.
  // A new connection that has sent nothing has no request in flight either:
  // at max_connections make_room may close it as an idle one (found in
  // review: only kept-alive connections were, so clients that opened
  // connections and sent nothing held every place until header_timeout,
  // and a newcomer waited behind them). Its header_timeout counts from the
  // connection, first byte included.
  void read() {
    const auto& o = owner_->options;
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(o.header_limit));
    parser_->body_limit(o.body_limit);
    const auto now = std::chrono::steady_clock::now();
    if (buffer_.size() > 0) return read_header(now + o.header_timeout);
    const auto header_by =
        served_one_ ? std::chrono::steady_clock::time_point::max() : now + o.header_timeout;
    stream_.expires_after(served_one_ ? o.idle_timeout : o.header_timeout);
    idle_since_ = now.time_since_epoch().count();
    stream_.async_read_some(buffer_.prepare(1024), [self = shared_from_this(), header_by](
                                                       boost::beast::error_code ec, std::size_t n) {
      self->idle_since_ = -1;
      if (ec) return self->on_read(ec);
      // Closed (close_if_idle) after these bytes arrived but before
      // this ran: the request is dropped unread, as if it came after the
      // close (found in review: it was parsed from the buffer and run,
      // and its answer had no socket to go to).
      if (self->closing_) return;
      self->buffer_.commit(n);
      self->read_header(std::min(
          header_by, std::chrono::steady_clock::now() + self->owner_->options.header_timeout));
    });
  }

  void read_header(std::chrono::steady_clock::time_point by) {
    stream_.expires_at(by);
    http::async_read_header(stream_, buffer_, *parser_,
                            [self = shared_from_this()](boost::beast::error_code ec, std::size_t) {
                              self->header_fields_ = field_count(self->parser_->get());
                              if (ec || self->parser_->is_done()) return self->on_read(ec);
                              if (self->expects_continue()) return self->send_continue();
                              self->read_body();
                            });
  }

  // RFC 9110 10.1.1: a client that sends "Expect: 100-continue" may wait for
  // a 100 before it sends the body, and the server must send it (or a final
  // answer). Found in review: none came, the body's read timed out, the
  // connection was closed unanswered, and the client, with no answer to a
  // request it had begun to send, held a payment that never ran in doubt.
  [[nodiscard]] bool expects_continue() const {
    const auto& h = parser_->get();
    return h.version() >= 11 && boost::beast::iequals(h[http::field::expect], "100-continue");
  }

  void send_continue() {
    stream_.expires_after(owner_->options.read_timeout);
    auto res = std::make_shared<http::response<http::empty_body>>(http::status::continue_, 11);
    http::async_write(stream_, *res,
                      [self = shared_from_this(), res](boost::beast::error_code ec, std::size_t) {
                        if (ec) return self->shutdown();
                        self->read_body();
                      });
  }

  void read_body() {
    stream_.expires_after(owner_->options.read_timeout);
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](boost::beast::error_code ec, std::size_t) {
                       self->on_read(ec);
                     });
  }

  void on_read(boost::beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == net::error::operation_aborted ||
        ec == boost::beast::error::timeout || ec == net::error::connection_reset ||
        ec == net::error::eof || ec == net::error::bad_descriptor) {
      return shutdown();
    }
    if (ec) {  // refuse and close: the stream is out of sync after a bad request
      // Fixed texts: a parser's message is not for clients (issue 7, 13).
      unsigned status = 400;
      std::string why = "malformed request\n";
      if (ec == http::error::body_limit) {
        status = 413;
        why = "request body too large\n";
      }
      if (ec == http::error::header_limit) {
        status = 431;
        why = "request header too large\n";
      }
      auto r = make_response(status, std::move(why));
      r.keep_alive(false);
      head_ = false;  // a request that did not parse has no method to go by
      unread_ = true;
      return write(std::move(r));
    }
    served_one_ = true;
    // Beast 1.74 merges a chunked body's trailer fields into the header
    // fields, where nothing can tell them apart. Found in review: an
    // Idempotency-Key (or an Authorization) sent as a trailer was taken as
    // the request's own, which RFC 9110 (6.5.1) forbids, and a proxy that
    // drops trailers on the retry would have sent the same payment without
    // its key, to be charged again. A request with trailer fields is
    // refused before it reaches the handler; it is read whole, so the
    // connection stays usable.
    if (field_count(parser_->get()) != header_fields_) {
      auto r = make_response(400, "trailer fields are not accepted\n");
      r.keep_alive(parser_->get().keep_alive());
      head_ = parser_->get().method() == http::verb::head;
      method_ = parser_->get().method();
      return write(std::move(r));
    }
    http_request req = parser_->release();
    const bool keep_alive = req.keep_alive();
    head_ = req.method() == http::verb::head;
    method_ = req.method();
    // The handler may answer later from another thread: hop back onto this
    // connection's strand to write. Exactly one answer is written, even if
    // the handler throws after handing its responder on.
    auto answered = std::make_shared<std::atomic<bool>>(false);
    auto respond = [self = shared_from_this(), keep_alive, answered](http_response r) {
      if (answered->exchange(true)) return;
      r.keep_alive(keep_alive && r.keep_alive());
      auto where = self->executor();
      self->owner_->post_unless_stopped(
          where, [self, r = std::move(r)]() mutable { self->write(std::move(r)); });
    };
    try {
      owner_->on_request(std::move(req), respond);
    } catch (...) {
      // A throwing handler must not take the io thread (and the server) down.
      respond(handler_failed(method_));
    }
  }

  void write(http_response r) {
    if (r.result_int() == 0) {  // drop_connection(): no answer at all
      close();
      return;
    }
    auto res = std::make_shared<http_response>(std::move(r));
    if (!framed(*res, head_)) {
      // Found in review: Beast's prepare_payload() threw on an io thread,
      // which took the process down.
      *res = handler_failed(method_);
    }
    stream_.expires_after(owner_->options.read_timeout);
    http::async_write(stream_, *res,
                      [self = shared_from_this(), res](boost::beast::error_code ec, std::size_t) {
                        if (!ec && self->unread_) return self->linger();
                        if (ec || !res->keep_alive()) return self->shutdown();
                        self->read();
                      });
  }

  void shutdown() {
    boost::beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
  }

  // A lingering close (RFC 9112, section 9.6), after the answer to a request
  // not read to its end (400, 413, 431). Found in review: the socket was
  // closed with the client's bytes unread, so the kernel sent a reset, which
  // could reach the client before it read the answer; it then saw a reset
  // (the outcome unknown: orpheus::client retried, and reported the request
  // unsettled) instead of a final 4xx. Now the write side is shut (the
  // client reads the answer, then the end of the stream) and whatever still
  // arrives is read and dropped until the client closes, nothing arrives
  // for linger_quiet, or read_timeout has passed since the answer (a slower
  // upload still gets the reset). At max_connections make_room closes such
  // a connection first: it will never carry another request (found in
  // review: it counted as idle since the answer, and an older keep-alive
  // connection went before it).
  static constexpr std::chrono::seconds linger_quiet{2};

  void linger() {
    shutdown();
    linger_until_ = std::chrono::steady_clock::now() + owner_->options.read_timeout;
    idle_since_ = 0;  // before any keep-alive connection's
    drop_some();
  }

  void drop_some() {
    const auto left = linger_until_ - std::chrono::steady_clock::now();
    stream_.expires_after(std::min<std::chrono::steady_clock::duration>(linger_quiet, left));
    buffer_.clear();
    stream_.async_read_some(buffer_.prepare(std::size_t{16} * 1024),
                            [self = shared_from_this()](boost::beast::error_code ec, std::size_t) {
                              // The end of the stream, a reset, the timeout or
                              // close(): the session ends, and the socket with it.
                              if (ec || self->closing_) return;
                              self->drop_some();
                            });
  }

  // First, so destroyed last: the stream's socket and timer belong to the
  // owner's io_context. A session released last by a pool thread (an answer
  // given after the server object was gone) used to free the io_context
  // before the stream (heap-use-after-free seen under ASan at SIGTERM).
  std::shared_ptr<server::impl> owner_;
  boost::beast::tcp_stream stream_;
  boost::beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::size_t header_fields_ = 0;             // fields in the header block, trailers not yet read
  bool served_one_ = false;                   // a new connection has nothing to be idle about
  bool head_ = false;                         // the request being answered is a HEAD
  http::verb method_ = http::verb::get;       // ... and its method
  std::atomic<std::int64_t> idle_since_{-1};  // see idle_since()
  bool closing_ = false;                      // close() ran: nothing more is read
  bool unread_ = false;                       // refused before its end: linger() after the answer
  std::chrono::steady_clock::time_point linger_until_;  // see linger()
};

void server::impl::accept() {
  acceptor.async_accept(net::make_strand(ioc),
                        [self = shared_from_this()](boost::beast::error_code ec, tcp::socket s) {
                          self->on_accept(ec, std::move(s));
                        });
}

// Runs on accept_strand. Issue 7, defect 1: this used to return on any
// error, so one EMFILE (idle connections using up the descriptors) ended
// accepting for the life of the process.
void server::impl::on_accept(boost::beast::error_code ec, tcp::socket s) {
  if (ec == net::error::operation_aborted || !acceptor.is_open()) return;  // stop_accepting()
  if (ec == boost::system::errc::too_many_files_open ||
      ec == boost::system::errc::too_many_files_open_in_system ||
      ec == boost::system::errc::no_buffer_space || ec == boost::system::errc::not_enough_memory) {
    // The connection stays in the listen backlog. Accepting again at once
    // would fail again at once (a busy loop on the io thread): wait until
    // some connection has had time to close.
    backoff.expires_after(options.accept_backoff);
    backoff.async_wait([self = shared_from_this()](boost::beast::error_code e) {
      if (!e) self->accept_next();
    });
    return;
  }
  if (!ec) {  // other errors (ECONNABORTED, ...) concern that one connection
    std::shared_ptr<session> sess;
    {
      std::lock_guard lock(mutex);
      if (stopped) return;
      ++open;  // before the session exists: its destructor counts down
      sess = std::make_shared<session>(std::move(s), shared_from_this());
      std::erase_if(sessions, [](const auto& w) { return w.expired(); });
      sessions.push_back(sess);
    }
    sess->run();
  }
  accept_next();
}

// Accepts the next connection, unless max_connections are open: then the
// next session to close resumes (session_closed), and meanwhile a newcomer
// waiting in the listen backlog gets room made for it (make_room).
void server::impl::accept_next() {
  {
    std::lock_guard lock(mutex);
    if (!accepting || stopped) return;
    if (options.max_connections != 0 && open >= options.max_connections) {
      paused = true;
      if (watching) return;
      watching = true;
    } else {
      accept();
      return;
    }
  }
  wait_for_newcomer();
}

// At the cap: waits until a connection is waiting to be accepted.
void server::impl::wait_for_newcomer() {
  acceptor.async_wait(tcp::acceptor::wait_read,
                      [self = shared_from_this()](boost::beast::error_code ec) {
                        if (ec) {  // stop() or stop_accepting() closed the acceptor
                          std::lock_guard lock(self->mutex);
                          self->watching = false;
                          return;
                        }
                        self->make_room();
                      });
}

// A newcomer waits while max_connections are open: the keep-alive
// connection idle longest is closed, and its close resumes accepting. Found
// in review: the server only waited, so clients that kept more connections
// alive than the cap (a fleet's pools, or one client sending a cheap request
// on each every minute) left every new connection unanswered in the backlog.
// A connection with a request in flight is never cut; with none idle (or the
// chosen one busy again), look again after accept_backoff.
void server::impl::make_room() {
  // Every session locked here is let go after the mutex (found in review: a
  // session whose last other owner let go meanwhile was destroyed under the
  // lock, and its destructor's session_closed() locked it again).
  std::vector<std::shared_ptr<session>> alive;
  std::shared_ptr<session> idlest;
  {
    std::lock_guard lock(mutex);
    if (!paused || !accepting || stopped) {
      watching = false;
      return;
    }
    alive.reserve(sessions.size());
    for (const auto& w : sessions) {
      if (auto s = w.lock()) alive.push_back(std::move(s));
    }
  }
  // Only for a newcomer still waiting: an accept resumed meanwhile may have
  // taken the one this loop woke for (found in review).
  pollfd listening{acceptor.native_handle(), POLLIN, 0};
  if (::poll(&listening, 1, 0) == 1 && (listening.revents & POLLIN) != 0) {
    std::int64_t oldest = std::numeric_limits<std::int64_t>::max();
    for (const auto& s : alive) {
      const std::int64_t since = s->idle_since();
      if (since >= 0 && since < oldest) {
        oldest = since;
        idlest = s;
      }
    }
  }
  if (idlest) idlest->close_if_idle();
  cap_timer.expires_after(options.accept_backoff);
  cap_timer.async_wait([self = shared_from_this()](boost::beast::error_code ec) {
    if (ec) {
      std::lock_guard lock(self->mutex);
      self->watching = false;
      return;
    }
    self->wait_for_newcomer();
  });
}

void server::impl::session_closed() {
  std::lock_guard lock(mutex);
  --open;
  if (paused && accepting && !stopped) {
    paused = false;
    net::post(accept_strand, [self = shared_from_this()] { self->accept_next(); });
  }
}

namespace {

// max_connections as the descriptor limit leaves room for it. Found in
// review: with the cap above the limit (the default 1024 under a `ulimit -n`
// of 1024), connections held open and silent took every descriptor before
// the cap was reached. accept() then failed (EMFILE) and a newcomer waited
// for their timeouts, as nothing can be closed for it there; at the cap, the
// idlest connection makes room for it (make_room). HAProxy derives its
// maxconn from the limit the same way.
std::size_t connection_cap(std::size_t configured, std::size_t reserve) {
  if (configured == 0) return 0;  // no cap, as asked
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) {
    return configured;
  }
  const auto descriptors = static_cast<std::size_t>(limit.rlim_cur);
  if (descriptors <= reserve) {
    throw config_error("server: the file descriptor limit (ulimit -n) is " +
                       std::to_string(descriptors) + ", which leaves no room for connections " +
                       "beyond descriptor_reserve (" + std::to_string(reserve) +
                       "): raise the limit or lower the reserve");
  }
  const std::size_t room = descriptors - reserve;
  if (configured <= room) return configured;
  log(log_level::warning, "server: max_connections " + std::to_string(configured) + " lowered to " +
                              std::to_string(room) + ": the file descriptor limit (ulimit -n) is " +
                              std::to_string(descriptors) + ", and descriptor_reserve keeps " +
                              std::to_string(reserve) + " for the database and downstream calls");
  return room;
}

}  // namespace

server::server(server_options options, handler h) : impl_(std::make_shared<impl>()) {
  // Beast 1.74 keeps a header field's name and value lengths in 16 bits and
  // throws std::length_error from inside the parser for a longer one, which
  // ended the process from the io thread (found while testing a large
  // header_limit). Within this limit no field can be that long.
  if (options.header_limit == 0 || options.header_limit > max_header_limit) {
    throw config_error("server: header_limit must be 1 to " + std::to_string(max_header_limit) +
                       " bytes (Beast holds no longer header field)");
  }
  // Found in review: none of the clocks was checked. Zero cut every
  // connection off before its first byte (the server answered nothing), and
  // a huge one wrapped the timer's deadline into the past.
  for (const auto& [name, value] : {std::pair{"idle_timeout", options.idle_timeout},
                                    std::pair{"header_timeout", options.header_timeout},
                                    std::pair{"read_timeout", options.read_timeout},
                                    std::pair{"accept_backoff", options.accept_backoff}}) {
    if (value.count() <= 0 || value > std::chrono::hours{24 * 365}) {
      throw config_error(std::string("server: ") + name + " must be positive and at most a year");
    }
  }
  options.max_connections = connection_cap(options.max_connections, options.descriptor_reserve);
  impl_->options = std::move(options);
  impl_->on_request = std::move(h);
  boost::beast::error_code ec;
  const tcp::endpoint ep{net::ip::make_address(impl_->options.address, ec), impl_->options.port};
  if (ec) throw std::runtime_error("server: bad address " + impl_->options.address);
  impl_->acceptor.open(ep.protocol(), ec);
  if (!ec) impl_->acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) impl_->acceptor.bind(ep, ec);
  if (!ec) impl_->acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec)
    throw std::runtime_error("server: cannot listen on port " + std::to_string(ep.port()) + ": " +
                             ec.message());
}

server::~server() {
  // stop() throws only if locking the mutex or joining an io thread fails
  // (std::system_error). The threads may then still run on this state, so
  // there is no safe way on: say so and end, as an escaping exception would.
  try {
    stop();
  } catch (...) {
    std::fputs("orpheus::beast::server: stop() failed in the destructor\n", stderr);
    std::terminate();
  }
}

unsigned short server::port() const { return impl_->acceptor.local_endpoint().port(); }

std::size_t server::max_connections() const { return impl_->options.max_connections; }

void server::start() {
  impl_->work.emplace(impl_->ioc.get_executor());
  net::post(impl_->accept_strand, [i = impl_] { i->accept_next(); });
  const auto n = std::max<std::size_t>(1, impl_->options.io_threads);
  for (std::size_t i = 0; i < n; ++i) impl_->threads.emplace_back([i = impl_] { i->ioc.run(); });
}

std::size_t server::connections() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->open;
}

void server::stop_accepting() {
  {
    std::lock_guard lock(impl_->mutex);
    if (!impl_->accepting || impl_->stopped) return;
    impl_->accepting = false;
  }
  auto close = [i = impl_] {
    boost::beast::error_code ec;
    i->acceptor.close(ec);
    i->backoff.cancel();
    i->cap_timer.cancel();
  };
  if (impl_->threads.empty()) {
    close();
  } else {
    net::post(impl_->accept_strand, close);
  }
}

void server::stop() {
  std::vector<std::shared_ptr<session>> open;
  {
    std::lock_guard lock(impl_->mutex);
    if (impl_->stopped) return;
    impl_->stopped = true;  // from now on, answers are dropped, not posted
    impl_->accepting = false;
    for (auto& w : impl_->sessions) {
      if (auto s = w.lock()) open.push_back(std::move(s));
    }
    impl_->sessions.clear();
  }
  auto close_acceptor = [i = impl_] {
    boost::beast::error_code ec;
    i->acceptor.close(ec);
    i->backoff.cancel();
    i->cap_timer.cancel();
  };
  if (impl_->threads.empty()) {
    close_acceptor();  // never started: nothing else runs the loop
    for (const auto& s : open) s->close();
  } else {
    net::post(impl_->accept_strand, close_acceptor);
    for (const auto& s : open) net::post(s->executor(), [s] { s->close(); });
    impl_->work.reset();
    net::post(impl_->ioc, [i = impl_] { i->ioc.stop(); });
    for (auto& t : impl_->threads) t.join();
    impl_->threads.clear();
    impl_->ioc.restart();
  }
  // Run what the closes aborted (the pending accept, reads, writes), so their
  // handlers let go of the sessions and of this server's state. One poll()
  // was not enough: under load it could end stopped with handlers still
  // queued, and each one left held a session that holds this state (a
  // reference cycle LeakSanitizer reported at SIGTERM). Poll until idle.
  for (int round = 0; round < 1000; ++round) {
    impl_->ioc.restart();
    if (impl_->ioc.poll() == 0 && !impl_->ioc.stopped()) break;
  }
}

}  // namespace orpheus::beast
