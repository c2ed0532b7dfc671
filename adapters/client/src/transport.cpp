#include "transport.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "orpheus/client/detail/resolve.hpp"

namespace orpheus::client::detail {

namespace net = boost::asio;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;

net::awaitable<http_response> send_once(const http_endpoint& to, http_request req,
                                        std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto ex = co_await net::this_coro::executor;
  boost::beast::tcp_stream stream(ex);
  req.set(http::field::host, to.host + ":" + std::to_string(to.port));
  req.prepare_payload();
  bool connected = false;
  try {
    // The lookup used to run before (sync form: blocking) or outside (async
    // form: tcp_stream's expiry does not cover a resolver) the deadline.
    tcp::resolver resolver(ex);
    const auto endpoints = co_await async_resolve_before(resolver, to.host, std::to_string(to.port),
                                                         deadline, net::use_awaitable);
    stream.expires_at(deadline);
    co_await stream.async_connect(endpoints, net::use_awaitable);
    connected = true;
    co_await http::async_write(stream, req, net::use_awaitable);
    boost::beast::flat_buffer buffer;
    http_response res;
    co_await http::async_read(stream, buffer, res, net::use_awaitable);
    co_return res;
  } catch (const boost::system::system_error& e) {
    const std::string what = "http://" + to.host + ":" + std::to_string(to.port) + ": " + e.what();
    if (e.code() == boost::beast::error::timeout || e.code() == net::error::timed_out)
      throw beast::transport_error(beast::transport_error::kind::timeout, what);
    throw beast::transport_error(
        connected ? beast::transport_error::kind::closed : beast::transport_error::kind::connect,
        what);
  }
}

io_runner::io_runner() : work_(net::make_work_guard(ioc_)), thread_([this] { ioc_.run(); }) {}

io_runner::~io_runner() {
  work_.reset();
  ioc_.stop();
  thread_.join();
}

http_response io_runner::send(const http_endpoint& to, http_request req,
                              std::chrono::milliseconds timeout) {
  // `to` outlives the wait below, so the coroutine may hold a reference.
  auto done = net::co_spawn(ioc_, send_once(to, std::move(req), timeout), net::use_future);
  return done.get();  // rethrows the transport_error
}

}  // namespace orpheus::client::detail
