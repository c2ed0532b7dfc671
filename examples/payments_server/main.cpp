// A payments service in front of a bank, made idempotent with Orpheus.
// See --help.

#include <condition_variable>
#include <iostream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "../common/flags.hpp"
#include "../common/stop_signals.hpp"
#include "orpheus/beast/client.hpp"
#include "orpheus/beast/middleware.hpp"
#include "orpheus/beast/server.hpp"
#include "orpheus/log.hpp"
#include "orpheus/payment/charge.hpp"
#include "orpheus/store/mysql.hpp"
#include "orpheus/store/sqlite.hpp"
#include "payment.hpp"

namespace {

constexpr const char* usage = R"(payments_server: POST /v1/payments, made idempotent with Orpheus

Usage: payments_server --bank URL [flags]
  --port N              listen on 127.0.0.1:N (default 0: any free port)
  --store S             sqlite:PATH (default sqlite:payments.db), or a MySQL
                        shard URL mysql://user:pass@host:port/db; repeat the
                        flag (or separate with commas) for several shards
  --bank URL            the bank, e.g. http://127.0.0.1:9000 (required); or
                        --bank inproc: charge in-process, no HTTP (a ledger
                        with the bank simulator's semantics and no faults), to
                        measure the idempotency layer alone; GET /ledger then
                        answers as the bank simulator's
  --lease-ms N          lease of an attempt on a key (default 10000)
  --rpc-timeout-ms N    deadline of the bank call, < lease (default 5000)
  --wait-ms N           wait this long for a concurrent attempt on the same key
                        instead of answering 409 at once (default 0)
  --workers N           threads for database and bank work (default 32 on
                        SQLite, 8 on MySQL). A payment holds one while it
                        waits for its commit or the bank; on SQLite the
                        commits of the payments waiting at once share one
                        fsync, so more make fewer, larger commits; on MySQL
                        the server groups commits itself, and more workers
                        only wait for the pooled connections
  --queue N             requests queued for them before 503 (default 256)
  --max-connections N   connections served at once; more wait in the listen
                        backlog (default 1024; keep it under `ulimit -n`)
  --idle-timeout-ms N   close a keep-alive connection idle this long (60000)
  --header-timeout-ms N close a connection whose request header takes longer
                        (default 10000)
  --retry-window-ms N   a key unfinished after this long fails for good
                        (default 86400000)
  --retention-ms N      how long finished keys are kept and replayed
                        (default 604800000; not shorter than the retry window)
  --purge-interval-ms N purge expired records this often (default 60000)
  --purge-batch N       records deleted per statement when purging (1000)

Prints "listening on PORT" once ready; SIGTERM or SIGINT stops it cleanly:
no new connections, the payments in flight finish and are answered, then it
exits 0.

API (the caller is identified by the X-Client-Id header)
  POST /v1/payments     Idempotency-Key required; body JSON {"amount": 1250,
                        "currency": "EUR", "customer": "cus_1"} or the same
                        fields form-encoded. 201 with the payment; replays
                        carry Idempotent-Replayed: true
  GET /v1/payments/ID   the caller's payment, or 404
  GET /healthz          200 ok
  GET /metrics          Prometheus text format
  GET /ledger           (--bank inproc only) the in-process bank's ledger, as
                        the bank simulator's GET /ledger
)";

namespace http = boost::beast::http;
using orpheus::beast::http_request;
using orpheus::beast::http_response;
using orpheus::beast::make_response;

// ---- metrics ---------------------------------------------------------------

class metrics {
 public:
  void observe(const http_request& req, const http_response& res, std::chrono::microseconds took) {
    std::lock_guard lock(m_);
    const bool replay = res.find("Idempotent-Replayed") != res.end();
    std::string outcome = replay ? "replayed" : std::to_string(res.result_int() / 100) + "xx";
    if (res.result_int() == 409) outcome = "conflict";
    ++requests_[std::string(req.method_string()) + "\",outcome=\"" + outcome];
    const double s = static_cast<double>(took.count()) / 1e6;
    for (std::size_t i = 0; i < bounds_.size(); ++i) {
      if (s <= bounds_[i]) ++buckets_[i];
    }
    ++count_;
    sum_ += s;
  }
  void takeover() {
    std::lock_guard lock(m_);
    ++takeovers_;
  }
  void purged(std::size_t n) {
    std::lock_guard lock(m_);
    purged_ += static_cast<long>(n);
  }
  std::string text() {
    std::lock_guard lock(m_);
    std::ostringstream o;
    o << "# HELP payments_requests_total Requests answered, by method and outcome.\n"
         "# TYPE payments_requests_total counter\n";
    for (const auto& [k, n] : requests_)
      o << "payments_requests_total{method=\"" << k << "\"} " << n << "\n";
    o << "# HELP payments_lease_takeovers_total Attempts that took over an expired or retryable "
         "key.\n"
         "# TYPE payments_lease_takeovers_total counter\n"
         "payments_lease_takeovers_total "
      << takeovers_
      << "\n"
         "# HELP payments_records_purged_total Expired idempotency records deleted.\n"
         "# TYPE payments_records_purged_total counter\n"
         "payments_records_purged_total "
      << purged_
      << "\n"
         "# HELP payments_request_duration_seconds Time to answer a request.\n"
         "# TYPE payments_request_duration_seconds histogram\n";
    for (std::size_t i = 0; i < bounds_.size(); ++i) {
      o << "payments_request_duration_seconds_bucket{le=\"" << bounds_[i] << "\"} " << buckets_[i]
        << "\n";
    }
    o << "payments_request_duration_seconds_bucket{le=\"+Inf\"} " << count_ << "\n"
      << "payments_request_duration_seconds_sum " << sum_ << "\n"
      << "payments_request_duration_seconds_count " << count_ << "\n";
    return o.str();
  }

