// Issue 12: one shard on a 3-node MariaDB Galera cluster (scripts/galera),
// its nodes given as fail-over hosts. Payments keep flowing while the node in
// use is SIGKILLed and later rejoins, twice: 0 double charges, 0 lost records.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "orpheus/manager.hpp"
#include "orpheus/payment/charge.hpp"
#include "orpheus/store/mysql.hpp"
#include "support/backends.hpp"

namespace orpheus {
namespace {

using namespace std::chrono_literals;

int run(const std::string& command) { return std::system(command.c_str()); }  // NOLINT

// A bank that does not deduplicate: a second charge for a payment is a
// double charge, counted. It remembers charges by idempotency key for
// status queries (what charge_once asks before a retried charge).
class counting_bank final : public payment::gateway {
 public:
  payment::gateway_answer charge(const payment::charge_request& r, const std::string& key,
                                 std::chrono::milliseconds) override {
    std::this_thread::sleep_for(2ms);
    const std::lock_guard lock(m_);
    const std::string id = "ch_" + std::to_string(++charges_);
    ++charges_of_[r.reference];
    by_key_[key] = id;
    return {payment::gateway_status::charged, id, {}};
  }
  payment::gateway_answer status(const std::string& key, std::chrono::milliseconds) override {
    const std::lock_guard lock(m_);
    const auto found = by_key_.find(key);
    if (found == by_key_.end()) return {payment::gateway_status::not_found, {}, {}};
    return {payment::gateway_status::charged, found->second, {}};
  }
  std::map<std::string, int> charges_of() {
    const std::lock_guard lock(m_);
    return charges_of_;
  }

 private:
  std::mutex m_;
  int charges_ = 0;
  std::map<std::string, int> charges_of_;
  std::map<std::string, std::string> by_key_;
};

class Galera : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("orpheus-galera-" + test::random_hex());
    std::filesystem::create_directories(dir_);
    // The nodes run as the mysql user (scripts/galera): it must reach DIR.
    for (auto p = dir_; p != p.root_path(); p = p.parent_path()) {
      std::filesystem::permissions(p, std::filesystem::perms::others_exec,
                                   std::filesystem::perm_options::add);
    }
    // Twelve ports from PORT to PORT+33; another test's server may hold one
    // of them (found in a full run: port 25982 taken, the test failed).
    // scripts/galera exits 3, having started nothing, when one is taken.
    std::mt19937 rng(std::random_device{}());
    const auto taken = [](int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 3; };
    int started = 0;
    for (int tries = 0; tries < 10 && (tries == 0 || taken(started)); ++tries) {
      port_ = 25000 + static_cast<int>(rng() % 4000);
      started = galera("start", std::to_string(port_));
    }
    ASSERT_EQ(started, 0) << "scripts/galera start failed";
  }
  void TearDown() override {
    galera("stop", "");
    std::filesystem::remove_all(dir_);
  }
  int galera(const std::string& cmd, const std::string& arg) {
    return run(std::string(ORPHEUS_SOURCE_DIR) + "/scripts/galera " + cmd + " " + dir_.string() +
               " " + arg);
  }

  std::filesystem::path dir_;
  int port_ = 0;
};

