// A payment process for crash tests: the parent starts it, waits for it to
// reach a crash point, and kills it with SIGKILL; then starts it again to
// retry. The "bank" is a ledger file of downstream keys (one line per charge),
// which deduplicates like a real gateway would when asked first.
//
//   crash_child STORE SCOPE KEY LEDGER CRASH_AT [steps | declined]
//     STORE     sqlite:PATH or mysql://u:p@host:port/db
//     CRASH_AT  none | before_charge | after_charge | in_post | after_commit
//     with `steps`, a request of three steps (authorise, capture: the pivot,
//     notify; orpheus/steps.hpp) whose ledger lines are "OP KEY", and every
//     call is also logged to LEDGER.calls as "OP ATTEMPT":
//     CRASH_AT  none | before_X | after_X (X each step) | after_commit
//     with `declined`, the same steps, but the capture is declined for good
//     on every call, so the request turns back: the authorisation is voided
//     (its compensation asks the ledger first, like the steps), and the
//     decline recorded.
//     CRASH_AT  none | before_void | after_void
// Prints "AT <point>" when it reaches the crash point, then sleeps until
// killed. Without a crash it prints "STATUS <n> REPLAYED <0|1> RETRY <0|1>"
// and exits 0, or "ERROR <code> RETRYABLE <0|1> AFTER_MS <n>" and exits 3.
#include <fcntl.h>
#include <unistd.h>

#include <fstream>
#include <iostream>
#include <string>
#include <thread>

#include "orpheus/manager.hpp"
#include "orpheus/steps.hpp"
#include "orpheus/store/mysql.hpp"
#include "orpheus/store/sqlite.hpp"

namespace {

void reach(const std::string& point, const std::string& crash_at) {
  if (point != crash_at) return;
  std::cout << "AT " << point << std::endl;
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));  // wait for SIGKILL
}

bool ledger_has(const std::string& ledger, const std::string& key) {
  std::ifstream in(ledger);
  for (std::string line; std::getline(in, line);) {
    if (line == key) return true;
  }
  return false;
}

