// A downstream bank over HTTP, with the faults that make payments hard.
// See --help. Its ledger answers "was this payment charged twice?".
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>

#include "../common/flags.hpp"
#include "../common/stop_signals.hpp"
#include "orpheus/beast/server.hpp"
#include "orpheus/work_pool.hpp"

namespace {

constexpr const char* usage = R"(bank_simulator: a fake payment gateway with fault injection

Usage: bank_simulator [flags]
  --port N            listen on 127.0.0.1:N (default 0: any free port)
  --latency-ms N      delay before answering each charge (default 0)
  --fail-rate R       share of charges answered 503 BEFORE charging (default 0)
  --drop-rate R       share of charges whose answer is dropped AFTER charging:
                      the connection closes with no response (default 0)
  --decline-rate R    share of charges declined with 402, card_declined (default 0)
  --capture-decline-rate R
                      share of captures refused for good with 402 (a risk
                      check after the authorisation), so that the payment
                      voids its authorisation (default 0)
  --hold-after-charge-ms N
                      after charging, wait N ms before answering (default 0): the
                      window in which a crashed caller has charged but not recorded
  --dedup on|off      off: charge again when a key comes back, as a gateway
                      without idempotency keys would; only the caller can then
                      prevent a double charge (default on)
  --seed N            random seed (default 1)
  --ledger-down-every-ms P, --ledger-down-for-ms D
                      the ledger's notification endpoint answers 503 for D ms
                      out of every P ms (default: never down)

Prints "listening on PORT" once ready; stops on SIGTERM or SIGINT.

API
  POST /charges        Idempotency-Key: K (required); body {"amount": 1250,
                       "currency": "EUR", "reference": "pay_..."}
                       201 {"charge_id", "status": "charged"}; the same K again
                       answers the first outcome (200) without charging again;
                       402 {"status": "declined"}; 503 before charging
  GET /charges/K       what became of key K: 200 as above, or 404 if never seen
  GET /charges         every charge made, oldest first: [{"charge_id", "key",
                       "reference", "amount"}] (for audits: scripts/chaos)
  GET /ledger          {"charges": charges made, "keys": distinct keys,
                        "references": distinct references charged,
                        "double_charges": references charged more than once,
                        and for the two-step API below: "authorisations",
                        "captured", "voided", "open_authorisations" (neither
                        captured nor voided), "notified", "double_notified",
                        "captured_not_notified", "charge_requests": POST
                        /charges requests received, counted on arrival,
                        before --latency-ms}

Card payments in two steps (each POST takes Idempotency-Key: K, and the
same K again answers the first outcome, whatever --dedup says). Faults:
--fail-rate on authorise, capture and void; --drop-rate on every answer
that acted, notifications too; --decline-rate on authorise and
--capture-decline-rate on capture; --latency-ms and --hold-after-charge-ms
(after a capture) as for charges; the ledger's own downtime below:
  POST /authorisations {"amount", "currency", "reference"}
                       201 {"authorisation_id", "status": "authorised"};
                       402 declined; 503 before acting
  POST /authorisations/ID/capture
                       201 {"charge_id", "status": "captured"}: the charge
                       (counted in "charges" and GET /charges); an ID captured
                       before answers its capture (200); 409 {"error":
                       "voided"}; 404 for an unknown ID
  POST /authorisations/ID/void
                       200 {"status": "voided"} (again: 200); 409 {"error":
                       "already_captured"}; 404 for an unknown ID
  POST /ledger/notifications {"reference", "charge_id"}
                       201 {"status": "notified"}; 503 while the ledger is
                       down (see --ledger-down-*)
)";

namespace http = boost::beast::http;
using orpheus::beast::http_request;
using orpheus::beast::http_response;
using orpheus::beast::make_response;

struct outcome {
  int status;
  nlohmann::json body;
};

class bank {
 public:
  bank(double fail, double drop, double decline, double capture_decline, bool dedup,
       std::uint64_t seed)
      : fail_(fail),
        drop_(drop),
        decline_(decline),
        capture_decline_(capture_decline),
        dedup_(dedup),
        rng_(seed) {}

