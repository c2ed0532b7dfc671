#include "orpheus/client/async.hpp"

#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "transport.hpp"

namespace orpheus::client {

namespace net = boost::asio;

net::awaitable<call_result> async_send(const idempotent_client& api, const prepared_request& req) {
  const auto& o = api.options();
  retry_loop loop(o, req);
  for (;;) {
    std::optional<http_response> res;
    std::optional<beast::transport_error> failure;
    try {
      res = co_await detail::send_once(api.server(), req.message(o.key_header),
                                       loop.attempt_timeout());
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
