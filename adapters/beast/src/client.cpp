#include <utility>  // before Asio: Boost 1.74's awaitable.hpp needs std::exchange

#include "orpheus/beast/client.hpp"

#include <fcntl.h>
#include <sys/socket.h>

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
  url = url.substr(0, url.find('/'));
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

// An open connection to one endpoint. Touched only on the io thread.
struct connection {
  explicit connection(net::io_context& ioc) : stream(ioc), idle_timer(ioc) {}
  boost::beast::tcp_stream stream;
  boost::beast::flat_buffer buffer;
  net::steady_timer idle_timer;
  // Bumped whenever the connection leaves the pool, so that an idle timer
  // that fires late cannot close a connection in use again.
  std::uint64_t idle_turn = 0;
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
  if (is_timeout(ec)) return {transport_error::kind::timeout, what};
  if (s == stage::lookup || s == stage::connect) return {transport_error::kind::connect, what};
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
    const auto n = ::recv(c.stream.socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }
}

}  // namespace

struct http_client::impl {
  explicit impl(http_client_options o) : options(o) {}

  net::io_context ioc;  // first: destroyed last, after what runs on it
  http_client_options options;
  net::executor_work_guard<net::io_context::executor_type> work{net::make_work_guard(ioc)};
  std::thread thread;

  // The io thread's alone.
  bool stopping = false;
  std::unordered_map<std::string, endpoint_pool> pools;  // by "host:port"
  std::unordered_set<connection*> live;                  // every open connection
  std::unordered_set<tcp::resolver*> lookups_running;
  std::unordered_map<std::string, cached_lookup> lookups;

  // Any thread: the calls started and not yet called back.
  std::mutex m;
  std::condition_variable idle_cv;
  std::size_t in_flight = 0;

  net::awaitable<http_response> call(http_endpoint to, http_request req,
                                     steady::time_point deadline, delivery d);
  net::awaitable<connection_ptr> acquire(endpoint_pool& pool, const std::string& where,
                                         steady::time_point deadline);
  net::awaitable<connection_ptr> open(const http_endpoint& to, const std::string& where,
                                      steady::time_point deadline);
  void give_back(endpoint_pool& pool, connection_ptr c);
  void close(connection& c);
  void shutdown();
};

// One call, top to bottom. It holds one of the endpoint's connection slots
// from step 1 to step 5, whether or not a connection is open in it.
net::awaitable<http_response> http_client::impl::call(http_endpoint to, http_request req,
                                                      steady::time_point deadline, delivery d) {
  const std::string host_port = to.host + ":" + std::to_string(to.port);
  const std::string where = "http://" + host_port;
  req.set(http::field::host, host_port);
  req.prepare_payload();
  auto& pool = pools[host_port];  // unordered_map: references survive rehashing

  // 1. A pooled connection still open, or a free slot to open one (waiting
  //    for either within the deadline).
  connection_ptr c = co_await acquire(pool, where, deadline);
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
      //    for delivery::idempotent, only when it was a reused connection
      //    and not a byte of the answer came back.
      http::response_parser<http::string_body> parser;
      if (req.method() == http::verb::head) parser.skip(true);
      co_await http::async_read(c->stream, c->buffer, parser,
                                net::redirect_error(net::use_awaitable, ec));
      if (ec) {
        const bool nothing_back = !parser.got_some() && c->buffer.size() == 0;
        close(*c);
        c.reset();
        if (reused && nothing_back && d == delivery::idempotent && !stopping && !is_timeout(ec))
          continue;
        throw failure(where, stage::read, ec);
      }
      auto res = parser.release();

      // 5. Back to the pool only after a complete answer that allows it:
      //    not HTTP/1.0 or Connection: close, not delimited by EOF, nothing
      //    unread behind it.
      if (res.need_eof() || !req.keep_alive() || c->buffer.size() != 0 || stopping) {
        close(*c);
        c.reset();
      }
      give_back(pool, std::move(c));
      co_return res;
    }
  } catch (...) {
    if (c) close(*c);
    give_back(pool, nullptr);
    throw;
  }
}