  http_response charge(const http_request& req) {
    const auto key_field = req.find("Idempotency-Key");
    if (key_field == req.end() || key_field->value().empty()) {
      return make_response(400, R"({"error":"missing Idempotency-Key"})", "application/json");
    }
    const std::string key(key_field->value());
    const auto body = nlohmann::json::parse(req.body(), nullptr, false);
    if (body.is_discarded() || !body.contains("amount") || !body["amount"].is_number_integer() ||
        !body.contains("reference") || !body["reference"].is_string()) {
      return make_response(400, R"({"error":"bad charge request"})", "application/json");
    }
    std::lock_guard lock(m_);
    if (auto it = by_key_.find(key); dedup_ && it != by_key_.end()) {  // deduplicated by key
      return make_response(it->second.status == 201 ? 200 : it->second.status,
                           it->second.body.dump(), "application/json");
    }
    if (roll(fail_))
      return make_response(503, R"({"error":"bank unavailable"})", "application/json");
    if (roll(decline_)) {
      outcome o{402, {{"status", "declined"}, {"error", "card_declined"}}};
      by_key_[key] = o;
      return make_response(402, o.body.dump(), "application/json");
    }
    const std::string reference = body["reference"];
    const std::string charge_id = "ch_" + std::to_string(++charges_);
    ++charged_refs_[reference];
    made_.push_back({{"charge_id", charge_id},
                     {"key", key},
                     {"reference", reference},
                     {"amount", body["amount"]}});
    outcome o{201, {{"charge_id", charge_id}, {"status", "charged"}, {"amount", body["amount"]}}};
    by_key_[key] = o;
    if (roll(drop_)) return orpheus::beast::drop_connection();  // charged, answer lost
    return make_response(201, o.body.dump(), "application/json");
  }

  // The two-step API. Every POST is answered the first time's way when its
  // key comes back (the ledger of answers by key is per operation).
  http_response authorise(const http_request& req) {
    return once("authorise", req, [&](const nlohmann::json& body) -> outcome {
      if (!body.contains("amount") || !body["amount"].is_number_integer() ||
          !body.contains("reference") || !body["reference"].is_string()) {
        return {400, {{"error", "bad authorisation request"}}};
      }
      if (roll(fail_)) return {503, {{"error", "bank unavailable"}}};
      if (roll(decline_)) return {402, {{"status", "declined"}, {"error", "card_declined"}}};
      const std::string id = "au_" + std::to_string(auths_.size() + 1);
      auths_[id] = {body["reference"], body["amount"], {}, false};
      return {201, {{"authorisation_id", id}, {"status", "authorised"}}};
    });
  }

  http_response capture(const http_request& req, const std::string& id) {
    return once("capture " + id, req, [&](const nlohmann::json&) -> outcome {
      const auto a = auths_.find(id);
      if (a == auths_.end()) return {404, {{"error", "unknown authorisation"}}};
      if (a->second.voided) return {409, {{"error", "voided"}}};
      if (!a->second.charge_id.empty()) {
        return {200, {{"charge_id", a->second.charge_id}, {"status", "captured"}}};
      }
      if (roll(fail_)) return {503, {{"error", "bank unavailable"}}};
      if (roll(capture_decline_)) return {402, {{"status", "declined"}, {"error", "risk_check"}}};
      a->second.charge_id = "ch_" + std::to_string(++charges_);
      ++charged_refs_[a->second.reference];
      made_.push_back({{"charge_id", a->second.charge_id},
                       {"key", req["Idempotency-Key"]},
                       {"reference", a->second.reference},
                       {"amount", a->second.amount}});
      return {201, {{"charge_id", a->second.charge_id}, {"status", "captured"}}};
    });
  }

  http_response void_authorisation(const http_request& req, const std::string& id) {
    return once("void " + id, req, [&](const nlohmann::json&) -> outcome {
      const auto a = auths_.find(id);
      if (a == auths_.end()) return {404, {{"error", "unknown authorisation"}}};
      if (!a->second.charge_id.empty()) return {409, {{"error", "already_captured"}}};
      if (!a->second.voided && roll(fail_)) return {503, {{"error", "bank unavailable"}}};
      a->second.voided = true;
      return {200, {{"status", "voided"}}};
    });
  }

