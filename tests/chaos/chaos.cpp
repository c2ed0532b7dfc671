// The two halves of scripts/chaos: `pay` is one client process of the run,
// `audit` checks the run's promises once it is over. See --help.
//
// A logical payment i has a fixed payload (amount 1000 + i, so the bank's
// charges name their payment by amount alone, whatever keys and references
// the server made), a name in its client's key journal, and a line in its
// client's results file once it has a final answer. A client process that is
// SIGKILLed and started again with the same flags resumes: it skips what its
// results file holds and sends the rest with the keys its journal holds.
#include <sqlite3.h>

#include <atomic>
#include <chrono>
#include <iostream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>

#include "../../examples/common/flags.hpp"
#include "orpheus/beast/client.hpp"
#include "orpheus/client/client.hpp"
#include "orpheus/client/journal.hpp"
#include "orpheus/request.hpp"
#include "orpheus/store/mysql.hpp"
#include "orpheus/store/sqlite.hpp"

namespace {

constexpr const char* usage = R"(orpheus_chaos: a client process of scripts/chaos, and its audit

Usage:
  orpheus_chaos pay --server URL --client ID --api-key KEY --journal PATH
                    --results PATH --first I --count N [--threads T]
                    [--give-up-s S]
      Makes payments I .. I+N-1 through payments_server with orpheus::client,
      as the client ID whose API key is KEY (sent as a bearer token):
      amount 1000+i, key from the journal (written before the first send),
      retried until a final answer or S seconds (default 600) in all. A final
      answer goes to the results file, then the journal entry is completed;
      every 25 answers it prints "progress N". Started again with the same
      flags, it resumes where it stopped (and says how many payments its
      journal held).

  orpheus_chaos audit --payments N --bank URL --store SPEC [--store SPEC]
                      --results PATH [--results PATH ...] [--journal PATH ...]
      Reads the results, the bank's charges (GET /charges) and the records
      (--store as payments_server takes it, the shards in the same order),
      prints what is wrong, then one line:
        payments N, charged C, double charges D, lost L, unfinished U
      and exits 0 only if D, L and U are 0 and every payment has an answer.

  orpheus_chaos sabotage --bank URL --store SPEC [--store SPEC] --results PATH ...
      Charges payment 0 once more at the bank (a new key) and deletes the
      record of payment 1: the audit run after it must report one double
      charge and one lost record, which proves it can see them.
)";

using nlohmann::json;

// ---- the results file --------------------------------------------------------

struct result {
  long payment = 0;
  std::string client;
  std::string key;
  int status = 0;
  std::string body;
};

class results_file {
 public:
  explicit results_file(const std::string& path) {
    if (sqlite3_open(path.c_str(), &db_) != SQLITE_OK) fail("open " + path);
    sqlite3_busy_timeout(db_, 5000);
    exec("PRAGMA journal_mode=WAL");
    exec("PRAGMA synchronous=FULL");  // written before the journal entry is completed
    exec(
        "CREATE TABLE IF NOT EXISTS results (payment INTEGER PRIMARY KEY, client TEXT NOT NULL, "
        "idem_key TEXT NOT NULL, status INTEGER NOT NULL, body TEXT NOT NULL)");
  }
  results_file(const results_file&) = delete;
  results_file& operator=(const results_file&) = delete;
  ~results_file() { sqlite3_close(db_); }

