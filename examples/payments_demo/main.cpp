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
#include "orpheus/api_keys.hpp"
#include "orpheus/beast/client.hpp"
#include "orpheus/client/client.hpp"

namespace {

constexpr const char* usage = R"(payments_demo: drive payments_server and count charges at the bank

Usage: payments_demo --server URL --bank URL --api-key KEY [flags]
  --server URL        the payments server, e.g. http://127.0.0.1:8080
  --bank URL          the bank simulator behind it (for its ledger)
  --api-key KEY       a shop's API key (`Authorization: Bearer KEY`); repeat
                      it for several shops: payment i is sent by shop i mod n
  --payments N        logical payments to make (default 300)
  --concurrency N     clients sending at once (default 8)
  --resend-rate R     share of payments sent once more after their answer,
                      as a double click would (default 0.3)
  --settle-ms N       after the last answer, wait up to N ms for the server's
                      completer to finish what is left (default 30000)

With the payment in steps (authorise, capture, notify the ledger), the bank's
ledger is the judge: every capture notified once, every authorisation either
captured or voided ("left unfinished", printed in steps only, counts the
others). Exits 1 on a double charge, a payment left unfinished, a double
click answered differently, a payment refused (a 4xx other than 402, such as
401 for a wrong --api-key), or no payment succeeding; in one charge, also
when a client gave up.
)";

namespace http = boost::beast::http;
using orpheus::beast::http_request;
using orpheus::beast::http_response;

struct totals {
  std::atomic<long> attempts{0}, replays{0}, succeeded{0}, declined{0}, gave_up{0}, mismatched{0};
  /// Final answers that refuse the request itself (401, 400, 422, ...): a
  /// demo whose every payment got one would otherwise pass with 0 charges.
  std::atomic<long> refused{0};
  std::atomic<long> out_of_attempts{0}, out_of_time{0}, out_of_budget{0};
};

// One logical payment through the client helper: the same key and bytes on
// every attempt, Retry-After honoured, 4xx never retried.
std::optional<http_response> send_payment(const orpheus::client::idempotent_client& api,
                                          const orpheus::client::prepared_request& req, totals& t) {
  auto r = api.send(req);
  t.attempts += r.attempts;
  if (r.replayed) ++t.replays;
  if (r.why != orpheus::client::stop_reason::answered) {
    ++t.gave_up;
    switch (r.why) {
      case orpheus::client::stop_reason::attempts_exhausted:
        ++t.out_of_attempts;
        break;
      case orpheus::client::stop_reason::deadline:
        ++t.out_of_time;
        break;
      case orpheus::client::stop_reason::budget_exhausted:
        ++t.out_of_budget;
        break;
      case orpheus::client::stop_reason::answered:
        break;
    }
    return std::nullopt;
  }
  return std::move(r.response);
}

}  // namespace