  http_response notify(const http_request& req, bool ledger_down) {
    if (ledger_down) return make_response(503, R"({"error":"ledger down"})", "application/json");
    return once("notify", req, [&](const nlohmann::json& body) -> outcome {
      if (!body.contains("reference") || !body["reference"].is_string()) {
        return {400, {{"error", "bad notification"}}};
      }
      ++notified_[body["reference"].get<std::string>()];
      return {201, {{"status", "notified"}}};
    });
  }

  http_response status(const std::string& key) {
    std::lock_guard lock(m_);
    const auto it = by_key_.find(key);
    if (it == by_key_.end())
      return make_response(404, R"({"status":"unknown"})", "application/json");
    return make_response(200, it->second.body.dump(), "application/json");
  }

  http_response charges() {
    std::lock_guard lock(m_);
    return make_response(200, made_.dump(), "application/json");
  }

  // A POST /charges has arrived (tests: a charge on its way, not yet made).
  void charge_arrived() { ++charge_requests_; }

  http_response ledger() {
    std::lock_guard lock(m_);
    int doubles = 0;
    for (const auto& [ref, n] : charged_refs_) doubles += n > 1 ? 1 : 0;
    int voided = 0;
    int open = 0;
    int captured = 0;
    int captured_not_notified = 0;
    for (const auto& [id, a] : auths_) {
      voided += a.voided ? 1 : 0;
      captured += a.charge_id.empty() ? 0 : 1;
      open += !a.voided && a.charge_id.empty() ? 1 : 0;
      if (!a.charge_id.empty() && notified_.count(a.reference) == 0) ++captured_not_notified;
    }
    int double_notified = 0;
    for (const auto& [ref, n] : notified_) double_notified += n > 1 ? 1 : 0;
    const nlohmann::json j{{"charges", charges_},
                           {"charge_requests", charge_requests_.load()},
                           {"keys", by_key_.size()},
                           {"references", charged_refs_.size()},
                           {"double_charges", doubles},
                           {"authorisations", auths_.size()},
                           {"captured", captured},
                           {"voided", voided},
                           {"open_authorisations", open},
                           {"notified", notified_.size()},
                           {"double_notified", double_notified},
                           {"captured_not_notified", captured_not_notified}};
    return make_response(200, j.dump(), "application/json");
  }

 private:
  struct authorisation {
    std::string reference;
    nlohmann::json amount;
    std::string charge_id;  // empty until captured
    bool voided = false;
  };

  // Runs `act` once per (operation, Idempotency-Key); later calls with the
  // key answer its outcome (a 503 is not kept: nothing was done).
  template <class Act>
  http_response once(const std::string& operation, const http_request& req, Act act) {
    const auto key_field = req.find("Idempotency-Key");
    if (key_field == req.end() || key_field->value().empty()) {
      return make_response(400, R"({"error":"missing Idempotency-Key"})", "application/json");
    }
    auto body = nlohmann::json::parse(req.body().empty() ? "{}" : req.body(), nullptr, false);
    if (body.is_null()) body = nlohmann::json::object();
    if (body.is_discarded() || !body.is_object()) {
      return make_response(400, R"({"error":"bad request body"})", "application/json");
    }
    const std::string key = operation + " " + std::string(key_field->value());
    std::lock_guard lock(m_);
    if (const auto it = answered_.find(key); it != answered_.end()) {
      return make_response(it->second.status, it->second.body.dump(), "application/json");
    }
    const outcome o = act(body);
    if (o.status != 503) answered_[key] = o;
    if (o.status < 300 && roll(drop_)) return orpheus::beast::drop_connection();
    return make_response(o.status, o.body.dump(), "application/json");
  }

  bool roll(double rate) { return rate > 0 && std::uniform_real_distribution<>(0, 1)(rng_) < rate; }

  std::mutex m_;
  double fail_, drop_, decline_, capture_decline_;
  bool dedup_;
  std::atomic<int> charge_requests_{0};
  std::mt19937_64 rng_;
  std::unordered_map<std::string, outcome> by_key_;
  std::unordered_map<std::string, int> charged_refs_;
  nlohmann::json made_ = nlohmann::json::array();  // every charge, for GET /charges
  std::unordered_map<std::string, authorisation> auths_;
  std::unordered_map<std::string, outcome> answered_;  // (operation, key) -> first answer
  std::unordered_map<std::string, int> notified_;      // reference -> notifications
  long charges_ = 0;
};

}  // namespace