 private:
  std::mutex m_;
  std::map<std::string, long> requests_;
  const std::vector<double> bounds_{0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5};
  std::vector<long> buckets_ = std::vector<long>(8);
  long count_ = 0, takeovers_ = 0, purged_ = 0;
  double sum_ = 0;
};

// ---- the payment (payment.hpp) ---------------------------------------------

using examples::payments_server::parse_payment;
using examples::payments_server::payment;

// ---- the bank, as an orpheus::payment::gateway ------------------------------

// The bank simulator's protocol; orpheus::payment::charge_once() does the
// rest (downstream key, status query first on retries, classification).
//
// Every bank call goes through one http_client: kept-alive connections, at
// most one per worker (a worker makes one bank call at a time), instead of a
// new io_context, socket, epoll instance and timerfd per call (issue 8). A
// charge is never re-sent by the client once written (at_most_once): a lost
// answer is `reset`, and charge_once() asks the bank for the status. The
// status query is a read, so it may be re-sent (idempotent).
class bank_gateway final : public orpheus::payment::gateway {
 public:
  bank_gateway(orpheus::beast::http_endpoint bank, std::size_t connections)
      : bank_(std::move(bank)),
        http_(orpheus::beast::http_client_options{.max_connections_per_endpoint = connections}) {}

  orpheus::payment::gateway_answer charge(const orpheus::payment::charge_request& r,
                                          const std::string& key,
                                          std::chrono::milliseconds timeout) override {
    http_request req{http::verb::post, "/charges", 11};
    req.set("Idempotency-Key", key);
    req.set(http::field::content_type, "application/json");
    req.body() =
        nlohmann::json{{"amount", r.amount}, {"currency", r.currency}, {"reference", r.reference}}
            .dump();
    return call(std::move(req), timeout, orpheus::beast::delivery::at_most_once);
  }

  orpheus::payment::gateway_answer status(const std::string& key,
                                          std::chrono::milliseconds timeout) override {
    return call(http_request{http::verb::get, "/charges/" + key, 11}, timeout,
                orpheus::beast::delivery::idempotent);
  }