// Any failure (a port in use, an unreadable answer) is a message and exit 1,
// never an abort (found in review: main() caught nothing).
int main(int argc, char** argv) try {
  examples::flags f(argc, argv, usage);
  const auto server_url = f.str("server", "");
  const auto bank_url = f.str("bank", "");
  const auto api_keys = f.all("api-key");
  const long payments = f.num("payments", 300, 1, 1000000);
  const long concurrency = f.num("concurrency", 8, 1, 1024);
  const double resend = f.real("resend-rate", 0.3);
  const long settle_ms = f.millis("settle-ms", 30000);
  f.done();
  if (server_url.empty() || bank_url.empty() || api_keys.empty())
    f.fail("--server, --bank and --api-key are required");
  if (payments < 1 || concurrency < 1) f.fail("--payments and --concurrency must be positive");
  // Sent as a header from the shop's threads, where a key the client library
  // refuses (a CR, say) would end the process: refused here, as a bad flag.
  for (const auto& key : api_keys) {
    if (orpheus::bearer_token("Bearer " + key) != key) {
      f.fail("--api-key must be a bearer token: letters, digits and -._~+/, then = padding only");
    }
  }
  const auto server = orpheus::beast::parse_http_url(server_url);
  const auto bank = orpheus::beast::parse_http_url(bank_url);

  // One client for all the shop's calls: its retry budget is shared, so an
  // outage would slow every caller down instead of multiplying the load.
  orpheus::client::client_options options;
  options.policy.max_attempts = 30;
  options.policy.deadline = std::chrono::seconds(60);
  options.policy.max_delay = std::chrono::milliseconds(1000);
  // The bank here fails or loses about a third of its answers on purpose, and
  // every lost answer is in doubt: the server holds the key until the bank
  // call's deadline, so the retry meets a 409 first. The default budget (500
  // tokens) treats that much retrying as an outage and gives up on some
  // payments; a shop facing this bank would size it like this.
  options.budget = std::make_shared<orpheus::client::retry_budget>(5000);
  const orpheus::client::idempotent_client api(server, options);
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
        const std::string& api_key = api_keys[static_cast<std::size_t>(i) % api_keys.size()];
        const std::string body =
            nlohmann::json{
                {"amount", 100 + i}, {"currency", "EUR"}, {"customer", "cus_" + std::to_string(i)}}
                .dump();
        const orpheus::client::prepared_request req(
            http::verb::post, "/v1/payments", body,
            {{"Content-Type", "application/json"}, {"Authorization", "Bearer " + api_key}}, key);
        const auto res = send_payment(api, req, t);
        if (!res) continue;
        if (res->result_int() == 201) ++t.succeeded;
        if (res->result_int() == 402) ++t.declined;
        if (res->result_int() / 100 == 4 && res->result_int() != 402) ++t.refused;
        if (again(rng)) {  // the double click: the same logical request again
          const auto dup = send_payment(api, req, t);
          if (!dup || dup->body() != res->body()) ++t.mismatched;
        }
      }
    });
  }
  for (auto& c : clients) c.join();

  const auto read_ledger = [&] {
    return nlohmann::json::parse(orpheus::beast::send(bank,
                                                      http_request{http::verb::get, "/ledger", 11},
                                                      std::chrono::seconds(5))
                                     .body());
  };
  // Payments whose client gave up, or whose server was killed, are finished
  // by the server's completer in the background: give it time.
  const auto unfinished_of = [](const nlohmann::json& l) {
    return l.value("open_authorisations", 0L) + l.value("captured_not_notified", 0L);
  };
  auto ledger = read_ledger();
  const auto settle_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(settle_ms);
  while (unfinished_of(ledger) > 0 && std::chrono::steady_clock::now() < settle_until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    ledger = read_ledger();
  }
  const long charges = ledger["charges"];
  const long doubles = ledger["double_charges"];
  const long unfinished = unfinished_of(ledger);
  std::cout << "payments requested   " << payments << "\n"
            << "HTTP attempts        " << t.attempts << "\n"
            << "replayed answers     " << t.replays << "\n"
            << "succeeded / declined " << t.succeeded << " / " << t.declined << "\n"
            << "refused (4xx)        " << t.refused << "\n"
            << "gave up              " << t.gave_up << " (attempts " << t.out_of_attempts
            << ", deadline " << t.out_of_time << ", budget " << t.out_of_budget << ")\n"
            << "charges at the bank  " << charges << "\n";
  const bool in_steps = ledger.value("authorisations", 0L) > 0;
  if (in_steps) {
    std::cout << "captured             " << ledger.value("captured", 0L) << "\n"
              << "voided               " << ledger.value("voided", 0L) << "\n"
              << "notified             " << ledger.value("notified", 0L)
              << " (twice: " << ledger.value("double_notified", 0L) << ")\n";
  }
  std::cout << "double charges       " << doubles << "\n";
  if (in_steps) std::cout << "left unfinished      " << unfinished << "\n";
  // In steps, a payment whose client gave up is finished by the completer:
  // the bank's ledger is the judge. In one charge, every answer counts.
  const bool ok = doubles == 0 && t.mismatched == 0 && t.refused == 0 && t.succeeded > 0 &&
                  (in_steps ? unfinished == 0 && ledger.value("double_notified", 0L) == 0 &&
                                  charges >= t.succeeded
                            : charges == t.succeeded && t.gave_up == 0);
  if (!ok) std::cout << "MISMATCH: see the figures above\n";
  return ok ? 0 : 1;
} catch (const std::exception& e) {
  std::cerr << "payments_demo: " << e.what() << "\n";
  return 1;
}
