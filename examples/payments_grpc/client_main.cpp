// payments_grpc_client: one payment through payments_grpc_server, retried the
// safe way: the same idempotency key on every attempt, only what the server
// says may be retried, after the delay it asks for. See --help.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <optional>
#include <random>
#include <thread>

#include "../common/flags.hpp"
#include "orpheus/api_keys.hpp"
#include "orpheus/grpc/unary.hpp"
#include "orpheus/request.hpp"
#include "payments.grpc.pb.h"

namespace {
constexpr const char* usage =
    R"(payments_grpc_client: one payment through payments_grpc_server, with retries

Usage: payments_grpc_client --server HOST:PORT --amount N [flags]
  --server HOST:PORT  e.g. 127.0.0.1:50051
  --api-key KEY       sent as `authorization: Bearer KEY`; by default the
                      environment's ORPHEUS_API_KEY
  --amount N          minor units
  --currency C        (default EUR)
  --customer C        (default cus_1)
  --key K             the idempotency key (default: a new random one)
  --attempts N        attempt cap (default 8)
  --deadline-ms N     overall deadline, every attempt and wait (default 90000)

Prints the payment; exits 0 on OK, 1 on a final refusal, 2 on bad flags, 3
when it gave up without a final answer, or when a refusal does not say what
became of an earlier attempt that may have gone through (the key is printed
first: send again with --key to finish the same payment).
)";
}  // namespace

int main(int argc, char** argv) {
  examples::flags f(argc, argv, usage);
  const auto server = f.str("server", "");
  const char* env_key = std::getenv("ORPHEUS_API_KEY");
  const auto api_key = f.str("api-key", env_key != nullptr ? env_key : "");
  payments::v1::CreatePaymentRequest request;
  request.set_amount(f.num("amount", 0, 1, 1L << 53));
  request.set_currency(f.str("currency", "EUR"));
  request.set_customer(f.str("customer", "cus_1"));
  auto key = f.str("key", "");
  const long attempts = f.num("attempts", 8, 1, 1000);
  const long deadline_ms = f.millis("deadline-ms", 90'000, 1);
  f.done();
  if (server.empty() || api_key.empty() || request.amount() <= 0 || attempts < 1) {
    f.fail("--server, --api-key (or ORPHEUS_API_KEY) and --amount are required");
  }
  // gRPC 1.51 aborts the process on a metadata value that is not printable
  // ASCII (a CR, a tab); a key that is not a token68 is one no server's key
  // file holds. bearer_token() drops white space around the token: the key
  // must be the token, and nothing else.
  if (orpheus::bearer_token("Bearer " + api_key) != api_key) {
    f.fail("--api-key must be a bearer token: letters, digits and -._~+/, then = padding only");
  }
  // A proto3 string that is not UTF-8 serialises but does not parse: the
  // server's gRPC refuses it with a bare INTERNAL, which reads as "may have
  // run", so every attempt would fail and the payment end unsettled (found
  // in review). Refused here, before anything is sent.
  if (payments::v1::CreatePaymentRequest back; !back.ParseFromString(request.SerializeAsString())) {
    f.fail("--currency and --customer must be UTF-8 text");
  }
  // An attempt that may have reached the server (no answer, UNAVAILABLE
  // while another attempt held the key or the store was away), or a run before this one
  // (--key): a later refusal that is not the server's record (an expired
  // token, a proxy's error) does not say what became of it.
  bool in_doubt = !key.empty();
  if (const auto why = key.empty() ? std::nullopt : orpheus::invalid_key_reason(key)) {
    f.fail("--key: " + *why);  // refused here, not by the server run after run
  }
  if (key.empty()) key = "pay-" + orpheus::random_token(16);
  std::cout << "key " << key << std::endl;  // before the first send

  const auto stub = payments::v1::Payments::NewStub(
      grpc::CreateChannel(server, grpc::InsecureChannelCredentials()));
  std::mt19937_64 rng(std::random_device{}());
  auto backoff = std::chrono::milliseconds(100);
  // One deadline over every attempt and wait (found in review: a server's
  // RetryInfo of up to a day per attempt could hold the client for days).
  const auto give_up_at = std::chrono::steady_clock::now() + std::chrono::milliseconds(deadline_ms);
  for (long n = 1; n <= attempts; ++n) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("idempotency-key", orpheus::key_header_value(key));  // quoted if need be
    ctx.AddMetadata("authorization", "Bearer " + api_key);
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        give_up_at - std::chrono::steady_clock::now());
    ctx.set_deadline(
        std::chrono::system_clock::now() +
        std::clamp(left, std::chrono::milliseconds(1), std::chrono::milliseconds(30000)));
    payments::v1::Payment reply;
    const grpc::Status s = stub->CreatePayment(&ctx, request, &reply);
    if (s.ok()) {
      const auto& md = ctx.GetServerInitialMetadata();
      const bool replayed = md.find("idempotent-replayed") != md.end();
      std::cout << "payment " << reply.id() << " " << reply.status() << " charge "
                << reply.charge_id() << (replayed ? " (replayed)" : "") << "\nattempts " << n
                << "\n";
      return 0;
    }
    std::cerr << "attempt " << n << ": " << s.error_code() << " " << s.error_message() << "\n";
    if (!orpheus::grpc::may_retry(s)) {
      const auto& md = ctx.GetServerInitialMetadata();
      if (in_doubt && md.find("idempotent-replayed") == md.end()) {
        std::cout << "unsettled: an earlier attempt may have gone through; send again later "
                     "with --key "
                  << key << "\n";
        return 3;
      }
      return 1;
    }
    in_doubt = in_doubt || s.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED;
    // Full jitter under the cap; never sooner than the server asks.
    auto wait =
        std::chrono::milliseconds(std::uniform_int_distribution<long>(0, backoff.count())(rng));
    if (const auto asked = orpheus::grpc::retry_delay_of(s)) wait = std::max(wait, *asked);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(5000));
    // An attempt needs a useful time: one left with a millisecond would
    // only time out, and leave the key in doubt.
    if (std::chrono::steady_clock::now() + wait + std::chrono::milliseconds(500) >= give_up_at) {
      std::cout << "gave up: the next attempt would be past --deadline-ms; send again later "
                   "with --key "
                << key << "\n";
      return 3;
    }
    std::this_thread::sleep_for(wait);
  }
  std::cout << "gave up after " << attempts << " attempts\n";
  return 3;
}
