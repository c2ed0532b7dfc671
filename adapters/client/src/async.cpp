#include "orpheus/client/async.hpp"

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace orpheus::client {

namespace net = boost::asio;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;

namespace {

// One attempt: connect, write, read, all before `timeout`. Throws
// transport_error like beast::send().
net::awaitable<http_response> send_once(const http_endpoint& to, http_request req,
                                        std::chrono::milliseconds timeout) {
  auto ex = co_await net::this_coro::executor;
  tcp::resolver resolver(ex);
  boost::beast::tcp_stream stream(ex);
  req.set(http::field::host, to.host + ":" + std::to_string(to.port));
  req.prepare_payload();
  bool connected = false;
  try {
    stream.expires_after(timeout);
    const auto endpoints =
        co_await resolver.async_resolve(to.host, std::to_string(to.port), net::use_awaitable);
    co_await stream.async_connect(endpoints, net::use_awaitable);
    connected = true;
    co_await http::async_write(stream, req, net::use_awaitable);
    boost::beast::flat_buffer buffer;
    http_response res;
    co_await http::async_read(stream, buffer, res, net::use_awaitable);
    co_return res;
  } catch (const boost::system::system_error& e) {
    const std::string what = "http://" + to.host + ":" + std::to_string(to.port) + ": " + e.what();
    if (e.code() == boost::beast::error::timeout)
      throw beast::transport_error(beast::transport_error::kind::timeout, what);
    throw beast::transport_error(
        connected ? beast::transport_error::kind::closed : beast::transport_error::kind::connect,
        what);
  }
}

}  // namespace

net::awaitable<call_result> async_send(const idempotent_client& api, const prepared_request& req) {
  const auto& o = api.options();
  retry_loop loop(o, req);
  for (;;) {
    std::optional<http_response> res;
    std::optional<beast::transport_error> failure;
    try {
      res = co_await send_once(api.server(), req.message(o.key_header), loop.attempt_timeout());
    } catch (const beast::transport_error& e) {
      failure = e;
    }
    const auto wait = loop.after(std::move(res), std::move(failure));
    if (!wait) co_return std::move(loop).result();
    if (o.time.sleep) {
      o.time.sleep(*wait);  // an injected sleeper (tests) decides time itself
    } else {
      net::steady_timer timer(co_await net::this_coro::executor, *wait);
      co_await timer.async_wait(net::use_awaitable);
    }
  }
}

}  // namespace orpheus::client
