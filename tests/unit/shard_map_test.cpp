#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "orpheus/shard_map.hpp"

namespace orpheus {
namespace {

TEST(ShardMap, JumpHashStaysInRange) {
  EXPECT_EQ(jump_consistent_hash(0, 1), 0);
  EXPECT_EQ(jump_consistent_hash(1, 1), 0);
  for (std::uint64_t k = 0; k < 1000; ++k) {
    const auto b = jump_consistent_hash(k, 7);
    EXPECT_GE(b, 0);
    EXPECT_LT(b, 7);
  }
}

TEST(ShardMap, IsStableAcrossCalls) {
  // Pinned: a change here would move every key of every deployment.
  EXPECT_EQ(key_hash("scope", "key"), key_hash("scope", "key"));
  EXPECT_NE(key_hash("scope", "key"), key_hash("scopek", "ey"));
  EXPECT_EQ(shard_for("tenant-1", "key-1", 1), 0U);
}

TEST(ShardMap, SpreadsKeysEvenly) {
  constexpr int n = 4;
  std::vector<int> counts(n);
  for (int i = 0; i < 20000; ++i) ++counts[shard_for("s", "k" + std::to_string(i), n)];
  for (int c : counts) {
    EXPECT_GT(c, 20000 / n * 9 / 10);
    EXPECT_LT(c, 20000 / n * 11 / 10);
  }
}

TEST(ShardMap, GrowingNToNPlusOneMovesAboutOneInNPlusOne) {
  for (int n = 1; n <= 8; ++n) {
    int moved = 0;
    constexpr int keys = 20000;
    for (int i = 0; i < keys; ++i) {
      const auto before = shard_for("s", "k" + std::to_string(i), n);
      const auto after = shard_for("s", "k" + std::to_string(i), n + 1);
      if (before != after) {
        ++moved;
        EXPECT_EQ(after, static_cast<std::size_t>(n)) << "a moved key goes to the new shard only";
      }
    }
    const double expected = 1.0 / (n + 1);
    const double got = static_cast<double>(moved) / keys;
    EXPECT_NEAR(got, expected, expected * 0.1) << "n=" << n;
  }
}

}  // namespace
}  // namespace orpheus
