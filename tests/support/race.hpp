// Two completers and a client racing on one key until it succeeds: what the
// conformance and steps suites run to show that no two attempts of a key
// overlap and nothing happens twice. The caller asserts on what its handler
// counted.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "orpheus/completer.hpp"
#include "orpheus/manager.hpp"

namespace orpheus::test {

/// Runs two completer threads (batch 4) and one client thread that calls
/// `client_try` (its process() of the key; true once answered 201) until the
/// record of `rid` has succeeded. Every error the client meets must be
/// retryable.
template <class ClientTry>
void race_two_completers_and_a_client(manager& m, store& s, const request_id& rid,
                                      ClientTry client_try) {
  std::atomic<bool> done{false};
  auto completer_thread = [&] {
    completer c(m, {.batch = 4});
    while (!done) {
      c.run_once();
      if (s.read(rid)->state == record_state::succeeded) done = true;
    }
  };
  std::thread a(completer_thread);
  std::thread b(completer_thread);
  std::thread client([&] {
    while (!done) {
      try {
        if (client_try()) done = true;
      } catch (const error& e) {
        EXPECT_TRUE(e.retryable()) << e.code();
      }
    }
  });
  a.join();
  b.join();
  client.join();
}

}  // namespace orpheus::test
