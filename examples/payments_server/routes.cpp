#include "routes.hpp"

#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "create_payment.hpp"
#include "orpheus/beast/middleware.hpp"

namespace examples::payments_server {

namespace http = boost::beast::http;
using orpheus::beast::http_request;
using orpheus::beast::http_response;
using orpheus::beast::make_response;

namespace {

// GET /v1/payments/ID, on a pool thread: the caller's payment, or 404.
http_response find_payment(orpheus::store& store, const std::string& client,
                           const http_request& r) {
  const std::string id = std::string(r.target()).substr(13);
  std::size_t shard = 0;
  if (id.rfind("pay_", 0) == 0) shard = std::strtoul(id.c_str() + 4, nullptr, 10);
  if (shard >= store.shard_count()) {
    return make_response(404, R"({"error":"not found"})", "application/json");
  }
  // A shard prepared late (storage.hpp) gets its payments table before its
  // migrations, so one the library's schema check lets through has it; until
  // then this answers 503 (retry later), not "the table does not exist".
  // (Unless someone else migrates it first, e.g. orpheusctl migrate: then
  // for up to a second, until late_shards creates the table, a 500.)
  auto& backend = store.backend_for_records(shard);
  // Scoped to the caller: another client's payment is "not found". Compared
  // here too, byte for byte: MySQL's default collation ignores case, and
  // "Shop-1" and "shop-1" are two clients (found in review: one was served
  // the other's payment).
  // One read outside any transaction (found in review: on SQLite a GET was
  // a transaction, which took a turn on the one writer and waited for a
  // COMMIT, in the queue the payments' own writes use).
  const orpheus::sql_value params[] = {id, client};
  const auto rows = backend.read(shard,
                                 "SELECT id, amount, currency, customer, state, charge_id, client "
                                 "FROM payments WHERE id = ? AND client = ?",
                                 params);
  if (rows.empty() || rows[0].get<std::string>(0) != id || rows[0].get<std::string>(6) != client) {
    return make_response(404, R"({"error":"not found"})", "application/json");
  }
  const auto& row = rows[0];
  nlohmann::json j{{"id", row.get<std::string>(0)},
                   {"amount", row.get<std::int64_t>(1)},
                   {"currency", row.get<std::string>(2)},
                   {"customer", row.get<std::string>(3)},
                   {"status", row.get<std::string>(4)},
                   {"charge_id", row.is_null(5) ? "" : row.get<std::string>(5)}};
  return make_response(200, j.dump(), "application/json");
}

}  // namespace

orpheus::beast::handler routes(services s) {
  return [s](http_request&& req, orpheus::beast::responder respond) {
    const std::string target(req.target());
    if (req.method() == http::verb::post && target == "/v1/payments") {
      return create_payment(s.mw, s.payment_handler, std::move(req), respond);
    }
    if (req.method() == http::verb::get && target.rfind("/v1/payments/", 0) == 0) {
      auto client = s.who.client_of(req);
      if (!client) {
        return respond(s.mw.error_response(
            orpheus::error_info::of(orpheus::error_class::invalid_input,
                                    orpheus::codes::unauthenticated, "no caller identity"),
            {}));
      }
      return s.mw.run_blocking(
          std::move(req), respond,
          [&store = s.store, client = std::move(*client)](const http_request& r) {
            return find_payment(store, client, r);
          });
    }
    if (req.method() == http::verb::get && target == "/healthz")
      return respond(make_response(200, "ok\n"));
    if (s.inproc != nullptr && req.method() == http::verb::get && target == "/ledger") {
      return respond(make_response(200, s.inproc->ledger(), "application/json"));
    }
    if (req.method() == http::verb::get && target == "/metrics") {
      return respond(
          make_response(200, s.stats.text(), std::string(orpheus::prometheus::content_type)));
    }
    respond(make_response(404, "not found\n"));
  };
}

}  // namespace examples::payments_server
