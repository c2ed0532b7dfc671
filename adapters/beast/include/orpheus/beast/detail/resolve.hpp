// A host name lookup bounded by a deadline, as an Asio asynchronous
// operation. Internal to orpheus::beast (http_client uses it with
// tcp::resolver); a header only so that its tests can drive it with a lookup
// that never ends.
//
// Why: Asio's async_resolve runs getaddrinfo() on a private thread, and
// neither a tcp_stream's expiry nor resolver::cancel() interrupts a lookup
// already running. A DNS server that does not answer held an attempt for the
// resolver's own timeouts (seconds to minutes), past the attempt's deadline
// (issue 7, defect 14). Here the lookup races a timer set to the same
// deadline as connect, write and read: whichever ends first completes the
// operation, the other is cancelled and its late completion ignored.
#pragma once

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp needs std::exchange

#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>

namespace orpheus::beast::detail {

/// Looks `host`/`service` up with `resolver`, completing with
/// (error_code, Resolver::results_type): the lookup's own result, or
/// boost::asio::error::timed_out when `deadline` passes first (the lookup is
/// then cancelled). `resolver` must outlive the operation's completion, not
/// the lookup itself: a lookup that ends later touches only shared state.
template <class Resolver, class Token>
auto async_resolve_before(Resolver& resolver, std::string host, std::string service,
                          std::chrono::steady_clock::time_point deadline, Token&& token) {
  using results_type = typename Resolver::results_type;
  using error_code = boost::system::error_code;
  using strand_type = boost::asio::strand<std::decay_t<decltype(resolver.get_executor())>>;
  return boost::asio::async_initiate<Token, void(error_code, results_type)>(
      [&resolver, deadline](auto handler, std::string h, std::string s) {
        using handler_type = decltype(handler);
        // Both completions run on one strand, so exactly one of them takes
        // the handler, whatever threads run the io_context.
        const strand_type strand(resolver.get_executor());
        struct state {
          state(handler_type hd, const strand_type& st) : handler(std::move(hd)), timer(st) {}
          std::optional<handler_type> handler;
          boost::asio::steady_timer timer;
        };
        auto st = std::make_shared<state>(std::move(handler), strand);
        auto finish = [st](error_code ec, results_type r) {
          if (!st->handler) return;  // the other side already finished
          auto hd = std::move(*st->handler);
          st->handler.reset();
          const auto ex = boost::asio::get_associated_executor(hd, st->timer.get_executor());
          boost::asio::dispatch(ex, [hd = std::move(hd), ec, r = std::move(r)]() mutable {
            std::move(hd)(ec, std::move(r));
          });
        };
        st->timer.expires_at(deadline);
        st->timer.async_wait(
            boost::asio::bind_executor(strand, [st, finish, &resolver](error_code ec) {
              if (ec == boost::asio::error::operation_aborted || !st->handler) return;
              resolver.cancel();  // the resolver is alive: its user still waits
              finish(boost::asio::error::timed_out, {});
            }));
        resolver.async_resolve(
            h, s, boost::asio::bind_executor(strand, [st, finish](error_code ec, results_type r) {
              st->timer.cancel();
              finish(ec, std::move(r));
            }));
      },
      token, std::move(host), std::move(service));
}

}  // namespace orpheus::beast::detail