net::awaitable<connection_ptr> http_client::impl::acquire(endpoint_pool& pool,
                                                          const std::string& where,
                                                          steady::time_point deadline) {
  if (stopping) throw shutting_down(where);
  // Idle connections, the most recently used first; one found closed by the
  // server is replaced, and nothing was sent on it (rule 1).
  while (!pool.idle.empty()) {
    auto c = std::move(pool.idle.back());
    pool.idle.pop_back();
    ++c->idle_turn;
    c->idle_timer.cancel();
    if (still_open(*c)) co_return c;
    close(*c);
    --pool.open;
  }
  if (pool.open < options.max_connections_per_endpoint) {
    ++pool.open;
    co_return nullptr;
  }
  // At the limit: wait in line for a connection or a slot given back.
  auto w = std::make_shared<waiter>(ioc);
  w->timer.expires_at(deadline);
  pool.waiters.push_back(w);
  error_code ec;
  co_await w->timer.async_wait(net::redirect_error(net::use_awaitable, ec));
  if (w->granted) {
    if (w->conn && !still_open(*w->conn)) {
      close(*w->conn);
      w->conn.reset();  // keep the slot: open a new connection in it
    }
    co_return std::move(w->conn);
  }
  std::erase(pool.waiters, w);
  if (stopping) throw shutting_down(where);
  throw transport_error(transport_error::kind::timeout,
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
  if (stopping) throw shutting_down(where);
  auto c = std::make_shared<connection>(ioc);
  live.insert(c.get());
  c->stream.expires_at(deadline);
  ec = {};
  co_await c->stream.async_connect(addresses, net::redirect_error(net::use_awaitable, ec));
  if (ec) {
    close(*c);
    throw failure(where, stage::connect, ec);
  }
  c->stream.socket().set_option(tcp::no_delay(true), ec);  // one small request, one answer
  // Asio opens sockets without SOCK_CLOEXEC: a kept-alive connection
  // inherited by a spawned process would outlive our close() there.
  ::fcntl(c->stream.socket().native_handle(), F_SETFD, FD_CLOEXEC);
  co_return c;
}

// `c`: a reusable connection, or null when the call's slot is free again.
// The first waiter gets either; otherwise a connection goes idle.
void http_client::impl::give_back(endpoint_pool& pool, connection_ptr c) {
  if (!pool.waiters.empty()) {
    auto w = std::move(pool.waiters.front());
    pool.waiters.pop_front();
    w->granted = true;
    w->conn = std::move(c);
    w->timer.cancel();
    return;
  }
  if (!c) {
    --pool.open;
    return;
  }
  c->idle_timer.expires_after(options.idle_timeout);
  c->idle_timer.async_wait([this, &pool, c, turn = c->idle_turn](const error_code& ec) {
    if (ec || c->idle_turn != turn || stopping) return;
    std::erase(pool.idle, c);
    close(*c);
    --pool.open;
  });
  pool.idle.push_back(std::move(c));
}

void http_client::impl::close(connection& c) {
  live.erase(&c);
  c.idle_timer.cancel();
  c.stream.close();  // what is pending on it completes with operation_aborted
}

// On the io thread: every call still running ends soon after this.
void http_client::impl::shutdown() {
  stopping = true;
  for (auto* c : std::vector<connection*>(live.begin(), live.end())) close(*c);
  for (auto* r : lookups_running) r->cancel();
  for (auto& [host_port, pool] : pools) {
    pool.idle.clear();
    for (auto& w : pool.waiters) w->timer.cancel();
  }
}

http_client::http_client(http_client_options options) : impl_(std::make_unique<impl>(options)) {
  if (options.max_connections_per_endpoint == 0)
    throw config_error("http_client_options: max_connections_per_endpoint is 0");
  impl_->thread = std::thread([i = impl_.get()] { i->ioc.run(); });
}

http_client::~http_client() {
  net::post(impl_->ioc, [i = impl_.get()] { i->shutdown(); });
  {
    std::unique_lock lock(impl_->m);
    impl_->idle_cv.wait(lock, [&] { return impl_->in_flight == 0; });
  }
  impl_->work.reset();
  impl_->ioc.stop();
  impl_->thread.join();
}

void http_client::async_send(const http_endpoint& to, http_request req,
                             std::chrono::milliseconds timeout,
                             std::function<void(http_result)> done, delivery d) {
  const auto deadline = steady::now() + timeout;
  {
    const std::lock_guard lock(impl_->m);
    ++impl_->in_flight;
  }
  net::co_spawn(
      impl_->ioc, impl_->call(to, std::move(req), deadline, d),
      [i = impl_.get(), done = std::move(done)](const std::exception_ptr& e, http_response res) {
        http_result r;
        if (!e) {
          r.response = std::move(res);
        } else {
          try {
            std::rethrow_exception(e);
          } catch (const transport_error& te) {
            r.error = te;
          } catch (const std::exception& other) {
            // Not an I/O error (bad_alloc, say): nothing says what
            // the server saw, so in doubt.
            r.error = transport_error(transport_error::kind::closed, other.what());
          }
        }
        done(std::move(r));
        const std::lock_guard lock(i->m);
        if (--i->in_flight == 0) i->idle_cv.notify_all();
      });
}

http_response http_client::send(const http_endpoint& to, http_request req,
                                std::chrono::milliseconds timeout, delivery d) {
  if (impl_->ioc.get_executor().running_in_this_thread())
    throw std::logic_error("http_client::send() on its own io thread would wait for itself");
  std::promise<http_result> result;
  auto answer = result.get_future();
  async_send(
      to, std::move(req), timeout, [&result](http_result r) { result.set_value(std::move(r)); }, d);
  auto r = answer.get();
  if (r.error) throw std::move(*r.error);
  return std::move(*r.response);
}

http_response send(const http_endpoint& to, http_request req, std::chrono::milliseconds timeout) {
  static http_client shared;
  return shared.send(to, std::move(req), timeout);
}

}  // namespace orpheus::beast
