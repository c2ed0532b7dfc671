// POST /v1/payments, the one idempotent endpoint: its three phases.
#pragma once

#include <string_view>

#include "gateway.hpp"
#include "orpheus/beast/server.hpp"
#include "orpheus/manager.hpp"

namespace orpheus::beast {
class middleware;
}

namespace examples::payments_server {

/// The registered handlers' names: a payment's record keeps the one it was
/// made with, and is resumed only with it (a payment in one charge is never
/// resumed in steps, nor the other way round).
inline constexpr std::string_view single_handler = "create_payment";
inline constexpr std::string_view steps_handler = "create_payment_steps";

/// Registers the charge (RPC) and its record (Post-RPC) with the manager, so
/// that a completer can finish a payment whose client went away. Once,
/// before serving.
void register_create_payment(orpheus::manager& m, orpheus::payment::gateway& bank);

/// The same payment in three recorded steps against the bank simulator's
/// two-step API: authorise (compensated by a void), capture (the pivot),
/// notify the bank's ledger. Registered as steps_handler.
void register_create_payment_in_steps(orpheus::manager& m, bank_gateway& bank);

/// Records the payment, charges it at the bank once, records the charge and
/// answers 201 (or the classified error), through the middleware: a retry
/// with the same Idempotency-Key is answered the same, and charged once.
void create_payment(orpheus::beast::middleware& mw, std::string_view handler,
                    orpheus::beast::http_request&& req, const orpheus::beast::responder& respond);

}  // namespace examples::payments_server