TEST_F(Galera, PaymentsSurviveTheNodeInUseDyingAndRejoining) {
  const std::string url = "mysql://u:p@127.0.0.1:" + std::to_string(port_) +
                          ",127.0.0.1:" + std::to_string(port_ + 1) +
                          ",127.0.0.1:" + std::to_string(port_ + 2) + "/d";
  mysql_options o;
  o.shards = {parse_mysql_url(url)};
  ASSERT_EQ(o.shards[0].failover.size(), 2U);
  o.connect_timeout = 2s;
  o.pool_wait = 2s;
  mysql_store store(o);
  store.migrate();
  {
    auto t = store.begin_on_shard(0);
    t->execute(
        "CREATE TABLE IF NOT EXISTS payments (id VARCHAR(64) PRIMARY KEY, state VARCHAR(16))");
    t->commit();
  }
  config cfg;
  cfg.lease = 3s;
  cfg.rpc_timeout = 1s;
  manager m(store, cfg);
  counting_bank bank;

  constexpr int kPooled = 240;            // paid by the client threads
  constexpr int kPayments = kPooled + 2;  // and one under each kill
  constexpr int kThreads = 6;
  std::atomic<int> next{0};
  std::atomic<int> answered{0};
  std::atomic<int> retries{0};
  std::vector<std::string> answers(kPayments);
  // Each kill lands under a transaction (found in CI: left to timing, no
  // request met a dead node once; the second kill often came after the
  // last payment, and a pool that drops a dead node's idle connections
  // hides the rest). Payment kPooled + n, paid by a thread of its own, stops
  // after its INSERT, node n is killed, and it goes on, on a dead connection.
  std::mutex hold_m;
  std::condition_variable hold_cv;
  int hold_index = -1;
  bool holding = false;
  bool killed = false;
  const auto hold_if_wanted = [&](int i) {
    std::unique_lock lock(hold_m);
    if (i != hold_index || killed) return;
    holding = true;
    hold_cv.notify_all();
    hold_cv.wait_for(lock, 30s, [&] { return killed; });
  };
  auto pay = [&](int i) {
    const std::string ref = "pay-" + std::to_string(i);
    const request_id id{"galera", ref, fingerprint_of(ref)};
    for (int tries = 0; tries < 600; ++tries) {  // hang guard: ~60 s
      try {
        const response r = m.process(
            id,
            [&](tx& t) {
              t.execute("INSERT INTO payments (id, state) VALUES (?, 'pending')", ref);
              hold_if_wanted(i);
              return ref;
            },
            [&](const attempt& a, const std::string& reference) {
              return payment::charge_once(bank, a, {reference, 100, "EUR"});
            },
            [&](tx& t, const attempt&, const std::string& reference, const std::string& charge) {
              t.execute("UPDATE payments SET state = 'succeeded' WHERE id = ?", reference);
              return response{201, {}, charge};
            });
        answers[i] = r.body;
        ++answered;
        return;
      } catch (const error& e) {
        if (!e.retryable()) {
          ADD_FAILURE() << ref << ": not retryable: " << e.code() << " " << e.what();
          return;
        }
        ++retries;
        std::this_thread::sleep_for(100ms);
      }
    }
    ADD_FAILURE() << ref << ": no answer after a minute of retries";
  };
  std::vector<std::thread> clients;
  for (int c = 0; c < kThreads; ++c) {
    clients.emplace_back([&] {
      for (int i; (i = next++) < kPooled;) {
        pay(i);
        std::this_thread::sleep_for(10ms);
      }
    });
  }
  std::vector<std::thread> held;
  const auto kill_under_a_transaction = [&](int node) {
    const int i = kPooled + node - 1;
    {
      std::unique_lock lock(hold_m);
      hold_index = i;
      holding = false;
      killed = false;
    }
    held.emplace_back(pay, i);
    {
      std::unique_lock lock(hold_m);
      EXPECT_TRUE(hold_cv.wait_for(lock, 30s, [&] { return holding; }))
          << "no transaction to kill node " << node << " under";
    }
    EXPECT_EQ(galera("kill", std::to_string(node)), 0);
    std::lock_guard lock(hold_m);
    killed = true;
    hold_cv.notify_all();
  };
  // Node 1 is in use first (the URL's first host): kill it, let payments
  // fail over, bring it back; then the same for the node in use after it.
  const auto wait_for_answers = [&](int n) {
    for (int i = 0; i < 600 && answered < n; ++i) std::this_thread::sleep_for(100ms);
  };
  wait_for_answers(40);
  kill_under_a_transaction(1);
  // Payments go on while the node is dead: without fail-over none could.
  wait_for_answers(100);
  EXPECT_GE(answered.load(), 100) << "no fail-over from node 1";
  EXPECT_EQ(galera("restart", "1"), 0);
  wait_for_answers(140);
  kill_under_a_transaction(2);
  wait_for_answers(200);
  EXPECT_GE(answered.load(), 200) << "no fail-over from node 2";
  EXPECT_EQ(galera("restart", "2"), 0);
  for (auto& c : clients) c.join();
  for (auto& h : held) h.join();

  EXPECT_EQ(answered, kPayments);
  EXPECT_GE(retries.load(), 2) << "a held transaction did not meet its dead node";
  const auto charges = bank.charges_of();
  int double_charges = 0;
  int lost = 0;
  for (int i = 0; i < kPayments; ++i) {
    const std::string ref = "pay-" + std::to_string(i);
    const auto c = charges.find(ref);
    if (c != charges.end() && c->second > 1) ++double_charges;
    // Every payment answered has its record, replayed with the same answer,
    // and its application row, on every node.
    const auto rec = store.inspect({"galera", ref, fingerprint_of(ref)});
    if (!rec || rec->state != record_state::succeeded || rec->recorded.body != answers[i]) ++lost;
  }
  EXPECT_EQ(double_charges, 0);
  EXPECT_EQ(lost, 0);
  EXPECT_EQ(static_cast<int>(charges.size()), kPayments);
  for (int node = 0; node < 3; ++node) {
    mysql_options one;
    one.shards = {parse_mysql_url("mysql://u:p@127.0.0.1:" + std::to_string(port_ + node) + "/d")};
    mysql_store s(one);
    auto t = s.begin_on_shard(0);
    const auto rows = t->query("SELECT COUNT(*) FROM payments WHERE state = 'succeeded'");
    const auto records =
        t->query("SELECT COUNT(*) FROM orpheus_records WHERE scope = 'galera' AND state = ?",
                 static_cast<std::int64_t>(record_state::succeeded));
    t->commit();
    EXPECT_EQ(rows.at(0).get<std::int64_t>(0), kPayments) << "node " << node + 1;
    EXPECT_EQ(records.at(0).get<std::int64_t>(0), kPayments) << "node " << node + 1;
  }
}

