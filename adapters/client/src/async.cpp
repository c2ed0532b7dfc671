#include "orpheus/client/async.hpp"

#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/execution/outstanding_work.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/prefer.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <memory>

namespace orpheus::client {

namespace net = boost::asio;

namespace {

// One attempt through the client's http_client, as an Asio operation: the
// http_client calls back on its own io thread; the coroutine resumes on its
// own executor, which counts the attempt as outstanding work meanwhile (or
// its io_context's run() would return with the coroutine suspended).
template <class Token>
auto async_attempt(beast::http_client& http, const http_endpoint& to, http_request req,
                   std::chrono::milliseconds timeout, Token&& token) {
  return net::async_initiate<Token, void(beast::http_result)>(
      [&http, &to, timeout](auto handler, http_request&& r) {
        auto resume_on = net::prefer(net::get_associated_executor(handler),
                                     net::execution::outstanding_work.tracked);
        // std::function wants a copyable callback; the handler is move-only.
        auto shared = std::make_shared<decltype(handler)>(std::move(handler));
        http.async_send(to, std::move(r), timeout, [shared, resume_on](beast::http_result result) {
          net::post(resume_on, [shared, result = std::move(result)]() mutable {
            std::move (*shared)(std::move(result));
          });
        });
      },
      token, std::move(req));
}

}  // namespace

net::awaitable<call_result> async_send(const idempotent_client& api, const prepared_request& req) {
  const auto& o = api.options();
  retry_loop loop(o, req);
  for (;;) {
    auto attempt = co_await async_attempt(*o.http, api.server(), req.message(o.key_header),
                                          loop.attempt_timeout(), net::use_awaitable);
    const auto wait = loop.after(std::move(attempt.response), std::move(attempt.error));
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
