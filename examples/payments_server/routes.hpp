// The payments server's routes: which request goes where.
//   POST /v1/payments      create_payment() (create_payment.cpp), idempotent
//   GET /v1/payments/ID    the caller's payment, or 404 (401 without a caller)
//   GET /healthz           200 ok
//   GET /metrics           Prometheus text format
//   GET /ledger            (--bank inproc only) the in-process bank's ledger
//   anything else          404
#pragma once

#include "callers.hpp"
#include "gateway.hpp"
#include "metrics.hpp"
#include "orpheus/beast/server.hpp"
#include "orpheus/store.hpp"

namespace orpheus::beast {
class middleware;
}

namespace examples::payments_server {

/// What the routes use; all of it must outlive the server.
struct services {
  orpheus::beast::middleware& mw;
  const callers& who;
  orpheus::store& store;
  inproc_bank* inproc;  ///< set with --bank inproc: serves GET /ledger
  metrics& stats;
  /// The registered handler new payments go to (create_payment.hpp).
  std::string_view payment_handler;
};

/// The server's handler: answers every request through the routes above.
[[nodiscard]] orpheus::beast::handler routes(services s);

}  // namespace examples::payments_server
