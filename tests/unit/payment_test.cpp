// The payment wrapper against a simulated gateway (a downstream service,
// the one kind of fake allowed here).
#include <gtest/gtest.h>

#include <vector>

#include "orpheus/payment/charge.hpp"

namespace orpheus::payment {
namespace {

using namespace std::chrono_literals;

struct simulated_gateway final : gateway {
  gateway_answer charge_answer{gateway_status::charged, "ch_1", ""};
  gateway_answer status_answer{gateway_status::not_found, "", ""};
  std::vector<std::string> calls;  // "charge:KEY" / "status:KEY"

  gateway_answer charge(const charge_request& r, const std::string& key,
                        std::chrono::milliseconds timeout) override {
    EXPECT_GT(timeout.count(), 0);
    EXPECT_EQ(r.amount, 1250);
    calls.push_back("charge:" + key);
    return charge_answer;
  }
  gateway_answer status(const std::string& key, std::chrono::milliseconds) override {
    calls.push_back("status:" + key);
    return status_answer;
  }
};

const request_id id{"shop", "order-1", fingerprint_of("x")};
const charge_request req{"pay_1", 1250, "EUR"};
attempt first() { return {id, 1, std::chrono::steady_clock::now() + 5s}; }
attempt retry() { return {id, 2, std::chrono::steady_clock::now() + 5s}; }

TEST(Payment, FirstAttemptChargesWithTheDownstreamKey) {
  simulated_gateway g;
  EXPECT_EQ(charge_once(g, first(), req), "ch_1");
  EXPECT_EQ(g.calls, std::vector<std::string>{"charge:" + first().downstream_key("charge")});
}

TEST(Payment, ARetryAsksFirstAndDoesNotChargeAgain) {
  simulated_gateway g;
  g.status_answer = {gateway_status::charged, "ch_earlier", ""};
  EXPECT_EQ(charge_once(g, retry(), req), "ch_earlier");
  EXPECT_EQ(g.calls, std::vector<std::string>{"status:" + retry().downstream_key("charge")});
}

TEST(Payment, ARetryChargesWhenTheEarlierAttemptNeverArrived) {
  simulated_gateway g;
  EXPECT_EQ(charge_once(g, retry(), req), "ch_1");
  const auto key = retry().downstream_key("charge");
  EXPECT_EQ(g.calls, (std::vector<std::string>{"status:" + key, "charge:" + key}));
}

TEST(Payment, ARetryReplaysAnEarlierDecline) {
  simulated_gateway g;
  g.status_answer = {gateway_status::declined, "", "insufficient funds"};
  try {
    charge_once(g, retry(), req);
    ADD_FAILURE();
  } catch (const error& e) {
    EXPECT_FALSE(e.retryable());
    EXPECT_EQ(e.http_status(), 402);
  }
  EXPECT_EQ(g.calls.size(), 1U);
}

TEST(Payment, ErrorsAreClassified) {
  struct expectation {
    gateway_status status;
    bool retryable;
    bool in_doubt;
    int http;
  };
  for (const auto& x :
       std::vector<expectation>{{gateway_status::declined, false, false, 402},
                                {gateway_status::invalid, false, false, 422},
                                {gateway_status::server_error, true, true, 502},
                                {gateway_status::timeout, true, true, 504},
                                {gateway_status::reset, true, true, 502},
                                {gateway_status::connect_failed, true, false, 503}}) {
    simulated_gateway g;
    g.charge_answer = {x.status, "", "detail"};
    try {
      charge_once(g, first(), req);
      ADD_FAILURE() << static_cast<int>(x.status);
    } catch (const error& e) {
      EXPECT_EQ(e.retryable(), x.retryable) << static_cast<int>(x.status);
      EXPECT_EQ(e.in_doubt(), x.in_doubt) << static_cast<int>(x.status);
      EXPECT_EQ(e.http_status(), x.http) << static_cast<int>(x.status);
    }
  }
}

TEST(Payment, NoTimeLeftIsAnUnknownOutcomeNotACharge) {
  simulated_gateway g;
  const attempt late(id, 1, std::chrono::steady_clock::now() - 1ms);
  try {
    charge_once(g, late, req);
    ADD_FAILURE();
  } catch (const error& e) {
    EXPECT_TRUE(e.retryable());
  }
  EXPECT_TRUE(g.calls.empty());
}

}  // namespace
}  // namespace orpheus::payment
