// POST /v1/payments, the one idempotent endpoint: its three phases.
#pragma once

#include "gateway.hpp"
#include "metrics.hpp"
#include "orpheus/beast/server.hpp"

namespace orpheus::beast {
class middleware;
}

namespace examples::payments_server {

/// Records the payment, charges it at the bank once, records the charge and
/// answers 201 (or the classified error), through the middleware: a retry
/// with the same Idempotency-Key is answered the same, and charged once.
void create_payment(orpheus::beast::middleware& mw, orpheus::payment::gateway& bank, metrics& stats,
                    orpheus::beast::http_request&& req, const orpheus::beast::responder& respond);

}  // namespace examples::payments_server
