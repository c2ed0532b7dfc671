#include "service.hpp"

#include <algorithm>
#include <string>

#include "../payments_server/payment.hpp"
#include "orpheus/error.hpp"
#include "orpheus/request.hpp"

namespace examples::payments_grpc {

using examples::payments_server::payment;

namespace {

// The request as a payment, or INVALID_ARGUMENT (nothing recorded).
payment payment_of(const payments::v1::CreatePaymentRequest& r) {
  const auto& currency = r.currency();
  const bool letters =
      currency.size() == 3 && std::all_of(currency.begin(), currency.end(), [](char c) {
        return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z');
      });
  if (r.amount() <= 0 || !letters || r.customer().empty() || r.customer().size() > 64) {
    throw orpheus::bad_input_error(orpheus::codes::invalid_request,
                                   "want amount > 0, a three-letter currency and a customer of 1 "
                                   "to 64 bytes");
  }
  return payment{"", r.amount(), currency, r.customer()};
}

}  // namespace

grpc::ServerUnaryReactor* payments_service::CreatePayment(
    grpc::CallbackServerContext* ctx, const payments::v1::CreatePaymentRequest* request,
    payments::v1::Payment* reply) {
  return idem_.handle(
      "/payments.v1.Payments/CreatePayment", ctx, request, reply,
      [](orpheus::tx& tx, const payments::v1::CreatePaymentRequest& r,
         const orpheus::request_id& id) {  // Pre-RPC
        payment p = payment_of(r);
        p.id = "pay_" + std::to_string(tx.shard()) + "_" + orpheus::random_token(10);
        tx.execute(
            "INSERT INTO payments (id, client, amount, currency, customer, state) "
            "VALUES (?, ?, ?, ?, ?, 'pending')",
            p.id, id.scope.substr(id.scope.find(':') + 1), p.amount, p.currency, p.customer);
        return p;
      },
      [this](const orpheus::attempt& a, const payment& p) {  // RPC: the bank, once
        return orpheus::payment::charge_once(bank_, a, {p.id, p.amount, p.currency});
      },
      [](orpheus::tx& tx, const orpheus::attempt&, const payment& p,
         const orpheus::outcome<std::string>& charged) {  // Post-RPC, on every outcome
        payments::v1::Payment out;
        if (!charged.ok()) {  // the row says why; the library records the failure
          tx.execute("UPDATE payments SET state = ? WHERE id = ?",
                     charged.retryable() ? "pending" : charged.error().code, p.id);
          return out;
        }
        tx.execute("UPDATE payments SET state = 'succeeded', charge_id = ? WHERE id = ?",
                   charged.value(), p.id);
        out.set_id(p.id);
        out.set_amount(p.amount);
        out.set_currency(p.currency);
        out.set_customer(p.customer);
        out.set_status("succeeded");
        out.set_charge_id(charged.value());
        return out;
      });
}

}  // namespace examples::payments_grpc
