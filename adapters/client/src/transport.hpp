// One HTTP attempt of the client helper, and the io thread of the sync form.
// Private to orpheus::client: async.cpp and client.cpp share it, so both
// forms bound an attempt the same way.
#pragma once

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp needs std::exchange

#include <boost/asio/awaitable.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <thread>

#include "orpheus/client/client.hpp"

namespace orpheus::client::detail {

/// Looks the host up, connects, writes `req` and reads the answer, all before
/// `timeout` has passed: one deadline for the whole exchange, the lookup
/// included (issue 7, defect 14). Sets Host and Content-Length. Throws
/// beast::transport_error like beast::send(): `connect` when nothing was sent
/// (lookup failed, connection refused), `timeout`, `closed`.
boost::asio::awaitable<http_response> send_once(const http_endpoint& to, http_request req,
                                                std::chrono::milliseconds timeout);

/// An io_context with one thread, owned by a sync idempotent_client (and its
/// copies). Why not an io_context per call: a host name lookup that outlives
/// its deadline still runs in Asio's resolver thread, and destroying the
/// io_context waits for it, so a per-call io_context would make the caller
/// wait for the lookup after all. Here only the client's destruction does.
class io_runner {
 public:
  io_runner();
  io_runner(const io_runner&) = delete;
  io_runner& operator=(const io_runner&) = delete;
  ~io_runner();
  /// Runs send_once() on the io thread and waits for it.
  http_response send(const http_endpoint& to, http_request req, std::chrono::milliseconds timeout);

 private:
  boost::asio::io_context ioc_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_;
  std::thread thread_;
};

}  // namespace orpheus::client::detail
