#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <limits>
#include <vector>

#include "orpheus/manager.hpp"

namespace orpheus {
namespace {

using namespace std::chrono_literals;

void expect_refused(const config& c) {
  try {
    validate(c);
    ADD_FAILURE() << "accepted a bad configuration";
  } catch (const config_error& e) {
    EXPECT_EQ(e.code(), codes::invalid_config);
    EXPECT_FALSE(e.retryable());
  }
}

TEST(Config, DefaultsAreValid) { EXPECT_NO_THROW(validate(config{})); }

TEST(Config, AReplayCacheAnswersNoLongerThanTheRetention) {
  config c;
  c.replay_cache_bytes = 1 << 20;
  EXPECT_NO_THROW(validate(c));
  c.replay_cache_ttl = 0ms;
  expect_refused(c);
  c.replay_cache_ttl = -1ms;
  expect_refused(c);
  c.replay_cache_ttl = c.retention + 1ms;
  expect_refused(c);
  c.replay_cache_ttl = c.retention;
  EXPECT_NO_THROW(validate(c));
  // Off, the ttl is not used and not checked.
  c.replay_cache_bytes = 0;
  c.replay_cache_ttl = 0ms;
  EXPECT_NO_THROW(validate(c));
}

TEST(Config, RpcTimeoutMustBeShorterThanTheLease) {
  config c;
  c.lease = 10s;
  c.rpc_timeout = 10s;
  expect_refused(c);
  c.rpc_timeout = 11s;
  expect_refused(c);
  c.rpc_timeout = 8s;
  EXPECT_NO_THROW(validate(c));
}

// Issue 7.10: configurations that were accepted and cannot work.
TEST(Config, TheLeaseMustLeaveTimeToRecordAfterTheRpc) {
  config c;
  c.lease = 10s;
  c.rpc_timeout = 9s;  // one second to record after a 9 s RPC: refused
  expect_refused(c);
  c.rpc_timeout = 8s;
  EXPECT_NO_THROW(validate(c));
}

TEST(Config, RetentionMustOutlastTheRetryWindow) {
  // A record purged while its client may still retry runs again as new.
  config c;
  c.retry_window = 48h;
  c.retention = 24h;
  expect_refused(c);
  c.retention = 48h;
  EXPECT_NO_THROW(validate(c));
  c = config{};
  c.retention = c.lease;
  c.retry_window = c.lease;
  expect_refused(c);  // retention must be longer than a lease
}

TEST(Config, DurationsThatWouldOverflowAreRefused) {
  for (auto field :
       {&config::lease, &config::rpc_timeout, &config::retry_window, &config::retention}) {
    config c;
    c.*field = std::chrono::milliseconds::max();
    expect_refused(c);
    c.*field = std::chrono::milliseconds(std::numeric_limits<std::int64_t>::max() / 1000 + 1);
    expect_refused(c);
  }
}

TEST(Config, RefusesNonPositiveValues) {
  config c;
  c.lease = 0ms;
  expect_refused(c);
  c = config{};
  c.rpc_timeout = -1ms;
  expect_refused(c);
  c = config{};
  c.max_attempts = 0;
  expect_refused(c);
  c = config{};
  c.retention = 0ms;
  expect_refused(c);
  c = config{};
  c.retry_window = 0ms;
  expect_refused(c);
}

}  // namespace
}  // namespace orpheus

namespace orpheus {
namespace {

// Issue 11, item 3: the completer's backoff, with the random draw injected.
TEST(RetryBackoff, GrowsExponentiallyWithEqualJitterUpToTheCap) {
  using std::chrono::milliseconds;
  const milliseconds base(100);
  const milliseconds max(1000);
  const std::vector<std::int64_t> low = {50, 100, 200, 400, 500, 500, 500};
  const std::vector<std::int64_t> high = {100, 200, 400, 800, 1000, 1000, 1000};
  for (int attempts = 1; attempts <= 7; ++attempts) {
    const auto i = static_cast<std::size_t>(attempts - 1);
    EXPECT_EQ(retry_backoff(attempts, base, max, 0.0).count(), low[i]) << attempts;
    EXPECT_EQ(retry_backoff(attempts, base, max, 1.0).count(), high[i]) << attempts;
    const auto mid = retry_backoff(attempts, base, max, 0.5).count();
    EXPECT_GT(mid, low[i]);
    EXPECT_LT(mid, high[i]);
  }
  // No overflow for a key retried for days, nor for a random draw out of range.
  EXPECT_EQ(retry_backoff(1'000'000, base, max, 1.0).count(), 1000);
  EXPECT_EQ(retry_backoff(3, base, max, 7.0).count(), 400);
  EXPECT_EQ(retry_backoff(3, base, max, -1.0).count(), 200);
}

TEST(RetryBackoff, ConfigurationIsChecked) {
  config c;
  c.retry_backoff_base = std::chrono::milliseconds(0);
  EXPECT_THROW(validate(c), config_error);
  c = config{};
  c.retry_backoff_max = std::chrono::milliseconds(500);
  c.retry_backoff_base = std::chrono::seconds(1);
  EXPECT_THROW(validate(c), config_error);
  c = config{};
  c.parked_retry_after = std::chrono::milliseconds(-1);
  EXPECT_THROW(validate(c), config_error);
  EXPECT_NO_THROW(validate(config{}));
}

}  // namespace
}  // namespace orpheus