// Found in review: a node of another Galera cluster listed in a shard (by
// mistake, spelled otherwise than under its own shard) was taken on a
// fail-over like any ready node. The other cluster, migrated as a shard of
// its own, records the same place, so the shard map check could not tell;
// a retry of a key paid on this cluster found no record there and paid
// again. Such a node is never used: the request is refused, retryable,
// until the shard's own node answers, and then replays.
TEST_F(Galera, ANodeOfAnotherClusterInAShardsListIsNeverUsed) {
  const auto other = dir_ / "other";  // under dir_: removed with it
  std::filesystem::create_directories(other);
  const int other_port = port_ + 50;  // its ports up to +83, clear of this cluster's
  const std::string galera_script = std::string(ORPHEUS_SOURCE_DIR) + "/scripts/galera ";
  ASSERT_EQ(run(galera_script + "start " + other.string() + " " + std::to_string(other_port)), 0);
  struct stop_other {
    std::string command;
    ~stop_other() { run(command); }
  } stop{galera_script + "stop " + other.string()};
  mysql_options theirs;
  theirs.shards = {parse_mysql_url("mysql://u:p@127.0.0.1:" + std::to_string(other_port) + "/d")};
  mysql_store(theirs).migrate();

  mysql_options o;
  o.shards = {parse_mysql_url("mysql://u:p@127.0.0.1:" + std::to_string(port_) +
                              ",127.0.0.1:" + std::to_string(other_port) + "/d")};
  o.connect_timeout = 2s;
  o.pool_wait = 2s;
  mysql_store store(o);
  store.migrate();
  manager m(store);
  const request_id id{"galera", "pay-1", fingerprint_of("pay-1")};
  int rpcs = 0;
  const auto pay = [&] {
    return m.process(
        id, [](tx&) { return 1; },
        [&](const attempt&, int) {
          ++rpcs;
          return std::string("ch_1");
        },
        [](tx&, const attempt&, const std::string& charge) {
          return response{201, {}, charge};
        });
  };
  EXPECT_EQ(pay().status, 201);
  ASSERT_EQ(galera("kill", "1"), 0);  // this cluster's only listed node
  for (int i = 0; i < 3; ++i) {       // the dead connections, then the fail-over
    try {
      const response r = pay();
      ADD_FAILURE() << "answered with node 1 down: " << r.status << (r.replayed ? " replayed" : "");
    } catch (const error& e) {
      EXPECT_TRUE(e.retryable()) << e.what();
    }
  }
  EXPECT_EQ(rpcs, 1) << "the payment ran again on the other cluster";
  EXPECT_FALSE(mysql_store(theirs).inspect(id)) << "a record written on the other cluster";
  ASSERT_EQ(galera("restart", "1"), 0);
  std::optional<response> again;
  for (int i = 0; i < 100 && !again; ++i) {
    try {
      again = pay();
    } catch (const error& e) {
      if (!e.retryable()) throw;
      std::this_thread::sleep_for(100ms);
    }
  }
  ASSERT_TRUE(again);
  EXPECT_TRUE(again->replayed);
  EXPECT_EQ(rpcs, 1);
}

}  // namespace
}  // namespace orpheus