 private:
  orpheus::payment::gateway_answer call(http_request req, std::chrono::milliseconds timeout,
                                        orpheus::beast::delivery d) {
    using orpheus::payment::gateway_status;
    http_response res;
    try {
      res = http_.send(bank_, std::move(req), timeout, d);
    } catch (const orpheus::beast::transport_error& e) {
      // The detail reaches the client's answer: a fixed text, never what()
      // with the bank's host and port (issue 7, defect 13). what() is logged.
      orpheus::log(orpheus::log_level::warning, std::string("payments_server: bank: ") + e.what());
      switch (e.error_kind()) {
        case orpheus::beast::transport_error::kind::connect:
          return {gateway_status::connect_failed, "", "no connection to the bank"};
        case orpheus::beast::transport_error::kind::timeout:
          return {gateway_status::timeout, "", "the bank did not answer in time"};
        case orpheus::beast::transport_error::kind::closed:
          return {gateway_status::reset, "", "the connection to the bank broke"};
      }
    }
    const unsigned status = res.result_int();
    const auto body = nlohmann::json::parse(res.body(), nullptr, false);
    // A member that is missing or not a string reads as "": a bank answer
    // of another shape must not throw out of the gateway (issue 7.14).
    auto text = [&](const char* name) -> std::string {
      if (!body.is_object()) return "";
      const auto it = body.find(name);
      return it != body.end() && it->is_string() ? it->get<std::string>() : "";
    };
    const std::string detail = "bank answered " + std::to_string(status);
    if (status == 404) return {gateway_status::not_found, "", detail};
    if (text("status") == "charged") return {gateway_status::charged, text("charge_id"), detail};
    if (status == 402 || text("status") == "declined") {
      return {gateway_status::declined, "", detail};
    }
    // Everything else through the wrapper's one mapping: a 409 (the charge is
    // still running there) or a 429 is not a refusal (issue 7.5). A 2xx that
    // says neither charged nor declined carries no charge id: unknown.
    const auto mapped = orpheus::payment::status_of_http(status);
    return {mapped == gateway_status::charged ? gateway_status::server_error : mapped, "", detail};
  }

  orpheus::beast::http_endpoint bank_;
  orpheus::beast::http_client http_;
};

// ---- an in-process bank (--bank inproc), for benchmarks ---------------------

// The bank simulator's ledger without the HTTP: one charge per idempotency
// key, every later charge or status query with that key answers the first
// outcome, never a fault. Its maps grow with every key (about 150 bytes
// each): measure memory over long runs with the HTTP bank.
class inproc_bank final : public orpheus::payment::gateway {
 public:
  orpheus::payment::gateway_answer charge(const orpheus::payment::charge_request& r,
                                          const std::string& key,
                                          std::chrono::milliseconds) override {
    std::lock_guard lock(m_);
    auto [it, fresh] = by_key_.try_emplace(key);
    if (fresh) {
      it->second = "ch_" + std::to_string(++charges_);
      ++charged_refs_[r.reference];
    }
    return {orpheus::payment::gateway_status::charged, it->second, "charged in-process"};
  }

  orpheus::payment::gateway_answer status(const std::string& key,
                                          std::chrono::milliseconds) override {
    std::lock_guard lock(m_);
    const auto it = by_key_.find(key);
    if (it == by_key_.end()) return {orpheus::payment::gateway_status::not_found, "", "unknown"};
    return {orpheus::payment::gateway_status::charged, it->second, "charged in-process"};
  }

  /// The bank simulator's GET /ledger.
  std::string ledger() {
    std::lock_guard lock(m_);
    int doubles = 0;
    for (const auto& [ref, n] : charged_refs_) doubles += n > 1 ? 1 : 0;
    return nlohmann::json{{"charges", charges_},
                          {"keys", by_key_.size()},
                          {"references", charged_refs_.size()},
                          {"double_charges", doubles}}
        .dump();
  }

