// POST /v1/payments, made idempotent: the middleware reads Idempotency-Key,
// fingerprints the request and runs the three phases below through
// orpheus::manager::process() (what each phase may do: docs/contract.md).
#include "create_payment.hpp"

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>

#include "callers.hpp"
#include "orpheus/beast/middleware.hpp"
#include "orpheus/log.hpp"
#include "orpheus/steps.hpp"
#include "payment.hpp"

namespace examples::payments_server {

using orpheus::beast::http_request;

// The RPC and Post-RPC, registered once: a payment whose client went away
// (or whose server was killed) is finished by the completer with these.
void register_create_payment(orpheus::manager& m, orpheus::payment::gateway& bank) {
  m.register_handler<payment>(
      std::string(single_handler), 1,
      [&bank](const orpheus::attempt& a, const payment& p) {  // RPC
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

// The card payment in steps: authorise (undone by a void), capture (the
// pivot: from here on the payment only goes forward), tell the ledger.
// Each step's result is recorded as it finishes; a retry, or the completer,
// resumes at the first unfinished step (docs/steps.md).
void register_create_payment_in_steps(orpheus::manager& m, bank_gateway& bank) {
  // Each bank call gets what is left of the attempt's deadline; with none
  // left it is not sent (orpheus::payment::time_left).
  using orpheus::payment::time_left;
  orpheus::steps<payment> flow;
  flow.step("authorise",
            [&bank](const orpheus::attempt& a, const payment& p, const orpheus::step_results&) {
              return bank.authorise(a.downstream_key("authorise"), {p.id, p.amount, p.currency},
                                    time_left(a));
            })
      .compensate(
          [&bank](const orpheus::attempt& a, const payment&, const std::string& authorisation) {
            bank.void_authorisation(a.downstream_key("void"), authorisation, time_left(a));
          })
      .step("capture",
            [&bank](const orpheus::attempt& a, const payment&, const orpheus::step_results& done) {
              return bank.capture(a.downstream_key("capture"), done.get<std::string>("authorise"),
                                  time_left(a));
            })
      .pivot()
      .post([](orpheus::tx& tx, const orpheus::attempt&, const payment& p,
               const std::string& charge_id) {
        tx.execute("UPDATE payments SET state = 'captured', charge_id = ? WHERE id = ?", charge_id,
                   p.id);
      })
      .step(
          "notify",
          [&bank](const orpheus::attempt& a, const payment& p, const orpheus::step_results& done) {
            return bank.notify(a.downstream_key("notify"), p.id, done.get<std::string>("capture"),
                               time_left(a));
          })
      .respond([](orpheus::tx& tx, const orpheus::attempt& a, const payment& p,
                  const orpheus::step_results& done) {
        tx.execute("UPDATE payments SET state = 'succeeded' WHERE id = ?", p.id);
        // scripts/demo counts these: payments nobody was waiting for.
        if (a.by_completer()) {
          orpheus::log(orpheus::log_level::info, "the completer finished payment " + p.id);
        }
        nlohmann::json body = p;
        body["status"] = "succeeded";
        body["charge_id"] = done.get<std::string>("capture");
        return orpheus::response{201, {{"Content-Type", "application/json"}}, body.dump()};
      })
      .on_failure([](orpheus::tx& tx, const orpheus::attempt&, const payment& p,
                     const orpheus::error_info& e) {
        tx.execute("UPDATE payments SET state = ? WHERE id = ?", e.code, p.id);
        return orpheus::problem_response(e);
      });
  m.register_handler(std::string(steps_handler), 1, std::move(flow));
}

void create_payment(orpheus::beast::middleware& mw, std::string_view handler, http_request&& req,
                    const orpheus::beast::responder& respond) {
  mw.handle_named(std::string(handler), std::move(req), respond,
                  [](orpheus::tx& tx, const http_request& r,
                     const orpheus::request_id& id) {  // Pre-RPC
                    const auto client = callers::client_of_scope(id.scope);
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
