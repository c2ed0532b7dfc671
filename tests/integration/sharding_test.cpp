// Sharding over two real MariaDB servers: keys spread over both, and each
// key's record and the application's rows land on that key's shard only.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <csignal>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "orpheus/admin.hpp"
#include "orpheus/manager.hpp"
#include "orpheus/shard_map.hpp"
#include "support/backends.hpp"
#include "support/forwarding_store.hpp"

namespace orpheus {
namespace {

/// A database of its own (a fresh name) on each test server, dropped at the
/// end; map() gives a store's options over them in any order.
struct scratch_databases {
  explicit scratch_databases(const std::string& prefix) : name(prefix + test::random_hex(6)) {
    const auto urls = test::mysql_urls();
    if (urls.size() < 2) {
      ADD_FAILURE() << "ORPHEUS_TEST_MYSQL must list two MariaDB URLs";
      return;
    }
    for (std::size_t i = 0; i < 2; ++i) {
      mysql_options one;
      one.shards.push_back(parse_mysql_url(urls[i]));
      servers.push_back(std::make_unique<mysql_store>(one));
      auto t = servers.back()->begin_on_shard(0);
      t->execute("CREATE DATABASE " + name);
      t->commit();
      shards.push_back(one.shards[0]);
      shards.back().database = name;
    }
  }
  scratch_databases(const scratch_databases&) = delete;
  scratch_databases& operator=(const scratch_databases&) = delete;
  ~scratch_databases() {
    for (auto& server : servers) {
      try {  // a destructor: a throw here would end the whole test program
        auto t = server->begin_on_shard(0);
        t->execute("DROP DATABASE IF EXISTS " + name);
        t->commit();
      } catch (const std::exception& e) {
        ADD_FAILURE() << "could not drop " << name << ": " << e.what();
      }
    }
  }
  /// Options whose shard i is the database on server order[i].
  [[nodiscard]] mysql_options map(std::initializer_list<std::size_t> order) const {
    mysql_options o;
    for (const std::size_t server : order) o.shards.push_back(shards.at(server));
    return o;
  }

