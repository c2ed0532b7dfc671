// Wrapping an existing Beast handler with Orpheus. The handler below stands
// for code you already have: it calls a payment gateway and builds a Beast
// response. Wrapped, a retried request is charged once and answered the same.
#include <atomic>
#include <filesystem>
#include <iostream>

#include "orpheus/beast/client.hpp"
#include "orpheus/beast/middleware.hpp"
#include "orpheus/store/sqlite.hpp"

namespace http = boost::beast::http;
using orpheus::beast::http_request;
using orpheus::beast::http_response;

std::atomic<int> gateway_charges{0};

// The existing handler: network work only, given a key to pass downstream.
http_response charge_card(const http_request& req, const std::string& gateway_key) {
  (void)gateway_key;  // a real one sends it to the gateway as its idempotency key
  const int n = ++gateway_charges;
  return orpheus::beast::make_response(
      201, "charged " + std::string(req.body()) + " as ch_" + std::to_string(n), "text/plain");
}

int main() {
  for (const char* f : {"wrap_example.db", "wrap_example.db-wal", "wrap_example.db-shm"}) {
    std::filesystem::remove(f);  // a fresh start on every run
  }
  orpheus::sqlite_store store({.path = "wrap_example.db"});
  store.migrate();
  orpheus::manager manager(store);
  orpheus::work_pool pool(4, 64);
  orpheus::beast::middleware_options options;
  options.scope = [](const http_request& r) {
    return std::optional<std::string>(r["X-Client-Id"]);
  };
  orpheus::beast::middleware mw(manager, pool, std::move(options));

  orpheus::beast::server server({}, [&](http_request&& req, orpheus::beast::responder respond) {
    /// [wrap]
    // One lambda: the handler runs as the RPC phase, once per key; its
    // answer is recorded and replayed, except a "try again" one (408, 409,
    // 425, 429 or a 5xx other than 501), which leaves the key to the
    // client's retry. With database work to do before
    // or after the call, pass Pre-RPC, RPC and Post-RPC instead.
    mw.handle(std::move(req), respond, [](const orpheus::attempt& a, const http_request& r) {
      return charge_card(r, a.downstream_key("charge"));
    });
    /// [wrap]
  });
  server.start();

  // A client sends the same request twice, as after a lost answer.
  for (int i = 0; i < 2; ++i) {
    http_request req{http::verb::post, "/pay", 11};
    req.set("X-Client-Id", "shop-1");
    req.set("Idempotency-Key", "order-77");
    req.body() = "12.50 EUR";
    const auto res =
        orpheus::beast::send({"127.0.0.1", server.port()}, req, std::chrono::seconds(5));
    std::cout << res.result_int() << (res["Idempotent-Replayed"] == "true" ? " (replayed) " : " ")
              << res.body() << "\n";
  }
  std::cout << "gateway charges: " << gateway_charges << "\n";
  // The pool's jobs use the middleware: drain it before `mw` goes out of
  // scope (declared after the pool, it is destroyed first).
  server.stop_accepting();
  pool.drain();
  server.stop();
  return gateway_charges == 1 ? 0 : 1;
}