 private:
  std::mutex m_;
  std::map<std::string, std::string> by_key_;
  std::map<std::string, int> charged_refs_;
  long charges_ = 0;
};

// The --store flags, one entry per shard (commas split too).
std::vector<std::string> store_parts(const std::vector<std::string>& specs) {
  std::vector<std::string> parts;
  for (const auto& s : specs) {
    std::stringstream ss(s);
    for (std::string p; std::getline(ss, p, ',');) {
      if (!p.empty()) parts.push_back(p);
    }
  }
  if (parts.empty()) parts.push_back("sqlite:payments.db");
  return parts;
}

bool is_sqlite(const std::vector<std::string>& parts) {
  return parts.size() == 1 && parts[0].rfind("sqlite:", 0) == 0;
}

std::unique_ptr<orpheus::store> open_store(const std::vector<std::string>& parts) {
  if (is_sqlite(parts)) {
    return std::make_unique<orpheus::sqlite_store>(orpheus::sqlite_options{parts[0].substr(7)});
  }
  orpheus::mysql_options o;
  for (const auto& p : parts) o.shards.push_back(orpheus::parse_mysql_url(p));
  return std::make_unique<orpheus::mysql_store>(o);
}

// Deletes expired idempotency records every `every`, a bounded batch per
// statement and a bounded number of batches per round, so that the records
// table does not grow without limit (issue 7, defect 12). stop() wakes it and
// joins; a purge in progress finishes its batch first.
class purger {
 public:
  purger(orpheus::manager& m, metrics& stats, std::chrono::milliseconds every, std::size_t batch)
      : manager_(m), stats_(stats), every_(every), batch_(batch), thread_([this] { run(); }) {}
  purger(const purger&) = delete;
  purger& operator=(const purger&) = delete;
  ~purger() { stop(); }

