// A payments service in front of a bank, made idempotent with Orpheus.
// See --help. This file reads the flags and wires the parts together; the
// idempotent endpoint is create_payment.cpp. The others, one job each:
// routes.cpp (which request goes where), payment.cpp (the request body as a
// payment), callers.cpp (who is calling), gateway.cpp (the bank), storage.cpp
// (the store and its schema),
// metrics.cpp (GET /metrics) and purger.cpp (expired records).

#include <sys/resource.h>

#include <algorithm>
#include <iostream>

#include "../common/flags.hpp"
#include "../common/stop_signals.hpp"
#include "callers.hpp"
#include "create_payment.hpp"
#include "gateway.hpp"
#include "metrics.hpp"
#include "orpheus/beast/middleware.hpp"
#include "orpheus/completer.hpp"
#include "purger.hpp"
#include "routes.hpp"
#include "storage.hpp"

namespace {

constexpr const char* usage = R"(payments_server: POST /v1/payments, made idempotent with Orpheus

Usage: payments_server --bank URL --api-keys FILE [flags]
  --api-keys FILE       the callers: one `<key> <client>` per line (a line
                        starting with # is a comment). A caller sends
                        `Authorization: Bearer <key>` and is that client: its
                        idempotency keys and payments are its own. A missing
                        or unknown key is 401. Read at start-up
  --trust-client-id-header  instead, for local testing only: a request is
                        the client its X-Client-Id header names, unchecked
                        (one with Authorization is 401). One of the two is
                        required, and not both
  --port N              listen on 127.0.0.1:N (default 0: any free port)
  --store S             sqlite:PATH (default sqlite:payments.db), or a MySQL
                        shard URL mysql://user:pass@host:port/db; repeat the
                        flag (or separate with commas) for several shards. A
                        shard on a Galera cluster names its nodes:
                        mysql://user:pass@host1:port1,host2:port2/db
                        Each shard is migrated at start; one that does not
                        answer then is migrated when it is back, and its keys
                        are answered 503 (retry later) until then
  --bank URL            the bank, e.g. http://127.0.0.1:9000 (required); or
                        --bank inproc: charge in-process, no HTTP (a ledger
                        with the bank simulator's semantics and no faults), to
                        measure the idempotency layer alone; GET /ledger then
                        answers as the bank simulator's
  --flow steps|single   what POST /v1/payments does at the bank: steps (the
                        default with an HTTP bank): authorise, capture (the
                        pivot), notify the bank's ledger, each recorded, a
                        void when the capture is refused for good
                        (docs/steps.md); single: one charge (POST /charges),
                        as --bank inproc always does and the benchmarks use
  --bank-dedup on|off   whether the bank answers a charge sent again under
                        its key with the first one's outcome (default on, as
                        the bank simulator's --dedup); off: a retry charges
                        again only once an earlier call whose outcome is
                        unknown can no longer reach the bank
                        (--in-doubt-window-ms after its lease); about
                        POST /charges, the one-charge payment (with steps,
                        those a --flow single server began)
  --in-doubt-window-ms N  how late after an attempt's lease the bank may
                        still act on its call (default 300000)
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
                        backlog (default 1024; lowered, with a warning, to
                        `ulimit -n` minus --descriptor-reserve)
  --descriptor-reserve N  file descriptors kept for the store and the bank
                        (default 64 + --workers + 51 on SQLite, or + 32 per
                        MariaDB shard)
  --idle-timeout-ms N   close a keep-alive connection idle this long (60000)
  --header-timeout-ms N close a connection whose request header takes longer
                        (default 10000)
  --retry-window-ms N   a key unfinished after this long is parked for a
                        person (503 request_parked, retry later), never failed
                        (default 86400000)
  --retention-ms N      how long finished keys are kept and replayed
                        (default 604800000; not shorter than the retry window)
  --purge-interval-ms N purge expired records this often (default 60000)
  --purge-batch N       records deleted per statement when purging (1000)
  --completer-ms N      finish payments whose client went away (or whose server
                        was killed): a background completer looks for due ones
                        this often (default 1000; 0: off, only clients finish)
  --replay-cache-mb N   keep up to N MB of finished payments read back from the
                        store in memory, so that their replays need no
                        database round trip (default 16; 0: off). A purge by
                        another server is seen within --replay-cache-ttl-ms
  --replay-cache-ttl-ms N  how long a remembered payment answers before the
                        store is read again (default 60000, or the retention
                        when shorter)

Prints "listening on PORT" once ready; SIGTERM or SIGINT stops it cleanly:
no new connections, the payments in flight finish and are answered, then it
exits 0.

API (the caller authenticates with `Authorization: Bearer <api key>`)
  POST /v1/payments     Idempotency-Key required; body JSON {"amount": 1250,
                        "currency": "EUR", "customer": "cus_1"} or the same
                        fields form-encoded. 201 with the payment; replays
                        carry Idempotent-Replayed: true
  GET /v1/payments/ID   the caller's payment, or 404
  GET /healthz          200 ok
  GET /metrics          Prometheus text format: the library's series
                        (orpheus_*, docs/metrics.md) and the server's
                        (payments_*)
  GET /ledger           (--bank inproc only) the in-process bank's ledger, as
                        the bank simulator's GET /ledger
)";

// Raises this process's soft file descriptor limit toward its hard one, to
// what the connection cap and the reserve need. An application may; the
// library does not (a change for the whole process, and select() cannot
// take a descriptor past 1023: this server calls none). Without it the
// server lowers --max-connections to fit (orpheus::beast::server_options).
void raise_descriptor_limit(long wanted) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY ||
      limit.rlim_cur >= static_cast<rlim_t>(wanted)) {
    return;
  }
  limit.rlim_cur = std::min(limit.rlim_max, static_cast<rlim_t>(wanted));
  (void)::setrlimit(RLIMIT_NOFILE, &limit);  // if refused, the cap is lowered instead
}

}  // namespace