  void put(const result& r) {
    std::lock_guard lock(m_);
    sqlite3_stmt* s = prepare("INSERT OR REPLACE INTO results VALUES (?, ?, ?, ?, ?)");
    sqlite3_bind_int64(s, 1, r.payment);
    sqlite3_bind_text(s, 2, r.client.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(s, 3, r.key.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_int(s, 4, r.status);
    sqlite3_bind_text(s, 5, r.body.c_str(), -1, SQLITE_TRANSIENT);
    const int rc = sqlite3_step(s);
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE) fail("insert");
  }

  std::vector<result> all() {
    std::lock_guard lock(m_);
    std::vector<result> out;
    sqlite3_stmt* s = prepare("SELECT payment, client, idem_key, status, body FROM results");
    while (sqlite3_step(s) == SQLITE_ROW) {
      auto text = [&](int i) {
        const auto* t = reinterpret_cast<const char*>(sqlite3_column_text(s, i));
        return std::string(t != nullptr ? t : "");
      };
      out.push_back(
          {sqlite3_column_int64(s, 0), text(1), text(2), sqlite3_column_int(s, 3), text(4)});
    }
    sqlite3_finalize(s);
    return out;
  }

 private:
  [[noreturn]] void fail(const std::string& what) {
    throw std::runtime_error("results file: " + what + ": " + sqlite3_errmsg(db_));
  }
  void exec(const char* sql) {
    if (sqlite3_exec(db_, sql, nullptr, nullptr, nullptr) != SQLITE_OK) fail(sql);
  }
  sqlite3_stmt* prepare(const char* sql) {
    sqlite3_stmt* s = nullptr;
    if (sqlite3_prepare_v2(db_, sql, -1, &s, nullptr) != SQLITE_OK) fail(sql);
    return s;
  }

  sqlite3* db_ = nullptr;
  std::mutex m_;
};

// The payload of payment i: the same bytes in every process and attempt.
std::string body_of(long i) {
  return json{{"amount", 1000 + i}, {"currency", "EUR"}, {"customer", "cus_" + std::to_string(i)}}
      .dump();
}
std::string name_of(long i) { return "payment-" + std::to_string(i); }

// ---- pay -------------------------------------------------------------------------

int pay(examples::flags& f) {
  const auto server = f.str("server", "");
  const auto client = f.str("client", "");
  const auto api_key = f.str("api-key", "");
  const auto journal_path = f.str("journal", "");
  const auto results_path = f.str("results", "");
  const long first = f.num("first", -1);
  const long count = f.num("count", -1);
  const long threads = f.num("threads", 4);
  const auto give_up = std::chrono::seconds(f.num("give-up-s", 600));
  f.done();
  if (server.empty() || client.empty() || api_key.empty() || journal_path.empty() ||
      results_path.empty() || first < 0 || count < 0 || threads < 1) {
    f.fail("pay needs --server, --client, --api-key, --journal, --results, --first and --count");
  }

  orpheus::client::sqlite_key_journal journal(journal_path);
  results_file results(results_path);
  std::set<long> done;
  for (const auto& r : results.all()) {
    done.insert(r.payment);
    // Killed between writing the result and completing the journal entry.
    journal.complete(name_of(r.payment));
  }
  // Payments a killed run of this client had started: resumed with their keys.
  const auto resumed = journal.pending().size();
  std::cout << "resuming " << resumed << " payments from the journal" << std::endl;

  orpheus::client::client_options options;
  options.policy.max_attempts = 100;
  options.policy.max_delay = std::chrono::milliseconds(1000);
  // Faults are the point of this run: a budget sized for an outage would
  // give up on payments that a patient client finishes.
  options.budget = std::make_shared<orpheus::client::retry_budget>(1000000);
  const orpheus::client::idempotent_client api(orpheus::beast::parse_http_url(server), options);
  const auto stop_at = std::chrono::steady_clock::now() + give_up;

  std::atomic<long> next{first};
  std::atomic<long> answered{0}, unanswered{0};
  std::mutex out;
  auto work = [&] {
    for (long i; (i = next++) < first + count;) {
      if (done.count(i) != 0) continue;
      const std::string body = body_of(i);
      const std::string key = journal.key_for(name_of(i), orpheus::fingerprint_of(body));
      const orpheus::client::prepared_request req(
          boost::beast::http::verb::post, "/v1/payments", body,
          {{"Content-Type", "application/json"}, {"Authorization", "Bearer " + api_key}}, key);
      for (;;) {
        const auto r = api.send(req);
        // A final answer: what the client helper calls one, or a recorded
        // answer replayed (a recorded 5xx is final too; the helper retries it).
        if (r.response && (r.why == orpheus::client::stop_reason::answered || r.replayed)) {
          results.put(
              {i, client, key, static_cast<int>(r.response->result_int()), r.response->body()});
          journal.complete(name_of(i));
          if (++answered % 25 == 0) {  // scripts/chaos times its faults by these
            const std::lock_guard lock(out);
            std::cout << "progress " << answered << std::endl;
          }
          break;
        }
        if (std::chrono::steady_clock::now() >= stop_at) {
          std::cerr << "orpheus_chaos: gave up on payment " << i << " (key " << key << ")\n";
          ++unanswered;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
    }
  };
  std::vector<std::thread> pool;
  for (long t = 0; t < threads; ++t) pool.emplace_back(work);
  for (auto& t : pool) t.join();
  std::cout << "client " << client << ": answered " << answered << ", skipped (answered before) "
            << done.size() << ", unanswered " << unanswered << "\n";
  return unanswered == 0 ? 0 : 1;
}

// ---- audit -------------------------------------------------------------------

std::unique_ptr<orpheus::store> open_store(const std::vector<std::string>& specs) {
  if (specs.size() == 1 && specs[0].rfind("sqlite:", 0) == 0) {
    return std::make_unique<orpheus::sqlite_store>(orpheus::sqlite_options{specs[0].substr(7)});
  }
  orpheus::mysql_options o;
  for (const auto& s : specs) o.shards.push_back(orpheus::parse_mysql_url(s));
  return std::make_unique<orpheus::mysql_store>(o);
}

int audit(examples::flags& f) {
  const long payments = f.num("payments", -1);
  const auto bank_url = f.str("bank", "");
  const auto stores = f.all("store");
  const auto result_paths = f.all("results");
  const auto journal_paths = f.all("journal");
  f.done();
  if (payments < 0 || bank_url.empty() || stores.empty() || result_paths.empty()) {
    f.fail("audit needs --payments, --bank, --store and --results");
  }

  long double_charges = 0, lost = 0, unfinished = 0;
  int shown = 0;
  auto problem = [&](long& counter, const std::string& what, long n = 1) {
    counter += n;
    if (++shown <= 50) std::cout << "  " << what << "\n";
  };

  // What the clients were told.
  std::map<long, result> told;
  for (const auto& p : result_paths) {
    results_file r(p);
    for (auto& x : r.all()) told[x.payment] = std::move(x);
  }
  long pending = 0;
  for (const auto& p : journal_paths) {
    orpheus::client::sqlite_key_journal j(p);
    pending += static_cast<long>(j.pending().size());
  }

  // What the bank did, by payment (amount - 1000).
  const auto charges_answer = orpheus::beast::send(
      orpheus::beast::parse_http_url(bank_url),
      orpheus::beast::http_request{boost::beast::http::verb::get, "/charges", 11},
      std::chrono::seconds(30));
  const auto charges = json::parse(charges_answer.body());
  std::map<long, std::vector<json>> charged;
  for (const auto& c : charges) charged[c.at("amount").get<long>() - 1000].push_back(c);

  const auto store = open_store(stores);
  for (long i = 0; i < payments; ++i) {
    const auto at_bank = charged.find(i);
    const std::size_t n = at_bank == charged.end() ? 0 : at_bank->second.size();
    if (n > 1)
      problem(double_charges,
              "payment " + std::to_string(i) + " charged " + std::to_string(n) + " times");
    const auto it = told.find(i);
    if (it == told.end()) {
      problem(unfinished, "payment " + std::to_string(i) + ": no final answer");
      continue;
    }
    const result& r = it->second;
    const auto rec = store->inspect({"client:" + r.client, r.key, ""});
    if (!rec) {
      problem(lost, "payment " + std::to_string(i) + ": no record for key " + r.key);
      continue;
    }
    if (!orpheus::is_terminal(rec->state)) {
      problem(unfinished, "payment " + std::to_string(i) + ": record " +
                              std::string(orpheus::to_string(rec->state)));
      continue;
    }
    if (static_cast<int>(rec->recorded.status) != r.status || rec->recorded.body != r.body) {
      problem(lost, "payment " + std::to_string(i) + ": the record (" +
                        std::to_string(rec->recorded.status) + ") is not the answer given (" +
                        std::to_string(r.status) + ")");
      continue;
    }
    if (r.status == 201) {
      const auto answer = json::parse(r.body, nullptr, false);
      const std::string id =
          answer.is_object() && answer.contains("charge_id") && answer["charge_id"].is_string()
              ? answer["charge_id"].get<std::string>()
              : "";
      bool found = false;
      if (at_bank != charged.end()) {
        for (const auto& c : at_bank->second) found = found || c.at("charge_id") == id;
      }
      if (!found) {
        problem(lost, "payment " + std::to_string(i) + ": answered charged as '" + id +
                          "', which the bank never made");
      }
    } else if (n > 0) {
      problem(lost, "payment " + std::to_string(i) + ": charged, but answered " +
                        std::to_string(r.status) + ": " + r.body);
    } else {
      // Every fault here is transient and the bank declines nothing: a final
      // failure (attempts exhausted, a transient fault taken as a refusal) is
      // a payment the run did not finish.
      problem(unfinished, "payment " + std::to_string(i) + ": ended " + std::to_string(r.status) +
                              " without a charge: " + r.body);
    }
  }
  for (const auto& [i, list] : charged) {
    if (i < 0 || i >= payments) {
      problem(lost, "a charge of amount " + std::to_string(i + 1000) + " belongs to no payment");
    }
  }
  // Records left unfinished: every record of this run should be terminal
  // (in progress, retryable, or parked for a person is not).
  long open_records = 0;
  for (std::size_t s = 0; s < store->shard_count(); ++s) {
    auto t = store->begin_on_shard(s);
    const auto rows = t->query("SELECT COUNT(*) FROM orpheus_records WHERE state IN (?, ?, ?)",
                               std::int64_t{static_cast<int>(orpheus::record_state::in_progress)},
                               std::int64_t{static_cast<int>(orpheus::record_state::retryable)},
                               std::int64_t{static_cast<int>(orpheus::record_state::parked)});
    t->commit();
    open_records += rows.at(0).get<std::int64_t>(0);
  }
  if (open_records > 0) {
    problem(unfinished, std::to_string(open_records) + " records in progress, retryable or parked",
            open_records);
  }
  if (pending > 0) {
    problem(unfinished, std::to_string(pending) + " journal entries not completed", pending);
  }

  std::cout << "payments " << payments << ", charged " << charges.size() << ", double charges "
            << double_charges << ", lost " << lost << ", unfinished " << unfinished << "\n";
  return double_charges == 0 && lost == 0 && unfinished == 0 ? 0 : 1;
}

// Breaks what the audit checks, twice: charges payment 0 again at the bank
// under a new key, and deletes the record of payment 1. The audit that
// follows must find one double charge and one lost record: an audit that
// passes anyway checks nothing.
int sabotage(examples::flags& f) {
  const auto bank_url = f.str("bank", "");
  const auto stores = f.all("store");
  const auto result_paths = f.all("results");
  f.done();
  if (bank_url.empty() || stores.empty() || result_paths.empty()) {
    f.fail("sabotage needs --bank, --store and --results");
  }
  // The bank fails and drops answers on purpose: send until it says charged
  // (a retry may charge once more; the audit counts payments charged twice).
  const std::string key = "sabotage-" + orpheus::random_token(8);
  for (int attempt = 1;; ++attempt) {
    orpheus::beast::http_request charge{boost::beast::http::verb::post, "/charges", 11};
    charge.set("Idempotency-Key", key);
    charge.body() = json{{"amount", 1000}, {"currency", "EUR"}, {"reference", "sabotage"}}.dump();
    charge.prepare_payload();
    try {
      const auto answer = orpheus::beast::send(orpheus::beast::parse_http_url(bank_url),
                                               std::move(charge), std::chrono::seconds(10));
      if (answer.result_int() == 200 || answer.result_int() == 201) break;
    } catch (const orpheus::beast::transport_error&) {
      // an answer dropped after charging: ask again
    }
    if (attempt == 100) throw std::runtime_error("the bank did not charge payment 0 again");
  }

  const auto store = open_store(stores);
  for (const auto& p : result_paths) {
    results_file r(p);
    for (const auto& x : r.all()) {
      if (x.payment != 1) continue;
      const orpheus::request_id id{"client:" + x.client, x.key, ""};
      auto t = store->begin_on_shard(store->shard_of(id));
      t->execute("DELETE FROM orpheus_records WHERE scope = ? AND idem_key = ?", id.scope, id.key);
      t->commit();
      return 0;
    }
  }
  throw std::runtime_error("payment 1 has no result to forget");
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc < 2 ? "" : argv[1];
  if (mode != "pay" && mode != "audit" && mode != "sabotage") {
    std::cerr << usage;
    return 2;
  }
  examples::flags f(argc - 1, argv + 1, usage);
  try {
    if (mode == "pay") return pay(f);
    return mode == "audit" ? audit(f) : sabotage(f);
  } catch (const std::exception& e) {
    std::cerr << "orpheus_chaos " << mode << ": " << e.what() << "\n";
    return 2;
  }
}
