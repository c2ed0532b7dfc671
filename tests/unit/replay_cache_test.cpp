// The replay cache on its own: what it keeps, for how long, and in how many
// bytes. How the manager uses it is in the conformance suite
// (ReplayCacheAnswersFromMemoryUntilAPurgeHere).
#include "../../src/replay_cache.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

namespace orpheus::detail {
namespace {

using namespace std::chrono_literals;

record terminal(const std::string& body, record_state s = record_state::succeeded) {
  record r;
  r.state = s;
  r.fingerprint = "fp-" + body;
  r.recorded = response{201, {{"Content-Type", "application/json"}}, body};
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
  cache.put(id("a"), terminal("a"), cache.generation());
  cache.put(id("f"), terminal("f", record_state::failed), cache.generation());
  cache.put(id("p"), terminal("p", record_state::in_progress), cache.generation());
  cache.put(id("r"), terminal("r", record_state::retryable), cache.generation());
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
  cache.put(id("a"), terminal("a"), miss.generation);
  EXPECT_EQ(cache.find(id("a")).hit, nullptr);
  cache.put(id("a"), terminal("a"), cache.find(id("a")).generation);
  EXPECT_NE(cache.find(id("a")).hit, nullptr);
}

TEST(ReplayCache, ScopeAndKeyNeverRunTogether) {
  fake_clock c;
  replay_cache cache(1 << 20, 60s, c.fn());
  cache.put({"ab", "c", "fp"}, terminal("ab/c"), cache.generation());
  EXPECT_EQ(cache.find({"a", "bc", "fp"}).hit, nullptr);
  EXPECT_NE(cache.find({"ab", "c", "fp"}).hit, nullptr);
}

TEST(ReplayCache, AnEntryAnswersForTheTtlOnly) {
  fake_clock c;
  replay_cache cache(1 << 20, 10s, c.fn());
  cache.put(id("a"), terminal("a"), cache.generation());
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
  probe.put(id("k0"), terminal(std::string(1000, 'x')), probe.generation());
  const std::size_t one = probe.bytes();
  ASSERT_GT(one, 1000U);

  replay_cache cache(3 * one, 60s, c.fn());
  for (const char* k : {"k0", "k1", "k2"})
    cache.put(id(k), terminal(std::string(1000, 'x')), cache.generation());
  EXPECT_EQ(cache.size(), 3U);
  ASSERT_NE(cache.find(id("k0")).hit, nullptr);  // k0 is now the most recently used
  cache.put(id("k3"), terminal(std::string(1000, 'x')), cache.generation());
  EXPECT_LE(cache.bytes(), 3 * one);
  EXPECT_EQ(cache.find(id("k1")).hit, nullptr) << "the least recently used entry stayed";
  EXPECT_NE(cache.find(id("k0")).hit, nullptr);
  EXPECT_NE(cache.find(id("k2")).hit, nullptr);
  EXPECT_NE(cache.find(id("k3")).hit, nullptr);

  // Putting a key again replaces it, and counts it once.
  cache.put(id("k3"), terminal(std::string(1000, 'y')), cache.generation());
  EXPECT_EQ(cache.size(), 3U);
  EXPECT_EQ(cache.find(id("k3")).hit->recorded.body, std::string(1000, 'y'));
  EXPECT_LE(cache.bytes(), 3 * one);

  // A record larger than the whole cache is not kept, and evicts nothing.
  cache.put(id("big"), terminal(std::string(4 * one, 'z')), cache.generation());
  EXPECT_EQ(cache.find(id("big")).hit, nullptr);
  EXPECT_EQ(cache.size(), 3U);

  cache.clear();
  EXPECT_EQ(cache.size(), 0U);
  EXPECT_EQ(cache.bytes(), 0U);
  EXPECT_EQ(cache.find(id("k0")).hit, nullptr);
}

}  // namespace
}  // namespace orpheus::detail
