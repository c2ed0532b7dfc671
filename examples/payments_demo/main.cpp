// Sends payments to payments_server the way a careful client does (one key
// per payment, kept across retries, Retry-After honoured, 4xx never retried),
// double-clicks some of them, then asks the bank how often it charged.
// See --help. Exits 1 if any payment was charged twice.
#include <atomic>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "../common/flags.hpp"
#include "orpheus/beast/client.hpp"

namespace {

constexpr const char* usage = R"(payments_demo: drive payments_server and count charges at the bank

Usage: payments_demo --server URL --bank URL [flags]
  --server URL        the payments server, e.g. http://127.0.0.1:8080
  --bank URL          the bank simulator behind it (for its ledger)
  --payments N        logical payments to make (default 300)
  --concurrency N     clients sending at once (default 8)
  --resend-rate R     share of payments sent once more after their answer,
                      as a double click would (default 0.3)
)";

namespace http = boost::beast::http;
using orpheus::beast::http_request;
using orpheus::beast::http_response;

struct totals {
  std::atomic<long> attempts{0}, replays{0}, succeeded{0}, declined{0}, gave_up{0}, mismatched{0};
};

// One logical payment: the same key and the same bytes on every attempt.
http_response send_payment(const orpheus::beast::http_endpoint& server, const std::string& key,
                           const std::string& client, const std::string& body, totals& t) {
  std::mt19937_64 rng{std::random_device{}()};
  auto backoff = std::chrono::milliseconds(20);
  for (int attempt = 1; attempt <= 30; ++attempt) {
    ++t.attempts;
    http_request req{http::verb::post, "/v1/payments", 11};
    req.set("X-Client-Id", client);
    req.set("Idempotency-Key", key);
    req.set(http::field::content_type, "application/json");
    req.body() = body;
    std::chrono::milliseconds wait = backoff;
    try {
      auto res = orpheus::beast::send(server, std::move(req), std::chrono::seconds(10));
      const unsigned s = res.result_int();
      if (s != 409 && s != 429 && (s < 500 || s == 501)) return res;  // final
      if (const auto ra = res[http::field::retry_after]; !ra.empty()) {
        wait = std::max(wait, std::chrono::milliseconds(std::stol(std::string(ra)) * 1000));
      }
    } catch (const orpheus::beast::transport_error&) {
      // Unknown outcome: retry with the same key.
    }
    // Full jitter: a random wait up to the current backoff (or Retry-After).
    std::this_thread::sleep_for(std::chrono::milliseconds(
        std::uniform_int_distribution<long>(wait.count() / 2, wait.count())(rng)));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
  ++t.gave_up;
  return {};
}

}  // namespace

int main(int argc, char** argv) {
  examples::flags f(argc, argv, usage);
  const auto server_url = f.str("server", "");
  const auto bank_url = f.str("bank", "");
  const long payments = f.num("payments", 300);
  const long concurrency = f.num("concurrency", 8);
  const double resend = f.real("resend-rate", 0.3);
  f.done();
  if (server_url.empty() || bank_url.empty()) f.fail("--server and --bank are required");
  if (payments < 1 || concurrency < 1) f.fail("--payments and --concurrency must be positive");
  const auto server = orpheus::beast::parse_http_url(server_url);
  const auto bank = orpheus::beast::parse_http_url(bank_url);

  totals t;
  std::atomic<long> next{0};
  const std::string run = std::to_string(std::random_device{}());
  std::vector<std::thread> clients;
  for (long c = 0; c < concurrency; ++c) {
    clients.emplace_back([&, c] {
      std::mt19937 rng(static_cast<unsigned>(c));
      std::bernoulli_distribution again(resend);
      for (long i; (i = next++) < payments;) {
        const std::string key = "demo-" + run + "-" + std::to_string(i);
        const std::string client = "shop-" + std::to_string(i % 5);
        const std::string body =
            nlohmann::json{
                {"amount", 100 + i}, {"currency", "EUR"}, {"customer", "cus_" + std::to_string(i)}}
                .dump();
        const auto res = send_payment(server, key, client, body, t);
        if (res.result_int() == 201) ++t.succeeded;
        if (res.result_int() == 402) ++t.declined;
        if (res.find("Idempotent-Replayed") != res.end()) ++t.replays;
        if (again(rng)) {  // the double click: same key, same body
          const auto dup = send_payment(server, key, client, body, t);
          if (dup.find("Idempotent-Replayed") != dup.end()) ++t.replays;
          if (dup.body() != res.body()) ++t.mismatched;
        }
      }
    });
  }
  for (auto& c : clients) c.join();

  const auto ledger =
      nlohmann::json::parse(orpheus::beast::send(bank, http_request{http::verb::get, "/ledger", 11},
                                                 std::chrono::seconds(5))
                                .body());
  const long charges = ledger["charges"];
  const long doubles = ledger["double_charges"];
  std::cout << "payments requested   " << payments << "\n"
            << "HTTP attempts        " << t.attempts << "\n"
            << "replayed answers     " << t.replays << "\n"
            << "succeeded / declined " << t.succeeded << " / " << t.declined << "\n"
            << "gave up              " << t.gave_up << "\n"
            << "charges at the bank  " << charges << "\n"
            << "double charges       " << doubles << "\n";
  const bool ok = doubles == 0 && charges == t.succeeded && t.gave_up == 0 && t.mismatched == 0;
  if (!ok) std::cout << "MISMATCH: see the figures above\n";
  return ok ? 0 : 1;
}