  void stop() {
    {
      std::lock_guard lock(m_);
      stopping_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void run() {
    std::unique_lock lock(m_);
    while (!wake_.wait_for(lock, every_, [&] { return stopping_; })) {
      lock.unlock();
      try {
        // At most 100 batches a round: a backlog is worked off over several
        // rounds instead of holding the database busy in one go.
        for (int i = 0; i < 100; ++i) {
          const std::size_t n = manager_.purge_expired(batch_);
          stats_.purged(n);
          if (n < batch_) break;
          std::lock_guard check(m_);
          if (stopping_) break;
        }
      } catch (const std::exception& e) {
        orpheus::log(orpheus::log_level::warning,
                     std::string("payments_server: purge failed, retried next round: ") + e.what());
      }
      lock.lock();
    }
  }

  orpheus::manager& manager_;
  metrics& stats_;
  std::chrono::milliseconds every_;
  std::size_t batch_;
  std::mutex m_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace

int main(int argc, char** argv) {
  examples::flags f(argc, argv, usage);
  const long port = f.num("port", 0);
  const auto store_specs = store_parts(f.all("store"));
  const std::string bank_url = f.str("bank", "");
  orpheus::config cfg;
  cfg.lease = std::chrono::milliseconds(f.num("lease-ms", 10000));
  cfg.rpc_timeout = std::chrono::milliseconds(f.num("rpc-timeout-ms", 5000));
  const auto wait = std::chrono::milliseconds(f.num("wait-ms", 0));
  const long workers = f.num("workers", is_sqlite(store_specs) ? 32 : 8);
  const long queue = f.num("queue", 256);
  const long max_connections = f.num("max-connections", 1024);
  const long idle_timeout = f.num("idle-timeout-ms", 60000);
  const long header_timeout = f.num("header-timeout-ms", 10000);
  cfg.retry_window = std::chrono::milliseconds(f.num("retry-window-ms", 24L * 3600 * 1000));
  cfg.retention = std::chrono::milliseconds(f.num("retention-ms", 7L * 24 * 3600 * 1000));
  const long purge_interval = f.num("purge-interval-ms", 60000);
  const long purge_batch = f.num("purge-batch", 1000);
  f.done();
  if (bank_url.empty()) f.fail("--bank is required");
  if (port < 0 || port > 65535 || workers < 1 || queue < 1)
    f.fail("--port, --workers or --queue out of range");
  if (max_connections < 1 || idle_timeout < 1 || header_timeout < 1)
    f.fail("--max-connections, --idle-timeout-ms and --header-timeout-ms must be positive");
  if (purge_interval < 1 || purge_batch < 1)
    f.fail("--purge-interval-ms and --purge-batch must be positive");

  try {
    std::optional<orpheus::beast::http_endpoint> bank_endpoint;  // none with --bank inproc
    if (bank_url != "inproc") bank_endpoint = orpheus::beast::parse_http_url(bank_url);
    auto store = open_store(store_specs);
    store->migrate();
    for (std::size_t s = 0; s < store->shard_count(); ++s) {
      auto t = store->begin_on_shard(s);
      t->execute(
          "CREATE TABLE IF NOT EXISTS payments (id VARCHAR(64) PRIMARY KEY, "
          "client VARCHAR(255) NOT NULL, amount BIGINT NOT NULL, currency CHAR(3) NOT NULL, "
          "customer VARCHAR(64) NOT NULL, state VARCHAR(32) NOT NULL, charge_id VARCHAR(64))");
      t->commit();
    }
    orpheus::manager manager(*store, cfg);  // refuses rpc_timeout >= lease

    const examples::stop_signals stop;  // before any thread starts
    // Its io thread starts here, after the signals are blocked; declared
    // before the work pool, so it outlives every job that calls the bank.
    std::unique_ptr<orpheus::payment::gateway> bank;
    inproc_bank* inproc = nullptr;  // set with --bank inproc: serves GET /ledger
    if (bank_url == "inproc") {
      auto b = std::make_unique<inproc_bank>();
      inproc = b.get();
      bank = std::move(b);
    } else {
      bank = std::make_unique<bank_gateway>(*bank_endpoint, static_cast<std::size_t>(workers));
    }

    metrics stats;
    orpheus::beast::work_pool pool(static_cast<std::size_t>(workers),
                                   static_cast<std::size_t>(queue));
    orpheus::beast::middleware_options mw_options;
    mw_options.scope = [](const http_request& req) -> std::optional<std::string> {
      const auto id = req["X-Client-Id"];  // stands in for real authentication
      if (id.empty()) return std::nullopt;
      return "client:" + std::string(id);
    };
    mw_options.wait.wait_for = wait;
    mw_options.observe = [&](const http_request& req, const http_response& res,
                             std::chrono::microseconds took) { stats.observe(req, res, took); };
    orpheus::beast::middleware mw(manager, pool, std::move(mw_options));
    // Declared after the middleware, so destroyed before it on any way out
    // (an exception too): no job outlives what it uses.
    const struct pool_drainer {
      orpheus::beast::work_pool& pool;
      ~pool_drainer() { pool.drain(); }
    } pool_drained{pool};

    auto on_request = [&](http_request&& req, orpheus::beast::responder respond) {
      const std::string target(req.target());
      if (req.method() == http::verb::post && target == "/v1/payments") {
        const std::string client(req["X-Client-Id"]);
        mw.handle(
            std::move(req), respond,
            [&store, client](orpheus::tx& tx, const http_request& r) {  // Pre-RPC
              payment p = parse_payment(r);
              // The payment id names its shard, so GET can find it.
              p.id = "pay_" + std::to_string(tx.shard()) + "_" + orpheus::random_token(10);
              tx.execute(
                  "INSERT INTO payments (id, client, amount, currency, customer, state) "
                  "VALUES (?, ?, ?, ?, ?, 'pending')",
                  p.id, client, p.amount, p.currency, p.customer);
              return p;
            },
            [&](const orpheus::attempt& a, const payment& p) {  // RPC
              if (a.is_retry()) stats.takeover();
              return orpheus::payment::charge_once(*bank, a, {p.id, p.amount, p.currency});
            },
            [](orpheus::tx& tx, const orpheus::attempt&, const payment& p,
               const orpheus::outcome<std::string>& o) {  // Post-RPC
              if (!o.ok()) {
                tx.execute("UPDATE payments SET state = ? WHERE id = ?",
                           o.retryable() ? "pending" : o.error().code, p.id);
                return orpheus::problem_response(o.error());
              }
              tx.execute("UPDATE payments SET state = 'succeeded', charge_id = ? WHERE id = ?",
                         o.value(), p.id);
              nlohmann::json body = p;
              body["status"] = "succeeded";
              body["charge_id"] = o.value();
              return orpheus::response{201, {{"Content-Type", "application/json"}}, body.dump()};
            });
        return;
      }
      if (req.method() == http::verb::get && target.rfind("/v1/payments/", 0) == 0) {
        return mw.run_blocking(std::move(req), respond, [&store](const http_request& r) {
          const std::string id = std::string(r.target()).substr(13);
          const std::string client(r["X-Client-Id"]);
          std::size_t shard = 0;
          if (id.rfind("pay_", 0) == 0) shard = std::strtoul(id.c_str() + 4, nullptr, 10);
          if (client.empty() || shard >= store->shard_count()) {
            return make_response(404, R"({"error":"not found"})", "application/json");
          }
          auto t = store->begin_on_shard(shard);
          // Scoped to the caller: another client's payment is "not found".
          const auto rows = t->query(
              "SELECT id, amount, currency, customer, state, charge_id "
              "FROM payments WHERE id = ? AND client = ?",
              id, client);
          t->commit();
          if (rows.empty())
            return make_response(404, R"({"error":"not found"})", "application/json");
          const auto& row = rows[0];
          nlohmann::json j{{"id", row.get<std::string>(0)},
                           {"amount", row.get<std::int64_t>(1)},
                           {"currency", row.get<std::string>(2)},
                           {"customer", row.get<std::string>(3)},
                           {"status", row.get<std::string>(4)},
                           {"charge_id", row.is_null(5) ? "" : row.get<std::string>(5)}};
          return make_response(200, j.dump(), "application/json");
        });
      }
      if (req.method() == http::verb::get && target == "/healthz")
        return respond(make_response(200, "ok\n"));
      if (inproc != nullptr && req.method() == http::verb::get && target == "/ledger") {
        return respond(make_response(200, inproc->ledger(), "application/json"));
      }
      if (req.method() == http::verb::get && target == "/metrics") {
        return respond(make_response(200, stats.text(), "text/plain; version=0.0.4"));
      }
      respond(make_response(404, "not found\n"));
    };

    orpheus::beast::server_options server_options;
    server_options.port = static_cast<unsigned short>(port);
    server_options.io_threads = 2;
    server_options.max_connections = static_cast<std::size_t>(max_connections);
    server_options.idle_timeout = std::chrono::milliseconds(idle_timeout);
    server_options.header_timeout = std::chrono::milliseconds(header_timeout);
    orpheus::beast::server server(server_options, on_request);
    purger purge(manager, stats, std::chrono::milliseconds(purge_interval),
                 static_cast<std::size_t>(purge_batch));
    server.start();
    std::cout << "listening on " << server.port() << std::endl;
    stop.wait();
    std::cerr << "payments_server: stopping\n";
    // Issue 7, defect 7: the pool's jobs use the middleware, the manager, the
    // store and the server's connections. It used to be drained by its
    // destructor, after the middleware was gone. Now, in order: no new
    // connections; the payments in flight finish and are answered; then the
    // connections close; then the purger stops; only then do the objects the
    // jobs used go (in reverse order of declaration, as `pool_drained` runs
    // on every way out of this block).
    server.stop_accepting();
    pool.drain();
    server.stop();
    purge.stop();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "payments_server: " << e.what() << "\n";
    return 1;
  }
}