void ledger_charge(const std::string& ledger, const std::string& key) {
  const int fd = ::open(ledger.c_str(), O_WRONLY | O_APPEND | O_CREAT, 0644);
  const std::string line = key + "\n";
  if (fd < 0 || ::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size()) ||
      ::fsync(fd) != 0) {
    std::cerr << "ledger write failed\n";
    std::_Exit(4);
  }
  ::close(fd);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string flow_kind = argc == 7 ? argv[6] : "";
  if (argc != 6 && !(argc == 7 && (flow_kind == "steps" || flow_kind == "declined"))) {
    std::cerr << "usage: crash_child STORE SCOPE KEY LEDGER CRASH_AT|row [steps | declined]\n";
    return 2;
  }
  const bool with_steps = argc == 7;
  const bool declined = flow_kind == "declined";
  const std::string store_arg = argv[1];
  const orpheus::request_id id{argv[2], argv[3], orpheus::fingerprint_of("amount=100")};
  const std::string ledger = argv[4];
  const std::string crash_at = argv[5];

  std::unique_ptr<orpheus::store> store;
  if (store_arg.rfind("sqlite:", 0) == 0) {
    store = std::make_unique<orpheus::sqlite_store>(orpheus::sqlite_options{store_arg.substr(7)});
  } else {
    orpheus::mysql_options o;
    o.shards.push_back(orpheus::parse_mysql_url(store_arg));
    store = std::make_unique<orpheus::mysql_store>(o);
  }
  store->migrate();
  {
    auto t = store->begin_on_shard(store->shard_of(id));
    t->execute(
        "CREATE TABLE IF NOT EXISTS crash_payments (id VARCHAR(255) PRIMARY KEY, "
        "result VARCHAR(64))");
    t->commit();
  }
  if (crash_at == "row") {  // what Post-RPC (or the last step's SQL) left in the payment's row
    const std::string pid = id.scope + "/" + id.key;
    auto t = store->begin_on_shard(store->shard_of(id));
    const auto rows = t->query("SELECT result FROM crash_payments WHERE id = ?", pid);
    t->commit();
    std::cout << "ROW "
              << (rows.empty()         ? "<none>"
                  : rows[0].is_null(0) ? "<null>"
                                       : rows[0].get<std::string>(0))
              << std::endl;
    return 0;
  }

  orpheus::config cfg;
  cfg.lease = std::chrono::milliseconds(1500);
  cfg.rpc_timeout = std::chrono::milliseconds(1000);
  orpheus::manager m(*store, cfg);
  const std::string pid = id.scope + "/" + id.key;
  bool was_retry = false;
  // With `steps`: each step asks the ledger before acting (a bank that deduplicates by
  // key), and its SQL marks the payment's row.
  orpheus::steps<std::string> flow;
  for (const std::string op : {"authorise", "capture", "notify"}) {
    auto s = flow.step(
        op, [&, op](const orpheus::attempt& a, const std::string&, const orpheus::step_results&) {
          was_retry = a.is_retry();
          ledger_charge(ledger + ".calls", op + " " + std::to_string(a.number()));
          reach("before_" + op, crash_at);
          if (declined && op == "capture") {
            throw orpheus::non_retryable_error("card_declined", "the capture was declined", 402);
          }
          const std::string line = op + " " + a.downstream_key(op);
          if (!ledger_has(ledger, line)) ledger_charge(ledger, line);
          reach("after_" + op, crash_at);
          return line;
        });
    s.post(
        [&, op](orpheus::tx& t, const orpheus::attempt&, const std::string&, const std::string&) {
          t.execute("UPDATE crash_payments SET result = ? WHERE id = ?", op, pid);
        });
    if (op == "authorise") {
      s.compensate([&](const orpheus::attempt& a, const std::string&, const std::string&) {
        ledger_charge(ledger + ".calls", "void " + std::to_string(a.number()));
        reach("before_void", crash_at);
        const std::string line = "void " + a.downstream_key("void");
        if (!ledger_has(ledger, line)) ledger_charge(ledger, line);
        reach("after_void", crash_at);
      });
    }
    if (op == "capture") s.pivot();
  }
  flow.respond([](orpheus::tx&, const orpheus::attempt&, const std::string&,
                  const orpheus::step_results& done) {
    return orpheus::response{201, {}, done.get<std::string>("notify")};
  });
  const auto pre = [&](orpheus::tx& t) {
    t.execute("INSERT INTO crash_payments (id) VALUES (?)", pid);
    return pid;
  };
  // Without `steps`: one charge.
  const auto charge = [&](const orpheus::attempt& a, const std::string&) {
    was_retry = a.is_retry();
    const auto key = a.downstream_key("charge");
    reach("before_charge", crash_at);
    // On a retry, ask the bank first what became of the earlier attempt.
    if (!(a.is_retry() && ledger_has(ledger, key))) ledger_charge(ledger, key);
    reach("after_charge", crash_at);
    return key;
  };
  const auto record = [&](orpheus::tx& t, const orpheus::attempt&,
                          const orpheus::outcome<std::string>& o) {
    t.execute("UPDATE crash_payments SET result = ? WHERE id = ?", o.ok() ? "charged" : "failed",
              pid);
    reach("in_post", crash_at);
    return orpheus::response{201, {}, o.ok() ? o.value() : o.error().code};
  };
  try {
    const auto r = with_steps ? m.process(id, pre, flow) : m.process(id, pre, charge, record);
    reach("after_commit", crash_at);
    std::cout << "STATUS " << r.status << " REPLAYED " << r.replayed << " RETRY " << was_retry
              << std::endl;
    return 0;
  } catch (const orpheus::error& e) {
    std::cout << "ERROR " << e.code() << " RETRYABLE " << e.retryable() << " AFTER_MS "
              << e.retry_after().value_or(std::chrono::milliseconds(0)).count() << std::endl;
    return 3;
  }
}
