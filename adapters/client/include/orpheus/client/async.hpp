// The Asio C++20 coroutine form of idempotent_client::send(): the same
// retry_loop, with non-blocking I/O and timers.
//
//   boost::asio::co_spawn(ioc, [&]() -> boost::asio::awaitable<void> {
//     const auto result = co_await orpheus::client::async_send(api, req);
//     ...
//   }, boost::asio::detached);
#pragma once

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp needs std::exchange

#include <boost/asio/awaitable.hpp>

#include "orpheus/client/client.hpp"

namespace orpheus::client {

/// Sends `req` through `api`'s server, policy and budget until a final answer
/// or a stop, suspending (not blocking) between attempts. `api` and `req`
/// must outlive the coroutine.
boost::asio::awaitable<call_result> async_send(const idempotent_client& api,
                                               const prepared_request& req);

}  // namespace orpheus::client
