#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <limits>

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
