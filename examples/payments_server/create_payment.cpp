// POST /v1/payments, made idempotent: the middleware reads Idempotency-Key,
// fingerprints the request and runs the three phases below through
// orpheus::manager::process() (what each phase may do: docs/contract.md).
#include "create_payment.hpp"

#include <nlohmann/json.hpp>
#include <string>

#include "orpheus/beast/middleware.hpp"
#include "payment.hpp"

namespace examples::payments_server {

using orpheus::beast::http_request;

namespace {
constexpr const char* handler_name = "create_payment";
}  // namespace

// The RPC and Post-RPC, registered once: a payment whose client went away
// (or whose server was killed) is finished by the completer with these.
void register_create_payment(orpheus::manager& m, orpheus::payment::gateway& bank, metrics& stats) {
  m.register_handler<payment>(
      handler_name, 1,
      [&bank, &stats](const orpheus::attempt& a, const payment& p) {  // RPC
        if (a.is_retry()) stats.takeover();
        return orpheus::payment::charge_once(bank, a, {p.id, p.amount, p.currency});
      },
      [](orpheus::tx& tx, const orpheus::attempt&, const payment& p,
         const orpheus::outcome<std::string>& o) {  // Post-RPC
        if (!o.ok()) {
          tx.execute("UPDATE payments SET state = ? WHERE id = ?",
                     o.retryable() ? "pending" : o.error().code, p.id);
          return orpheus::problem_response(o.error());
        }
        tx.execute("UPDATE payments SET state = 'succeeded', charge_id = ? WHERE id = ?", o.value(),
                   p.id);
        nlohmann::json body = p;
        body["status"] = "succeeded";
        body["charge_id"] = o.value();
        return orpheus::response{201, {{"Content-Type", "application/json"}}, body.dump()};
      });
}

void create_payment(orpheus::beast::middleware& mw, http_request&& req,
                    const orpheus::beast::responder& respond) {
  const std::string client(req["X-Client-Id"]);
  mw.handle_named(handler_name, std::move(req), respond,
                  [client](orpheus::tx& tx, const http_request& r) {  // Pre-RPC
                    payment p = parse_payment(r);
                    // The payment id names its shard, so GET can find it.
                    p.id = "pay_" + std::to_string(tx.shard()) + "_" + orpheus::random_token(10);
                    tx.execute(
                        "INSERT INTO payments (id, client, amount, currency, customer, state) "
                        "VALUES (?, ?, ?, ?, ?, 'pending')",
                        p.id, client, p.amount, p.currency, p.customer);
                    return p;
                  });
}

}  // namespace examples::payments_server