// Any failure (a port in use, an unreadable answer) is a message and exit 1,
// never an abort (found in review: main() caught nothing).
int main(int argc, char** argv) try {
  examples::flags f(argc, argv, usage);
  const auto port = f.num("port", 0, 0, 65535);
  const auto latency = std::chrono::milliseconds(f.millis("latency-ms", 0));
  const auto hold = std::chrono::milliseconds(f.millis("hold-after-charge-ms", 0));
  const auto dedup = f.str("dedup", "on");
  if (dedup != "on" && dedup != "off") f.fail("--dedup wants on or off");
  bank b(f.real("fail-rate", 0), f.real("drop-rate", 0), f.real("decline-rate", 0),
         f.real("capture-decline-rate", 0), dedup == "on",
         static_cast<std::uint64_t>(f.num("seed", 1)));
  const auto down_every = std::chrono::milliseconds(f.millis("ledger-down-every-ms", 0));
  const auto down_for = std::chrono::milliseconds(f.millis("ledger-down-for-ms", 0));
  if (down_every.count() < 0 || down_for.count() < 0 ||
      (down_for.count() > 0 && down_every <= down_for)) {
    f.fail("--ledger-down-for-ms wants --ledger-down-every-ms longer than it");
  }
  const auto started = std::chrono::steady_clock::now();
  const auto ledger_down = [=] {
    if (down_for.count() == 0) return false;
    const auto in_period = (std::chrono::steady_clock::now() - started) % down_every;
    return in_period < down_for;
  };
  f.done();
  if (port < 0 || port > 65535) f.fail("--port out of range");

  const examples::stop_signals stop;  // before any thread starts

  orpheus::work_pool pool(8, 1024);  // latency must not block the io thread
  orpheus::beast::server_options options;
  options.port = static_cast<unsigned short>(port);
  orpheus::beast::server s(options, [&](http_request&& req, orpheus::beast::responder respond) {
    auto work = [&b, latency, hold, ledger_down, req = std::move(req), respond] {
      const std::string target(req.target());
      // The two-step API: /authorisations[/ID/capture|/ID/void].
      if (req.method() == http::verb::post && target == "/authorisations") {
        std::this_thread::sleep_for(latency);
        return respond(b.authorise(req));
      }
      if (req.method() == http::verb::post && target.rfind("/authorisations/", 0) == 0) {
        const std::string rest = target.substr(16);
        const auto slash = rest.find('/');
        const std::string id = rest.substr(0, slash);
        const std::string action = slash == std::string::npos ? "" : rest.substr(slash + 1);
        std::this_thread::sleep_for(latency);
        if (action == "capture") {
          auto answer = b.capture(req, id);
          if (answer.result_int() == 201) std::this_thread::sleep_for(hold);
          return respond(std::move(answer));
        }
        if (action == "void") return respond(b.void_authorisation(req, id));
      }
      if (req.method() == http::verb::post && target == "/ledger/notifications") {
        return respond(b.notify(req, ledger_down()));
      }
      if (req.method() == http::verb::post && target == "/charges") {
        b.charge_arrived();
        std::this_thread::sleep_for(latency);
        auto answer = b.charge(req);
        if (answer.result_int() == 201) std::this_thread::sleep_for(hold);
        return respond(std::move(answer));
      }
      if (req.method() == http::verb::get && target.rfind("/charges/", 0) == 0) {
        return respond(b.status(target.substr(9)));
      }
      if (req.method() == http::verb::get && target == "/charges") return respond(b.charges());
      if (req.method() == http::verb::get && target == "/ledger") return respond(b.ledger());
      respond(make_response(404, "not found\n"));
    };
    if (!pool.try_submit(work)) respond(make_response(503, R"({"error":"busy"})"));
  });
  s.start();
  std::cout << "listening on " << s.port() << std::endl;
  stop.wait();
  // Graceful: no new connections, the charges in flight finish and are
  // answered, then the connections close.
  s.stop_accepting();
  pool.drain();
  s.stop();
  return 0;
} catch (const std::exception& e) {
  std::cerr << "bank_simulator: " << e.what() << "\n";
  return 1;
}
