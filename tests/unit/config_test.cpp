#include <gtest/gtest.h>

#include "orpheus/manager.hpp"

namespace orpheus {
namespace {

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

TEST(Config, RpcTimeoutMustBeShorterThanTheLease) {
  config c;
  c.lease = 10s;
  c.rpc_timeout = 10s;
  expect_refused(c);
  c.rpc_timeout = 11s;
  expect_refused(c);
  c.rpc_timeout = 9s;
  EXPECT_NO_THROW(validate(c));
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
