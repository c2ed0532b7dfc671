// The double-payment trap, and how Orpheus closes it. Runs on the embedded
// SQLite default; the "bank" is simulated in-process and deduplicates by the
// downstream key it is given, as real gateways do when asked.
//
//   payment_retry [DB_PATH]
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <mutex>
#include <random>

#include "orpheus/manager.hpp"
#include "orpheus/store/sqlite.hpp"

namespace {

// A downstream bank with a ledger per downstream key.
class bank {
 public:
  // Charges once per key, then (with drop_response) loses its answer: the
  // caller cannot tell a charge that happened from one that did not.
  std::string charge(const std::string& key, std::int64_t amount, bool drop_response) {
    std::lock_guard lock(m_);
    ++calls_;
    if (ledger_.count(key) != 0) ++duplicates_;
    ledger_[key] += amount;
    // Retryable, not in doubt: this call is over (the charge happened, in
    // this process, before the answer was lost), and the retry asks the
    // bank first (has_charge). A call that may still land downstream after
    // the error (a timeout over a network) must throw error_class::in_doubt
    // instead, which holds the key until the attempt's deadline
    // (docs/errors.md).
    if (drop_response)
      throw orpheus::retryable_error("bank_timeout", "no answer from the bank", 504);
    return "ch_" + key.substr(4, 12);
  }
  // The status query a retry makes first.
  bool has_charge(const std::string& key) {
    std::lock_guard lock(m_);
    return ledger_.count(key) != 0;
  }
  int calls() { return calls_; }
  int duplicates() { return duplicates_; }
  std::size_t charged_keys() { return ledger_.size(); }

 private:
  std::mutex m_;
  std::map<std::string, std::int64_t> ledger_;
  int calls_ = 0;
  int duplicates_ = 0;
};

struct payment {
  std::string id;
  std::int64_t amount = 0;
};
void to_json(nlohmann::json& j, const payment& p) { j = {{"id", p.id}, {"amount", p.amount}}; }
void from_json(const nlohmann::json& j, payment& p) {
  j.at("id").get_to(p.id);
  j.at("amount").get_to(p.amount);
}

orpheus::response pay(orpheus::manager& m, bank& b, const std::string& client,
                      const std::string& key, std::int64_t amount, bool drop_response) {
  const std::string body = "amount=" + std::to_string(amount);
  const orpheus::request_id id{client, key, orpheus::fingerprint_of(body)};
  return m.process(
      id,
      [&](orpheus::tx& tx) {
        const std::string pid = client + "/" + key;
        tx.execute("INSERT INTO payments (id, amount, state) VALUES (?, ?, 'pending')", pid,
                   amount);
        return payment{pid, amount};
      },
      [&](const orpheus::attempt& a, const payment& p) {
        const auto key_down = a.downstream_key("charge");
        if (a.is_retry() && b.has_charge(key_down))
          return std::string("ch_" + key_down.substr(4, 12));
        return b.charge(key_down, p.amount, drop_response);
      },
      [&](orpheus::tx& tx, const orpheus::attempt&, const orpheus::outcome<std::string>& o) {
        const std::string pid = client + "/" + key;
        if (!o.ok()) {
          tx.execute("UPDATE payments SET state = ? WHERE id = ?", o.error().code, pid);
          return orpheus::problem_response(o.error());
        }
        tx.execute("UPDATE payments SET state = 'charged', charge = ? WHERE id = ?", o.value(),
                   pid);
        return orpheus::response{201,
                                 {{"Content-Type", "application/json"}},
                                 nlohmann::json{{"payment", pid}, {"charge", o.value()}}.dump()};
      });
}

void show(const char* what, const std::function<orpheus::response()>& f) {
  std::cout << "  " << what << "\n    -> ";
  try {
    const auto r = f();
    std::cout << r.status << (r.replayed ? " (Idempotent-Replayed)" : "") << " " << r.body << "\n";
  } catch (const orpheus::error& e) {
    std::cout << orpheus::http_status_of(e.info()) << " " << e.code()
              << (e.retryable() ? " [retryable]" : " [do not retry]") << "\n";
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : "payment_retry.db";
  // Each run starts afresh: the database is deleted first, so only a file
  // named *.db is (found in review: any path given was deleted).
  if (path.size() < 4 || path.compare(path.size() - 3, 3, ".db") != 0 ||
      (std::filesystem::exists(path) && !std::filesystem::is_regular_file(path))) {
    std::cerr << "usage: orpheus_example_payment_retry [FILE.db] (deleted and created afresh)\n";
    return 2;
  }
  for (const auto& f : {path, path + "-wal", path + "-shm"}) std::filesystem::remove(f);
  orpheus::sqlite_store store({.path = path});
  store.migrate();
  {
    auto t = store.begin_on_shard(0);
    t->execute("CREATE TABLE payments (id TEXT PRIMARY KEY, amount INT, state TEXT, charge TEXT)");
    t->commit();
  }
  orpheus::config cfg;
  cfg.lease = std::chrono::seconds(5);
  cfg.rpc_timeout = std::chrono::seconds(2);
  orpheus::manager m(store, cfg);
  bank b;

  std::cout << "Orpheus demo on SQLite (" << path << ")\n\n"
            << "One payment of 12.50, key 'order-7-pay':\n";
  show("1. the bank charges, then its answer is lost",
       [&] { return pay(m, b, "alice", "order-7-pay", 1250, true); });
  show("2. the client retries with the same key",
       [&] { return pay(m, b, "alice", "order-7-pay", 1250, false); });
  show("3. a double click sends it again",
       [&] { return pay(m, b, "alice", "order-7-pay", 1250, false); });
  show("4. the key is re-used for another amount",
       [&] { return pay(m, b, "alice", "order-7-pay", 9999, false); });
  show("5. another client uses the same key",
       [&] { return pay(m, b, "bob", "order-7-pay", 1250, false); });

  // A batch with faults: 30% of bank answers are lost after charging; the
  // client retries each payment with its key until it gets an answer.
  std::mt19937 rng(7);
  std::bernoulli_distribution lost(0.3);
  int attempts = 0, replays = 0;
  constexpr int payments = 200;
  for (int i = 0; i < payments; ++i) {
    const auto key = "batch-" + std::to_string(i);
    for (;;) {
      ++attempts;
      try {
        if (pay(m, b, "shop", key, 100 + i, lost(rng)).replayed) ++replays;
        if (i % 3 == 0) {  // and a third of the clients send it once more
          ++attempts;
          if (pay(m, b, "shop", key, 100 + i, false).replayed) ++replays;
        }
        break;
      } catch (const orpheus::error& e) {
        if (!e.retryable()) break;
      }
    }
  }
  std::cout << "\nBatch: " << payments << " payments, " << attempts << " attempts, " << replays
            << " replays, " << b.calls() << " bank calls\n"
            << "Charged payments at the bank: " << b.charged_keys() << " of " << payments + 2
            << "\n"
            << "Double charges: " << b.duplicates() << "\n";
  return b.duplicates() == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
