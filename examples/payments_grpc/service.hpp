// The payments gRPC service: CreatePayment, made idempotent by orpheus::grpc
// with the HTTP server's phases (record the payment, charge it once at the
// bank, record the charge). Apart from main.cpp so that the tests can run it
// in their own process too.
#pragma once

#include "orpheus/grpc/unary.hpp"
#include "orpheus/payment/charge.hpp"
#include "payments.grpc.pb.h"

namespace examples::payments_grpc {

class payments_service final : public payments::v1::Payments::CallbackService {
 public:
  /// `idem`, `bank` and the manager behind `idem` must outlive the service.
  payments_service(orpheus::grpc::idempotent_unary& idem, orpheus::payment::gateway& bank)
      : idem_(idem), bank_(bank) {}

  grpc::ServerUnaryReactor* CreatePayment(grpc::CallbackServerContext* ctx,
                                          const payments::v1::CreatePaymentRequest* request,
                                          payments::v1::Payment* reply) override;

 private:
  orpheus::grpc::idempotent_unary& idem_;
  orpheus::payment::gateway& bank_;
};

}  // namespace examples::payments_grpc