using namespace examples::payments_server;
using orpheus::beast::http_request;
using orpheus::beast::http_response;

int main(int argc, char** argv) {
  examples::flags f(argc, argv, usage, {"trust-client-id-header"});
  const std::string api_keys_path = f.str("api-keys", "");
  const bool trust_client_id_header = f.on("trust-client-id-header");
  const long port = f.num("port", 0, 0, 65535);
  const auto store_specs = [&] {
    try {
      return store_parts(f.all("store"));
    } catch (const std::exception& e) {
      f.fail(e.what());
    }
  }();
  const std::string bank_url = f.str("bank", "");
  const std::string flow = f.str("flow", bank_url == "inproc" ? "single" : "steps");
  orpheus::config cfg;
  cfg.lease = std::chrono::milliseconds(f.millis("lease-ms", 10000, 1));
  cfg.rpc_timeout = std::chrono::milliseconds(f.millis("rpc-timeout-ms", 5000, 1));
  cfg.in_doubt_window =
      std::chrono::milliseconds(f.millis("in-doubt-window-ms", cfg.in_doubt_window.count(), 1));
  const std::string bank_dedup = f.str("bank-dedup", "on");
  const auto wait = std::chrono::milliseconds(f.millis("wait-ms", 0));
  const long workers = f.num("workers", is_sqlite(store_specs) ? 32 : 8, 1, 4096);
  const long queue = f.num("queue", 256, 1, 1L << 20);
  const long max_connections = f.num("max-connections", 1024, 1, 1L << 20);
  // What the rest of the server may hold open at once, by default: the
  // bank's kept-alive connections (one per worker at most), the store's, and
  // 64 for the rest (listening socket, io threads' polls, logs).
  const long descriptor_reserve =
      f.num("descriptor-reserve", 64 + workers + store_descriptors(store_specs), 0, 1L << 20);
  // At most a year, as orpheus::beast::server takes (refused here, before
  // the store is opened).
  constexpr long year_ms = 365L * 24 * 3600 * 1000;
  const long idle_timeout = f.num("idle-timeout-ms", 60000, 1, year_ms);
  const long header_timeout = f.num("header-timeout-ms", 10000, 1, year_ms);
  cfg.retry_window = std::chrono::milliseconds(f.millis("retry-window-ms", 24L * 3600 * 1000, 1));
  cfg.retention = std::chrono::milliseconds(f.millis("retention-ms", 7L * 24 * 3600 * 1000, 1));
  const long purge_interval = f.millis("purge-interval-ms", 60000, 1);
  const long purge_batch = f.num("purge-batch", 1000, 1, 1L << 20);
  const long replay_cache_mb = f.num("replay-cache-mb", 16, 0, 1024L * 1024);
  // At most 24 hours, as orpheus::completer takes (refused here, before the
  // store is opened; found in review).
  const long completer_ms = f.num("completer-ms", 1000, 0, 24L * 3600 * 1000);
  cfg.replay_cache_ttl = std::chrono::milliseconds(f.millis(
      "replay-cache-ttl-ms", std::min<long>(60000, static_cast<long>(cfg.retention.count())), 1));
  f.done();
  if (bank_url.empty()) f.fail("--bank is required");
  if (!api_keys_path.empty() && trust_client_id_header) {
    f.fail(
        "--trust-client-id-header cannot be combined with --api-keys: a caller without a key "
        "could name a key holder in X-Client-Id");
  }
  if (flow != "steps" && flow != "single") f.fail("--flow is steps or single");
  if (bank_dedup != "on" && bank_dedup != "off") f.fail("--bank-dedup is on or off");
  // With --flow steps it is about the payments made in one charge that such a
  // server still finishes (found in review: refused there, a steps server
  // resumed a one-charge payment begun under --bank-dedup off as if the bank
  // deduplicated, and charged it again while the first charge was still in
  // flight). The payment in steps relies on the bank deduplicating its
  // authorise, capture and void.
  if (bank_dedup == "off" && bank_url == "inproc") {
    f.fail("--bank-dedup off is for an HTTP bank: the in-process bank deduplicates");
  }
  if (flow == "steps" && bank_url == "inproc") f.fail("--bank inproc charges in one step only");
  cfg.replay_cache_bytes = static_cast<std::size_t>(replay_cache_mb) << 20;
  // Before the store opens: a refused setting changes nothing (found in
  // review: a lease no longer than the RPC timeout was refused by the
  // manager after the file was created, migrated and given a shard map).
  orpheus::process_options wait_options;
  wait_options.wait_for = wait;
  std::optional<orpheus::beast::http_endpoint> bank_endpoint;  // none with --bank inproc
  try {
    orpheus::validate(cfg);
    orpheus::validate(wait_options);
    if (bank_url != "inproc") bank_endpoint = orpheus::beast::parse_http_url(bank_url);
  } catch (const std::exception& e) {
    f.fail(e.what());
  }
  // The alert for a payment out of attempts (issue 11): one line on stderr,
  // once per parking. A real service pages someone; `orpheusctl list
  // --state parked` shows them all.
  cfg.on_parked = [](const orpheus::parked_event& e) {
    std::cerr << "ALERT: payment parked for an operator: client " << e.scope << " key " << e.key
              << ", " << e.reason << " after " << e.attempts << " attempts"
              << (e.in_doubt ? " (the parking's commit was in doubt)" : "")
              << "; last error: " << e.last_error << std::endl;
  };

  try {
    // Before anything else: a bad key file stops the server at start-up.
    std::optional<orpheus::api_keys> keys;
    if (!api_keys_path.empty()) keys = orpheus::api_keys::load(api_keys_path);
    const callers who(std::move(keys), trust_client_id_header);
    // Before any thread starts, the store's too: a thread that took SIGTERM
    // would kill the process without the drain (found in review: the store
    // was opened first).
    const examples::stop_signals stop;
    auto store = open_store(store_specs);
    // A shard that does not answer now is prepared later (late_shards, below).
    std::vector<std::size_t> late = prepare_shards(*store, is_sqlite(store_specs));
    metrics stats(store->shard_count());  // GET /metrics: the library's series and ours
    cfg.observer = stats.library_observer();
    orpheus::manager manager(*store, cfg);  // refuses rpc_timeout >= lease

    const late_shards preparing(*store, std::move(late), std::chrono::seconds(1));
    // Its io thread starts here, after the signals are blocked; declared
    // before the work pool, so it outlives every job that calls the bank.
    std::unique_ptr<orpheus::payment::gateway> bank;
    inproc_bank* inproc = nullptr;      // set with --bank inproc: serves GET /ledger
    bank_gateway* http_bank = nullptr;  // set with an HTTP bank
    if (bank_url == "inproc") {
      auto b = std::make_unique<inproc_bank>();
      inproc = b.get();
      bank = std::move(b);
    } else {
      auto b = std::make_unique<bank_gateway>(*bank_endpoint, static_cast<std::size_t>(workers),
                                              bank_dedup == "on");
      http_bank = b.get();
      bank = std::move(b);
    }

    // Before serving. Both, with steps: a payment made in one charge (by an
    // older server, or with --flow single, on the same store) is still
    // finished as one, by its client's retry or the completer.
    register_create_payment(manager, *bank);
    if (flow == "steps") register_create_payment_in_steps(manager, *http_bank);
    orpheus::work_pool pool(static_cast<std::size_t>(workers), static_cast<std::size_t>(queue));
    orpheus::beast::middleware_options mw_options;
    mw_options.scope = [&who](const http_request& req) { return who.scope_of(req); };
    mw_options.wait.wait_for = wait;
    mw_options.observe = [&](const http_request& req, const http_response& res,
                             std::chrono::microseconds took) { stats.observe(req, res, took); };
    orpheus::beast::middleware mw(manager, pool, std::move(mw_options));
    // Declared after the middleware, so destroyed before it on any way out
    // (an exception too): no job outlives what it uses.
    const struct pool_drainer {
      orpheus::work_pool& pool;
      ~pool_drainer() { pool.drain(); }
    } pool_drained{pool};

    orpheus::beast::server_options server_options;
    server_options.port = static_cast<unsigned short>(port);
    server_options.io_threads = 2;
    server_options.max_connections = static_cast<std::size_t>(max_connections);
    server_options.descriptor_reserve = static_cast<std::size_t>(descriptor_reserve);
    raise_descriptor_limit(max_connections + descriptor_reserve);
    server_options.idle_timeout = std::chrono::milliseconds(idle_timeout);
    server_options.header_timeout = std::chrono::milliseconds(header_timeout);
    orpheus::beast::server server(
        server_options,
        routes({mw, who, *store, inproc, stats, flow == "steps" ? steps_handler : single_handler}));
    purger purge(manager, std::chrono::milliseconds(purge_interval),
                 static_cast<std::size_t>(purge_batch),
                 [&stats](std::size_t n) { stats.purged(n); });
    // After everything it uses, so destroyed (and stopped) before them.
    std::optional<orpheus::completer> completer;
    if (completer_ms > 0) {
      completer.emplace(manager, orpheus::completer_options{
                                     .idle_wait = std::chrono::milliseconds(completer_ms)});
    }
    server.start();
    if (completer) completer->start();
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
    if (completer) completer->stop();  // lets its running payment finish
    pool.drain();
    server.stop();
    purge.stop();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "payments_server: " << e.what() << "\n";
    return 1;
  }
}