  std::string name;
  std::vector<std::unique_ptr<mysql_store>> servers;  // the test databases, to create ours
  std::vector<mysql_shard> shards;                    // ours, one per server
};

TEST(Sharding, RecordsAndApplicationRowsLandOnTheKeysShardOnly) {
  auto s = test::make_store("mysql", 2);
  ASSERT_TRUE(s);
  ASSERT_EQ(s->shard_count(), 2U);
  for (std::size_t i = 0; i < 2; ++i) {
    auto t = s->begin_on_shard(i);
    t->execute(
        "CREATE TABLE IF NOT EXISTS shard_payments (id VARCHAR(255) PRIMARY KEY, "
        "shard_seen INT NOT NULL, result VARCHAR(32))");
    t->commit();
  }
  manager m(*s);
  const std::string scope = "shard-" + test::random_hex();
  constexpr int keys = 200;
  std::vector<int> expected(2);
  for (int i = 0; i < keys; ++i) {
    const request_id id{scope, "k" + std::to_string(i), fingerprint_of("x")};
    const std::size_t owner = shard_for(id.scope, id.key, 2);
    EXPECT_EQ(s->shard_of(id), owner);
    ++expected[owner];
    const std::string pid = scope + "/" + id.key;
    m.process(
        id,
        [&](tx& t) {
          EXPECT_EQ(t.shard(), owner);
          t.execute("INSERT INTO shard_payments (id, shard_seen) VALUES (?, ?)", pid, t.shard());
          return std::string(pid);  // a copy: pid is the caller's
        },
        [](const attempt&, const std::string& p) { return p; },
        [&](tx& t, const attempt&, const outcome<std::string>&) {
          EXPECT_EQ(t.shard(), owner);
          t.execute("UPDATE shard_payments SET result = 'ok' WHERE id = ?", pid);
          return response{200, {}, pid};
        });
  }
  // Both servers got a fair share (binomial: 100 +- 3 sigma is about 79..121).
  EXPECT_GT(expected[0], 70);
  EXPECT_GT(expected[1], 70);
  for (std::size_t i = 0; i < 2; ++i) {
    auto t = s->begin_on_shard(i);
    const auto records =
        t->query("SELECT idem_key FROM orpheus_records WHERE scope = ? AND state = 3", scope);
    const auto rows =
        t->query("SELECT id, shard_seen FROM shard_payments WHERE id LIKE ? AND result = 'ok'",
                 scope + "/%");
    t->commit();
    EXPECT_EQ(static_cast<int>(records.size()), expected[i]) << "shard " << i;
    EXPECT_EQ(static_cast<int>(rows.size()), expected[i]) << "shard " << i;
    for (const auto& r : records) {
      EXPECT_EQ(shard_for(scope, r.get<std::string>(0), 2), i) << "a record on the wrong shard";
    }
    for (const auto& r : rows) EXPECT_EQ(r.get<std::int64_t>(1), static_cast<std::int64_t>(i));
  }
  // Replays read from the owning shard too.
  for (int i = 0; i < keys; i += 17) {
    const request_id id{scope, "k" + std::to_string(i), fingerprint_of("x")};
    EXPECT_TRUE(s->read(id));
    EXPECT_EQ(s->read(id)->recorded.body, scope + "/k" + std::to_string(i));
  }
}

TEST(Sharding, GrowingTwoShardsToThreeMovesAboutAThirdOfTheKeys) {
  int moved = 0;
  constexpr int keys = 30000;
  for (int i = 0; i < keys; ++i) {
    const auto key = "payment-" + std::to_string(i);
    if (shard_for("tenant-7", key, 2) != shard_for("tenant-7", key, 3)) ++moved;
  }
  EXPECT_NEAR(static_cast<double>(moved) / keys, 1.0 / 3, 0.02);
}

// Found in review: admin::list() filled its limit from shard 0 first, so an
// older parked record of shard 1 came after newer ones of shard 0.
TEST(Sharding, ListIsLeastRecentlyChangedFirstAcrossShards) {
  using namespace std::chrono_literals;
  auto s = test::make_store("mysql", 2);
  ASSERT_TRUE(s);
  config cfg;
  cfg.max_attempts = 1;
  manager m(*s, cfg);
  admin ops(*s, cfg);
  const std::string scope = "list-" + test::random_hex();
  std::optional<request_id> on1;
  std::optional<request_id> on0;
  for (int i = 0; !(on1 && on0); ++i) {
    const request_id id{scope, "k" + std::to_string(i), fingerprint_of("x")};
    auto& slot = s->shard_of(id) == 1 ? on1 : on0;
    if (!slot) slot = id;
  }
  auto park = [&](const request_id& id) {
    for (int i = 0; i < 2; ++i) {
      EXPECT_THROW(m.process(
                       id, [](tx&) { return 1; },
                       [](const attempt&, int) -> std::string {
                         throw retryable_error("bank_unavailable", "503");
                       },
                       [](tx&, const attempt&, const std::string& v) {
                         return response{201, {}, v};
                       }),
                   error);
    }
  };
  park(*on1);  // the older one, on shard 1
  std::this_thread::sleep_for(50ms);
  park(*on0);
  std::vector<std::string> mine;
  for (const auto& r : ops.list(record_state::parked, 0ms, 100000)) {
    if (r.scope == scope) mine.push_back(r.key);
  }
  EXPECT_EQ(mine, (std::vector<std::string>{on1->key, on0->key}));
}

// Found in review: manager::purge_expired stopped at the first shard that
// failed, so with shard 0 down or not migrated yet (the payments server now
// serves while a shard is late) the shards after it were never purged.
// Shard 0 here is a fresh database never migrated, shard 1 a migrated one.
TEST(Sharding, APurgeGoesOnPastAShardThatFails) {
  using namespace std::chrono_literals;
  scratch_databases created("orpheus_purge_");
  ASSERT_EQ(created.servers.size(), 2U);
  const mysql_options o = created.map({0, 1});
  mysql_store s(o);
  s.migrate_shard(1);
  manager m(s);
  std::optional<request_id> on1;
  for (int i = 0; !on1; ++i) {
    const request_id id{"purge", "k" + std::to_string(i), fingerprint_of("x")};
    if (s.shard_of(id) == 1) on1 = id;
  }
  m.process(
      *on1, [](tx&) { return 1; }, [](const attempt&, int) { return std::string("charged"); },
      [](tx&, const attempt&, const std::string& v) {
        return response{201, {}, v};
      },
      process_options{.retention = 0ms});
  ASSERT_TRUE(s.inspect(*on1));
  std::this_thread::sleep_for(5ms);  // past its expiry
  try {
    m.purge_expired(100);
    ADD_FAILURE() << "the purge of the shard that is not migrated must fail";
  } catch (const storage_error& e) {
    EXPECT_TRUE(e.retryable()) << e.what();
    EXPECT_NE(std::string(e.what()).find("shard 0 has schema version 0"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(s.inspect(*on1)) << "shard 1 was not purged because shard 0 failed";

  // The same for admin::purge (orpheusctl purge), which purges until none
  // is left: it stopped at shard 0.
  const request_id again{on1->scope, on1->key, fingerprint_of("x")};
  m.process(
      again, [](tx&) { return 1; }, [](const attempt&, int) { return std::string("charged"); },
      [](tx&, const attempt&, const std::string& v) {
        return response{201, {}, v};
      },
      process_options{.retention = 0ms});
  ASSERT_TRUE(s.inspect(again));
  std::this_thread::sleep_for(5ms);
  admin ops(s, config{});
  EXPECT_THROW(ops.purge(100), storage_error) << "shard 0 failed: the purge did not finish";
  EXPECT_FALSE(s.inspect(again)) << "admin::purge did not purge shard 1 because shard 0 failed";
}

// A payment through `m` under `key`; counts the RPCs that ran.
response pay(manager& m, const request_id& id, int& rpcs) {
  return m.process(
      id, [](tx&) { return 1; },
      [&rpcs](const attempt&, int) {
        ++rpcs;
        return std::string("charged");
      },
      [](tx&, const attempt&, const std::string& v) {
        return response{201, {}, v};
      });
}

request_id key_on(const store& s, std::size_t shard, const std::string& prefix) {
  for (int i = 0;; ++i) {
    request_id id{"map", prefix + std::to_string(i), fingerprint_of("x")};
    if (s.shard_of(id) == shard) return id;
  }
}

std::int64_t records_in(const scratch_databases& dbs) {
  std::int64_t n = 0;
  for (const auto& server : dbs.servers) {
    auto t = server->begin_on_shard(0);
    n += t->query("SELECT COUNT(*) FROM " + dbs.name + ".orpheus_records")[0].get<std::int64_t>(0);
    t->commit();
  }
  return n;
}

// A payment under `id` that the store refuses, retryable, saying `why`,
// before the RPC runs.
void expect_refused(manager& m, const request_id& id, int& rpcs, const std::string& why,
                    const std::string& context) {
  const int before = rpcs;
  try {
    (void)pay(m, id, rpcs);
    ADD_FAILURE() << context << ": served";
  } catch (const storage_error& e) {
    EXPECT_TRUE(e.retryable()) << e.what();
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << context << ": " << e.what();
  }
  EXPECT_EQ(rpcs, before) << context << ": the RPC ran";
}

// Gives the database on `server` the whole schema and the recorded place
// (index of count), written by hand: the state two migrates with different
// maps can leave when they run at once (each reads the other's first shard
// before either writes it).
void record_place_by_hand(const scratch_databases& dbs, std::size_t server, int index, int count) {
  mysql_store alone(dbs.map({server}));
  alone.migrate();
  auto t = dbs.servers.at(server)->begin_on_shard(0);
  t->execute("UPDATE " + dbs.name + ".orpheus_shard_map SET shard_index = ?, shard_count = ?",
             std::int64_t{index}, std::int64_t{count});
  t->commit();
}

TEST(Sharding, MigrateRecordsEachShardsPlaceInTheMap) {
  auto s = test::make_store("mysql", 2);
  ASSERT_TRUE(s);
  for (std::size_t i = 0; i < 2; ++i) {
    auto t = s->begin_on_shard(i);
    const auto rows = t->query("SELECT shard_index, shard_count FROM orpheus_shard_map");
    t->commit();
    ASSERT_EQ(rows.size(), 1U);
    EXPECT_EQ(rows[0].get<std::int64_t>(0), static_cast<std::int64_t>(i));
    EXPECT_EQ(rows[0].get<std::int64_t>(1), 2);
  }
}

// Left open by two reviews: nothing checked that two processes route a key
// to the same shard. A process given the shards in another order, or a
// different number of them (a rolling deploy that grows the map), looked for
// a retried key on another shard than the first attempt's, found nothing and
// ran it as a new request: a second charge. Each database now records its
// place in the map; another map is refused at migrate, and every request of
// a store with another map is refused, retryable, before anything is written.
TEST(Sharding, AStoreGivenAnotherShardMapIsRefusedBeforeItWritesAnything) {
  scratch_databases dbs("orpheus_map_");
  ASSERT_EQ(dbs.servers.size(), 2U);
  mysql_store first(dbs.map({0, 1}));
  first.migrate();
  manager m(first);
  int rpcs = 0;
  EXPECT_EQ(pay(m, key_on(first, 0, "first-"), rpcs).status, 201);
  EXPECT_EQ(pay(m, key_on(first, 1, "first-"), rpcs).status, 201);
  ASSERT_EQ(records_in(dbs), 2);

  for (const auto& [what, order] : std::vector<std::pair<std::string, std::vector<std::size_t>>>{
           {"swapped", {1, 0}}, {"one shard", {0}}, {"the other one", {1}}}) {
    mysql_options o;
    for (const std::size_t server : order) o.shards.push_back(dbs.shards.at(server));
    mysql_store other(o);
    try {
      other.migrate();
      ADD_FAILURE() << what << ": migrate accepted another shard map";
    } catch (const config_error& e) {
      EXPECT_NE(std::string(e.what()).find("records itself as shard"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("Nothing was changed"), std::string::npos) << e.what();
    }
    manager mo(other);
    for (std::size_t shard = 0; shard < other.shard_count(); ++shard) {
      expect_refused(mo, key_on(other, shard, "other-"), rpcs, "records itself as shard",
                     what + ": shard " + std::to_string(shard) + " of a store of another map");
      EXPECT_EQ(records_in(dbs), 2) << what << ": a record was written";
    }
  }
  // The store of the recorded map goes on.
  EXPECT_EQ(pay(m, key_on(first, 0, "after-"), rpcs).status, 201);
  EXPECT_EQ(records_in(dbs), 3);
}

// Each shard checked alone is not enough: two processes given [x, y] and
// [y, x] whose migrates ran at once, each recording its first shard, both
// find it "shard 0 of 2", and would serve one key on x and on y. A store
// reads every shard's place until all agree.
TEST(Sharding, TwoStoresThatEachRecordedOnlyTheirFirstShardServeNeither) {
  scratch_databases dbs("orpheus_half_");
  ASSERT_EQ(dbs.servers.size(), 2U);
  record_place_by_hand(dbs, 0, 0, 2);  // x, as [x, y] migrates it
  record_place_by_hand(dbs, 1, 0, 2);  // y, as [y, x] migrates it
  mysql_store xy(dbs.map({0, 1}));
  mysql_store yx(dbs.map({1, 0}));
  EXPECT_THROW(xy.migrate_shard(0), config_error) << "a migrate reads every shard first";
  EXPECT_THROW(yx.migrate_shard(0), config_error);
  int rpcs = 0;
  // Shard 1 first (found in review: a request on shard 1 read only shard 0,
  // found it agreeing, and the whole map was taken as read), then shard 0.
  for (store* s : {static_cast<store*>(&xy), static_cast<store*>(&yx)}) {
    manager m(*s);
    for (const std::size_t shard : {1U, 0U, 0U}) {
      expect_refused(m, key_on(*s, shard, "half-"), rpcs,
                     "shard 1 of this store's 2 records itself as shard 0 of 2",
                     "shard " + std::to_string(shard) + ", while shard 1 records another map");
    }
  }
  EXPECT_EQ(rpcs, 0);
  EXPECT_EQ(records_in(dbs), 0);
}

// Found in review: the first check of the other shards passed over one
// that did not answer (here: not migrated yet) and was never made again, so
// a store went on serving after that shard came to record another place.
TEST(Sharding, AShardThatDidNotAnswerTheFirstCheckIsReadAgain) {
  using namespace std::chrono_literals;
  scratch_databases dbs("orpheus_late_");
  ASSERT_EQ(dbs.servers.size(), 2U);
  mysql_store xy(dbs.map({0, 1}));
  xy.recheck_shard_map_every(0ms);
  xy.migrate_shard(0);
  manager m(xy);
  int rpcs = 0;
  EXPECT_EQ(pay(m, key_on(xy, 0, "early-"), rpcs).status, 201) << "y has no map yet: x serves";
  record_place_by_hand(dbs, 1, 0, 2);  // y: "shard 0 of 2", as x is
  expect_refused(m, key_on(xy, 0, "late-"), rpcs,
                 "shard 1 of this store's 2 records itself as shard 0",
                 "x, while y, its store's shard 1, records itself as shard 0");
  EXPECT_EQ(rpcs, 1);
}

// Found in a session's review: after the first reading of the whole map,
// the request that found the interval over read every shard itself, so with
// a shard gone it waited for that shard's connects, twice per node, perhaps
// in its second transaction after the charge, long enough to lose its lease
// (and get lease_lost for a payment it made). The store's map reader reads
// it now. Here its first reading of y, a shard not migrated yet (so the
// readings go on), is held at its read: requests on x are served meanwhile,
// and none starts another reading.
TEST(Sharding, TheMapReaderHoldsNoRequest) {
  using namespace std::chrono_literals;
  scratch_databases dbs("orpheus_slow_");
  ASSERT_EQ(dbs.servers.size(), 2U);
  mysql_store xy(dbs.map({0, 1}));
  xy.migrate_shard(0);  // y is not migrated: no agreement, so the readings go on
  const std::string read_map = xy.statements().read_shard_map;
  // Before the store: its destructor stops the reader, which uses them.
  std::mutex mu;
  std::condition_variable cv;
  int reads_of_y = 0;
  bool held = false;
  bool release = false;
  test::forwarding_store fs(xy);
  fs.recheck_shard_map_every(50ms);
  fs.before_read = [&](std::size_t shard, std::string_view sql) {
    if (shard != 1 || sql != read_map) return;
    std::unique_lock lock(mu);
    if (++reads_of_y != 2) return;  // the first is the first reading: requests wait for it
    held = true;
    cv.notify_all();
    cv.wait(lock, [&] { return release; });
  };
  manager mgr(fs);
  std::atomic<int> rpcs{0};
  const auto pay_on_x = [&](const std::string& prefix) {
    return std::async(std::launch::async, [&, prefix] {
      int ran = 0;
      const int status = pay(mgr, key_on(fs, 0, prefix), ran).status;
      rpcs += ran;
      return status;
    });
  };
  // No ASSERT until the reading is released: the futures wait for their
  // requests, which a build that reads on the request holds behind it.
  auto first = pay_on_x("first-");
  bool was_held = false;
  {
    std::unique_lock lock(mu);
    was_held = cv.wait_for(lock, 30s, [&] { return held; });
  }
  EXPECT_TRUE(was_held) << "no second reading of y started";
  std::vector<std::future<int>> more;
  for (int i = 0; i < 3; ++i) {
    std::this_thread::sleep_for(60ms);  // past x's own interval: each request checks
    more.push_back(pay_on_x("more-" + std::to_string(i) + "-"));
  }
  const bool first_served = first.wait_for(30s) == std::future_status::ready;
  EXPECT_TRUE(first_served) << "the first request waited for the reading";
  bool all_served = true;
  for (auto& f : more) all_served = f.wait_for(30s) == std::future_status::ready && all_served;
  EXPECT_TRUE(all_served) << "a request waited for the map reader's reading";
  {
    std::lock_guard lock(mu);
    EXPECT_EQ(reads_of_y, 2) << "a request read y while the reader was reading it";
    release = true;
  }
  cv.notify_all();
  EXPECT_EQ(first.get(), 201);
  for (auto& f : more) EXPECT_EQ(f.get(), 201);
  EXPECT_EQ(rpcs.load(), 4);
}

// Found in review of the first take on the above, which started a reading
// on the request that found the interval over and went on without it: after
// an idle spell the verdict was as old as the last request, and the first
// request after y came to record another place was charged on it. The map
// reader reads whether requests come or not: once it has read y twice since
// (the first such reading has published), a request is refused before its
// RPC.
TEST(Sharding, AfterAnIdleSpellTheMapIsNoOlderThanTheReadersLastReading) {
  using namespace std::chrono_literals;
  scratch_databases dbs("orpheus_idle_");
  ASSERT_EQ(dbs.servers.size(), 2U);
  mysql_store xy(dbs.map({0, 1}));
  xy.migrate_shard(0);
  const std::string read_map = xy.statements().read_shard_map;
  std::mutex mu;
  std::condition_variable cv;
  int reads_of_y = 0;
  test::forwarding_store fs(xy);
  fs.recheck_shard_map_every(100ms);
  fs.before_read = [&](std::size_t shard, std::string_view sql) {
    if (shard != 1 || sql != read_map) return;
    const std::lock_guard lock(mu);
    ++reads_of_y;
    cv.notify_all();
  };
  manager m(fs);
  int rpcs = 0;
  EXPECT_EQ(pay(m, key_on(fs, 0, "early-"), rpcs).status, 201) << "y has no map yet: x serves";
  record_place_by_hand(dbs, 1, 0, 2);  // y: "shard 0 of 2", as x is
  {
    std::unique_lock lock(mu);
    const int since = reads_of_y;
    EXPECT_TRUE(cv.wait_for(lock, 30s, [&] { return reads_of_y >= since + 2; }))
        << "the map reader did not read y without requests";
  }
  expect_refused(m, key_on(fs, 0, "late-"), rpcs,
                 "shard 1 of this store's 2 records itself as shard 0",
                 "x, after an idle spell in which y came to record itself as shard 0");
  EXPECT_EQ(rpcs, 1);
}

// Found in review of the map reader: a new interval (or a migrate here) let
// the next request go on with the verdict read before it, however old
// (interval 0 on an idle service, then 10 s), while the reader read. That
// request now reads the map itself. The reader's own reading of y is held
// here, so only the request's can find that y records another place.
TEST(Sharding, TheFirstRequestAfterANewIntervalReadsTheMapItself) {
  using namespace std::chrono_literals;
  scratch_databases dbs("orpheus_new_interval_");
  ASSERT_EQ(dbs.servers.size(), 2U);
  mysql_store xy(dbs.map({0, 1}));
  xy.migrate_shard(0);
  const std::string read_map = xy.statements().read_shard_map;
  std::mutex mu;
  std::condition_variable cv;
  int reads_since_hold = 0;
  bool reader_held = false;
  bool release = false;
  std::atomic<bool> hold_reader{false};
  test::forwarding_store fs(xy);
  fs.before_read = [&](std::size_t shard, std::string_view sql) {
    if (!hold_reader || shard != 1 || sql != read_map) return;
    std::unique_lock lock(mu);
    // The first is the woken reader's (the request is sent once it is
    // held); the request's own comes after.
    if (++reads_since_hold != 1) return;
    reader_held = true;
    cv.notify_all();
    cv.wait(lock, [&] { return release; });
  };
  manager m(fs);
  int rpcs = 0;
  EXPECT_EQ(pay(m, key_on(fs, 0, "early-"), rpcs).status, 201) << "y has no map yet: x serves";
  record_place_by_hand(dbs, 1, 0, 2);  // y: "shard 0 of 2", as x is
  hold_reader = true;
  fs.recheck_shard_map_every(10s);  // wakes the reader, which is held at y
  bool was_held = false;
  {
    std::unique_lock lock(mu);
    was_held = cv.wait_for(lock, 30s, [&] { return reader_held; });
  }
  EXPECT_TRUE(was_held) << "the reader did not read y when woken";
  // On a thread of its own: a build whose request waited for the held
  // reader would fail here, not hang.
  auto late = std::async(std::launch::async, [&] {
    expect_refused(m, key_on(fs, 0, "late-"), rpcs,
                   "shard 1 of this store's 2 records itself as shard 0",
                   "x, the first request after a new interval, while the reader was held");
  });
  EXPECT_EQ(late.wait_for(30s), std::future_status::ready)
      << "the request waited for the reader's reading";
  {
    const std::lock_guard lock(mu);
    release = true;
  }
  cv.notify_all();
  late.get();
  EXPECT_EQ(rpcs, 1);
}

// Found in review of the map reader: a store carried across fork() (which
// the docs say not to do) kept the parent's reader in the child: the
// child's destructor joined a thread that is not there, or destroyed the
// condition variable the parent's reader waits on, which waits for that
// waiter for ever. The child leaves the reader as it is. Only the
// forwarding store is destroyed in the child: the MariaDB connections
// under it are the parent's.
TEST(Sharding, AForkedChildDestroysAStoreWithAMapReaderWithoutHanging) {
  using namespace std::chrono_literals;
  scratch_databases dbs("orpheus_fork_");
  ASSERT_EQ(dbs.servers.size(), 2U);
  mysql_store xy(dbs.map({0, 1}));
  xy.migrate_shard(0);  // y is not migrated: the reader starts and waits its 10 s
  auto fs = std::make_unique<test::forwarding_store>(xy);
  {
    manager m(*fs);
    int rpcs = 0;
    EXPECT_EQ(pay(m, key_on(*fs, 0, "before-"), rpcs).status, 201);
  }
  const pid_t child = ::fork();
  if (child == 0) {
    fs.reset();
    ::_exit(0);
  }
  ASSERT_GT(child, 0);
  int status = 0;
  bool ended = false;
  for (int i = 0; i < 300 && !ended; ++i) {  // a bound for a broken build, not a timing
    ended = ::waitpid(child, &status, WNOHANG) == child;
    if (!ended) std::this_thread::sleep_for(100ms);
  }
  if (!ended) {
    ::kill(child, SIGKILL);
    ::waitpid(child, &status, 0);
  }
  EXPECT_TRUE(ended) << "the child hung destroying its copy of the store";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  fs.reset();  // the parent's own reader stops and is joined
}

// Found in review (third round): a conflict found by a migrate of a late
// shard (the example server's) was only logged, and one found by a request
// on one shard left the others served until their own next check, up to an
// interval. A one-shard store [y] recorded y while [x, y] had y down.
TEST(Sharding, AConflictFoundOnOneShardRefusesEveryShardAtOnce) {
  scratch_databases dbs("orpheus_at_once_");
  ASSERT_EQ(dbs.servers.size(), 2U);
  mysql_store xy(dbs.map({0, 1}));  // the default recheck interval, 10 s
  xy.migrate_shard(0);
  manager m(xy);
  int rpcs = 0;
  EXPECT_EQ(pay(m, key_on(xy, 0, "before-"), rpcs).status, 201);
  record_place_by_hand(dbs, 1, 0, 1);  // y: "shard 0 of 1"
  EXPECT_THROW(xy.migrate_shard(1), config_error);
  expect_refused(m, key_on(xy, 0, "after-"), rpcs,
                 "shard 1 of this store's 2 records itself as shard 0 of 1",
                 "shard 0, within its interval after shard 1 was found in another map");
  EXPECT_EQ(rpcs, 1);
}

// Found in review (a fourth): a request that was reading its own shard's
// place when another found a conflict stored its "checked until" after the
// conflict had made every shard's due at once, so its shard was served
// unchecked for another interval. A forwarding store holds that request at
// its own read while a migrate of the other shard finds the conflict.
TEST(Sharding, ACheckThatEndsAfterAConflictWasFoundLeavesItsShardRefused) {
  scratch_databases dbs("orpheus_overlap_");
  ASSERT_EQ(dbs.servers.size(), 2U);
  mysql_store xy(dbs.map({0, 1}));  // the default recheck interval, 10 s
  xy.migrate_shard(0);              // y is not migrated yet: no agreement
  const std::string read_map = xy.statements().read_shard_map;
  // Before the store: its map reader may call the hook until it is stopped.
  std::mutex m;
  std::condition_variable cv;
  bool held = false;
  bool release = false;
  int map_reads_of_x = 0;
  std::atomic<bool> hooked{true};
  test::forwarding_store fs(xy);
  fs.before_read = [&](std::size_t shard, std::string_view sql) {
    if (!hooked || shard != 0 || sql != read_map) return;
    std::unique_lock lock(m);
    // The first is the whole map's reading, the second x's own check.
    if (++map_reads_of_x != 2) return;
    held = true;
    cv.notify_all();
    cv.wait(lock, [&] { return release; });
  };
  manager mgr(fs);
  int rpcs = 0;
  std::thread first([&] {
    try {
      (void)pay(mgr, key_on(fs, 0, "first-"), rpcs);
    } catch (const storage_error&) {  // refused, once the conflict is known: fine too
    }
  });
  {
    std::unique_lock lock(m);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return held; }))
        << "the first request never read x's place";
  }
  record_place_by_hand(dbs, 1, 0, 1);  // y: "shard 0 of 1"
  EXPECT_THROW(fs.migrate_shard(1), config_error);
  {
    std::lock_guard lock(m);
    release = true;
  }
  cv.notify_all();
  first.join();
  hooked = false;  // not the std::function itself: the reader may be calling it
  const int before = rpcs;
  expect_refused(mgr, key_on(fs, 0, "after-"), rpcs,
                 "shard 1 of this store's 2 records itself as shard 0 of 1",
                 "x, right after a check that overlapped the conflict's discovery");
  EXPECT_EQ(rpcs, before);
}

// Found in review: once the whole map had agreed, a shard's own check that
// found another map's place refused that shard alone. After an adopt of
// [x] from [x, y], a straggler of the old map refused x but went on serving
// y, where it looked for keys the new map puts on x: each side would run
// the other's retry as new. Every shard is refused at once.
TEST(Sharding, AShardsOwnCheckThatFindsAnotherMapRefusesEveryShard) {
  using namespace std::chrono_literals;
  scratch_databases dbs("orpheus_own_check_");
  ASSERT_EQ(dbs.servers.size(), 2U);
  mysql_store old_map(dbs.map({0, 1}));
  old_map.migrate();
  old_map.recheck_shard_map_every(0ms);  // each request checks its own shard
  manager before(old_map);
  int rpcs = 0;
  EXPECT_EQ(pay(before, key_on(old_map, 0, "old-"), rpcs).status, 201);
  EXPECT_EQ(pay(before, key_on(old_map, 1, "old-"), rpcs).status, 201);  // the map agreed

  mysql_store new_map(dbs.map({0}));
  new_map.adopt_shard_map();  // x: "shard 0 of 1"; y is no longer in the map
  expect_refused(before, key_on(old_map, 0, "late-"), rpcs,
                 "shard 0 of this store's 2 records itself as shard 0 of 1", "x, its own check");
  expect_refused(before, key_on(old_map, 1, "late-"), rpcs,
                 "shard 0 of this store's 2 records itself as shard 0 of 1",
                 "y, after x's own check found another map");
  EXPECT_EQ(rpcs, 2);
}

// Found in review: a migrate refused at its second shard had already
// recorded its map on the first (and said "nothing was changed"), and the
// store of the right map could then not be migrated.
TEST(Sharding, ARefusedMigrateWritesNothingOnAnyShard) {
  scratch_databases dbs("orpheus_refused_");
  ASSERT_EQ(dbs.servers.size(), 2U);
  mysql_store xy(dbs.map({0, 1}));
  xy.migrate_shard(0);  // y is not migrated yet
  mysql_store yx(dbs.map({1, 0}));
  EXPECT_THROW(yx.migrate(), config_error);
  {
    auto t = dbs.servers[1]->begin_on_shard(0);
    EXPECT_EQ(t->query("SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = ?",
                       dbs.name)[0]
                  .get<std::int64_t>(0),
              0)
        << "the refused migrate wrote on y";
    t->commit();
  }
  EXPECT_NO_THROW(xy.migrate());
  // An adopt needs every shard of the new map to answer before it writes.
  mysql_options half = dbs.map({1});
  half.shards.push_back(parse_mysql_url("mysql://u:p@127.0.0.1:1/nowhere"));
  half.connect_timeout = std::chrono::seconds(2);
  mysql_store unreachable(half);
  EXPECT_THROW(unreachable.adopt_shard_map(), storage_error);
  EXPECT_NO_THROW(xy.migrate()) << "the adopt that could not reach a shard wrote on another";
}

// A planned change of the map: adopt_shard_map() records the new one; a
// server of the old map still running refuses at its next check of the
// recorded map (every request here: recheck interval 0).
TEST(Sharding, AnAdoptedMapIsRecordedAndAStoreOfTheOldOneRefusesAtItsNextCheck) {
  using namespace std::chrono_literals;
  scratch_databases dbs("orpheus_adopt_");
  ASSERT_EQ(dbs.servers.size(), 2U);
  mysql_store old_map(dbs.map({0, 1}));
  old_map.migrate();
  old_map.recheck_shard_map_every(0ms);
  manager before(old_map);
  int rpcs = 0;
  EXPECT_EQ(pay(before, key_on(old_map, 0, "old-"), rpcs).status, 201);

  mysql_store new_map(dbs.map({1, 0}));
  EXPECT_THROW(new_map.migrate(), config_error);
  new_map.adopt_shard_map();
  EXPECT_NO_THROW(new_map.migrate()) << "the adopted map is the recorded one";
  manager after(new_map);
  EXPECT_EQ(pay(after, key_on(new_map, 0, "new-"), rpcs).status, 201);
  EXPECT_EQ(pay(after, key_on(new_map, 1, "new-"), rpcs).status, 201);
  EXPECT_EQ(rpcs, 3);

  for (std::size_t shard = 0; shard < 2; ++shard) {
    EXPECT_THROW((void)pay(before, key_on(old_map, shard, "late-"), rpcs), storage_error)
        << "shard " << shard;
  }
  EXPECT_EQ(rpcs, 3) << "a server of the old map ran an RPC";
  EXPECT_EQ(records_in(dbs), 3);
  EXPECT_THROW(old_map.migrate(), config_error);
  EXPECT_THROW(old_map.recheck_shard_map_every(-1ms), config_error);
  EXPECT_THROW(old_map.recheck_shard_map_every(25h), config_error);
}

// One database given under two names (127.0.0.1 and 127.1, one address to
// the resolver) took both places of an adopted map, the later one winning:
// adopt_shard_map() returned as if it had worked, and every request of
// shard 0 was then refused, naming another process's map. The adopt reads
// every place back and says so.
TEST(Sharding, AnAdoptOntoOneDatabaseUnderTwoNamesIsAConfigurationError) {
  scratch_databases dbs("orpheus_alias_");
  ASSERT_EQ(dbs.servers.size(), 2U);
  mysql_options o = dbs.map({0, 0});
  ASSERT_EQ(o.shards[1].host, "127.0.0.1") << "the test servers are on loopback";
  o.shards[1].host = "127.1";
  mysql_store aliased(o);
  try {
    aliased.adopt_shard_map();
    ADD_FAILURE() << "the adopt onto one database under two names said nothing";
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find("two shards of this store are one database"),
              std::string::npos)
        << e.what();
  }
  manager m(aliased);
  int rpcs = 0;
  EXPECT_THROW((void)pay(m, key_on(aliased, 0, "alias-"), rpcs), storage_error);
  EXPECT_EQ(rpcs, 0);
}

TEST(Sharding, OneDatabaseListedAsTwoShardsIsAConfigurationError) {
  const auto urls = test::mysql_urls();
  ASSERT_FALSE(urls.empty());
  mysql_options o;
  o.shards = {parse_mysql_url(urls[0]), parse_mysql_url(urls[0])};
  try {
    mysql_store s(o);
    ADD_FAILURE() << "a database listed twice was accepted";
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find("listed twice"), std::string::npos) << e.what();
  }
  // The same as a fail-over node of another shard.
  o.shards = {parse_mysql_url(urls[0]), parse_mysql_url("mysql://u:p@10.9.9.9:1/d")};
  o.shards[1].failover = {{o.shards[0].host, o.shards[0].port}};
  o.shards[1].database = o.shards[0].database;
  EXPECT_THROW(mysql_store{o}, config_error);
  // Found in review: a host name written in another case passed, and on a
  // database with no shard map yet migrate() recorded one before refusing.
  o.shards = {parse_mysql_url("mysql://u:p@db1.example:3306/pay"),
              parse_mysql_url("mysql://u:p@DB1.Example:3306/pay")};
  EXPECT_THROW(mysql_store{o}, config_error);
}

// A MariaDB user of its own on a migrated one-shard database, granted table
// by table what `grants(table)` says (a database-wide grant reaches open
// connections only at their next USE; a table's, at once), and dropped at
// the end.
struct restricted_user {
  restricted_user(const std::string& prefix,
                  const std::function<std::string(const std::string&)>& grants)
      : dbs("orpheus_grant_"), name(prefix + test::random_hex(4)) {
    if (dbs.servers.size() != 2U) return;  // scratch_databases said why
    mysql_store(dbs.map({0})).migrate();
    auto t = dbs.servers[0]->begin_on_shard(0);
    const auto tables = t->query(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = ?", dbs.name);
    t->commit();
    as_root("CREATE USER '" + name + "'@'127.0.0.1' IDENTIFIED BY 'p'");
    for (const auto& row : tables) {
      const auto& table = row.get<std::string>(0);
      const auto what = grants(table);
      if (!what.empty()) grant(what, table);
    }
  }
  restricted_user(const restricted_user&) = delete;
  restricted_user& operator=(const restricted_user&) = delete;
  ~restricted_user() {
    try {
      as_root("DROP USER IF EXISTS '" + name + "'@'127.0.0.1'");
    } catch (const std::exception& e) {
      ADD_FAILURE() << "could not drop user " << name << ": " << e.what();
    }
  }

  void as_root(const std::string& sql) {
    auto t = dbs.servers[0]->begin_on_shard(0);
    t->execute(sql);
    t->commit();
  }
  void grant(const std::string& what, const std::string& table) {
    as_root("GRANT " + what + " ON " + dbs.name + "." + table + " TO '" + name + "'@'127.0.0.1'");
  }
  [[nodiscard]] mysql_options options() const {
    mysql_options o = dbs.map({0});
    o.shards[0].user = name;
    o.shards[0].password = "p";
    return o;
  }
  [[nodiscard]] std::int64_t records() {
    auto t = dbs.servers[0]->begin_on_shard(0);
    const auto n =
        t->query("SELECT COUNT(*) FROM " + dbs.name + ".orpheus_records")[0].get<std::int64_t>(0);
    t->commit();
    return n;
  }

  scratch_databases dbs;
  std::string name;
};

// Found in a session's notes: a user without SELECT on orpheus_shard_map
// got a permanent error (500) on every request, telling clients to give up
// on payments that go through once the grant is fixed. It is refused like a
// shard with no row: retryable, before anything is written.
TEST(Sharding, AUserWhoCannotReadTheShardMapIsRefusedRetryably) {
  restricted_user user("nomap", [](const std::string& table) {
    return table == "orpheus_shard_map" ? "" : "SELECT, INSERT, UPDATE, DELETE";
  });
  ASSERT_EQ(user.dbs.servers.size(), 2U);
  mysql_store limited(user.options());
  manager m(limited);
  int rpcs = 0;
  const request_id id{"map", "grant-1", fingerprint_of("x")};
  expect_refused(m, id, rpcs, "orpheus_shard_map", "no SELECT on orpheus_shard_map");
  EXPECT_EQ(user.records(), 0) << "a record was written";
  // Once granted, the next request goes through: nothing is remembered.
  user.grant("SELECT", "orpheus_shard_map");
  EXPECT_EQ(pay(m, id, rpcs).status, 201);
  EXPECT_EQ(rpcs, 1);
}

// Found in review: the same for a revoked INSERT on orpheus_records (or a
// full disk, a rotated password): MySQL codes outside the transient list
// were permanent, so the first transaction, where nothing has happened,
// told clients to give up on a payment that goes through once it is fixed.
TEST(Sharding, AUserWhoCannotWriteTheRecordsIsRefusedRetryably) {
  restricted_user user("noinsert", [](const std::string& table) {
    return table == "orpheus_records" ? "SELECT, UPDATE, DELETE" : "SELECT, INSERT, UPDATE, DELETE";
  });
  ASSERT_EQ(user.dbs.servers.size(), 2U);
  mysql_store limited(user.options());
  manager m(limited);
  int rpcs = 0;
  const request_id id{"grant", "insert-1", fingerprint_of("x")};
  expect_refused(m, id, rpcs, "1142", "no INSERT on orpheus_records");
  EXPECT_EQ(user.records(), 0) << "a record was written";
  // Once granted, the next request goes through.
  user.grant("INSERT", "orpheus_records");
  EXPECT_EQ(pay(m, id, rpcs).status, 201);
  EXPECT_EQ(rpcs, 1);
}

}  // namespace
}  // namespace orpheus
