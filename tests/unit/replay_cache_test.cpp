// The replay cache on its own: what it keeps, for how long, and in how many
// bytes. How the manager uses it is in the conformance suite
// (ReplayCacheAnswersFromMemoryUntilAPurgeHere).
#include "../../src/replay_cache.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <limits>
#include <string>

namespace orpheus::detail {
namespace {

using namespace std::chrono_literals;

record terminal(const std::string& body, record_state s = record_state::succeeded) {
  record r;
  r.state = s;
  r.fingerprint = "fp-" + body;
  r.recorded = response{201, {{"Content-Type", "application/json"}}, body};
  r.db_now_us = 1'800'000'000'000'000;
  r.expires_us = r.db_now_us + std::int64_t{7} * 24 * 3600 * 1'000'000;  // the default retention
  return r;
}

request_id id(const std::string& key) { return {"scope", key, "fp"}; }

struct fake_clock {
  replay_cache::clock::time_point t{};
  auto fn() {
    return [this] { return t; };
  }
};

TEST(ReplayCache, KeepsTerminalRecordsOnly) {
  fake_clock c;
  replay_cache cache(1 << 20, 60s, c.fn());
  cache.put(id("a"), terminal("a"), cache.generation(), c.t);
  cache.put(id("f"), terminal("f", record_state::failed), cache.generation(), c.t);
  cache.put(id("p"), terminal("p", record_state::in_progress), cache.generation(), c.t);
  cache.put(id("r"), terminal("r", record_state::retryable), cache.generation(), c.t);
  ASSERT_NE(cache.find(id("a")).hit, nullptr);
  EXPECT_EQ(cache.find(id("a")).hit->recorded.body, "a");
  EXPECT_EQ(cache.find(id("a")).hit->fingerprint, "fp-a");
  EXPECT_NE(cache.find(id("f")).hit, nullptr);
  EXPECT_EQ(cache.find(id("p")).hit, nullptr) << "a record that can still change was kept";
  EXPECT_EQ(cache.find(id("r")).hit, nullptr) << "a record that can still change was kept";
  EXPECT_EQ(cache.size(), 2U);
}

// A record read before a purge (clear()) is not remembered after it: the row
// it came from may be gone.
TEST(ReplayCache, ARecordReadBeforeAClearIsNotKept) {
  fake_clock c;
  replay_cache cache(1 << 20, 60s, c.fn());
  // As the manager does it: a miss says the generation its store read is at.
  const auto miss = cache.find(id("a"));
  ASSERT_EQ(miss.hit, nullptr);
  EXPECT_EQ(miss.generation, cache.generation());
  cache.clear();
  cache.put(id("a"), terminal("a"), miss.generation, miss.at);
  EXPECT_EQ(cache.find(id("a")).hit, nullptr);
  cache.put(id("a"), terminal("a"), cache.generation(), c.t);
  EXPECT_NE(cache.find(id("a")).hit, nullptr);
}

TEST(ReplayCache, ScopeAndKeyNeverRunTogether) {
  fake_clock c;
  replay_cache cache(1 << 20, 60s, c.fn());
  cache.put({"ab", "c", "fp"}, terminal("ab/c"), cache.generation(), c.t);
  EXPECT_EQ(cache.find({"a", "bc", "fp"}).hit, nullptr);
  EXPECT_NE(cache.find({"ab", "c", "fp"}).hit, nullptr);
}

TEST(ReplayCache, AnEntryAnswersForTheTtlOnly) {
  fake_clock c;
  replay_cache cache(1 << 20, 10s, c.fn());
  cache.put(id("a"), terminal("a"), cache.generation(), c.t);
  c.t += 9s;
  EXPECT_NE(cache.find(id("a")).hit, nullptr);
  c.t += 1s;
  EXPECT_EQ(cache.find(id("a")).hit, nullptr) << "answered past its ttl";
  EXPECT_EQ(cache.size(), 0U) << "an expired entry is dropped when met";
  EXPECT_EQ(cache.bytes(), 0U);
}

TEST(ReplayCache, StaysWithinItsBytesDroppingTheLeastRecentlyUsed) {
  fake_clock c;
  replay_cache probe(1 << 20, 60s, c.fn());
  probe.put(id("k0"), terminal(std::string(1000, 'x')), probe.generation(), c.t);
  const std::size_t one = probe.bytes();
  ASSERT_GT(one, 1000U);

  replay_cache cache(3 * one, 60s, c.fn());
  for (const char* k : {"k0", "k1", "k2"})
    cache.put(id(k), terminal(std::string(1000, 'x')), cache.generation(), c.t);
  EXPECT_EQ(cache.size(), 3U);
  ASSERT_NE(cache.find(id("k0")).hit, nullptr);  // k0 is now the most recently used
  cache.put(id("k3"), terminal(std::string(1000, 'x')), cache.generation(), c.t);
  EXPECT_LE(cache.bytes(), 3 * one);
  EXPECT_EQ(cache.find(id("k1")).hit, nullptr) << "the least recently used entry stayed";
  EXPECT_NE(cache.find(id("k0")).hit, nullptr);
  EXPECT_NE(cache.find(id("k2")).hit, nullptr);
  EXPECT_NE(cache.find(id("k3")).hit, nullptr);

  // Putting a key again replaces it, and counts it once.
  cache.put(id("k3"), terminal(std::string(1000, 'y')), cache.generation(), c.t);
  EXPECT_EQ(cache.size(), 3U);
  EXPECT_EQ(cache.find(id("k3")).hit->recorded.body, std::string(1000, 'y'));
  EXPECT_LE(cache.bytes(), 3 * one);

  // A record larger than the whole cache is not kept, and evicts nothing.
  cache.put(id("big"), terminal(std::string(4 * one, 'z')), cache.generation(), c.t);
  EXPECT_EQ(cache.find(id("big")).hit, nullptr);
  EXPECT_EQ(cache.size(), 3U);

  cache.clear();
  EXPECT_EQ(cache.size(), 0U);
  EXPECT_EQ(cache.bytes(), 0U);
  EXPECT_EQ(cache.find(id("k0")).hit, nullptr);
}

// Found in review: an entry outlived its row. Another process may purge a
// record at its expiry, and a request with its key then runs as new: an
// entry must end by then, counted from before the read.
TEST(ReplayCache, AnEntryEndsNoLaterThanItsRecordsExpiry) {
  fake_clock c;
  replay_cache cache(1 << 20, 60s, c.fn());
  record soon = terminal("soon");
  soon.expires_us = soon.db_now_us + 5'000'000;  // purgeable in 5 s
  const auto before = c.t;
  c.t += 1s;  // the read took a while: the entry counts from before it
  cache.put(id("soon"), soon, cache.generation(), before);
  c.t = before + 4s;
  EXPECT_NE(cache.find(id("soon")).hit, nullptr);
  c.t = before + 5s;
  EXPECT_EQ(cache.find(id("soon")).hit, nullptr) << "answered after its row could be purged";

  record gone = terminal("gone");
  gone.expires_us = gone.db_now_us;  // purgeable now
  cache.put(id("gone"), gone, cache.generation(), c.t);
  record none = terminal("none");
  none.expires_us = 0;  // no expiry read: nothing says how long it is there
  cache.put(id("none"), none, cache.generation(), c.t);
  EXPECT_EQ(cache.find(id("gone")).hit, nullptr);
  EXPECT_EQ(cache.find(id("none")).hit, nullptr);

  record kept = terminal("kept");  // "for good", as a retention of 100 years
  kept.expires_us = std::numeric_limits<std::int64_t>::max();
  cache.put(id("kept"), kept, cache.generation(), c.t);
  c.t += 59s;
  EXPECT_NE(cache.find(id("kept")).hit, nullptr);
  c.t += 1s;
  EXPECT_EQ(cache.find(id("kept")).hit, nullptr) << "answered past its ttl";
}

}  // namespace
}  // namespace orpheus::detail
