// orpheus::work_pool is part of the core: this file includes no Beast or
// Asio header (the core's header check compiles work_pool.hpp against
// orpheus::core alone).
#include "orpheus/work_pool.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <latch>

#include "orpheus/error.hpp"

#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#include <sys/resource.h>

#include <fstream>
#include <string>
#include <system_error>
#endif

namespace orpheus {
namespace {

TEST(WorkPool, RefusesZeroThreadsOrQueueWithAConfigError) {
  EXPECT_THROW(work_pool(0, 4), config_error);
  EXPECT_THROW(work_pool(1, 0), config_error);
  try {
    work_pool pool(0, 0);
    ADD_FAILURE() << "no exception";
  } catch (const config_error& e) {
    EXPECT_FALSE(e.info().retryable());
    EXPECT_EQ(e.info().code, codes::invalid_config);
  }
}

#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
// Not built with a sanitizer, which reserves far more address space than the
// limit below leaves.
// Found in review: a thread that could not start (--workers past the host's
// limit) left the others joinable, and the constructor's throw became
// std::terminate.
// In a child: exits 0 when work_pool's constructor throws (std::system_error)
// under an address-space limit that leaves room for a few threads only.
[[noreturn]] void start_a_pool_past_the_thread_limit() {
  // This process's address space as it is, and room for a few threads'
  // stacks (8 MB each) beyond it: the 1000th cannot start.
  std::ifstream status("/proc/self/status");
  long vm_kb = 0;
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmSize:", 0) == 0) vm_kb = std::stol(line.substr(7));
  }
  const auto bytes = static_cast<rlim_t>(vm_kb + 64 * 1024) * 1024;
  const rlimit limit{bytes, bytes};
  if (vm_kb == 0 || setrlimit(RLIMIT_AS, &limit) != 0) std::_Exit(4);
  try {
    work_pool pool(1000, 1);
    std::_Exit(3);                   // every thread started: the limit did not bite
  } catch (const std::exception&) {  // std::system_error, or bad_alloc under the limit
    std::_Exit(0);
  }
}

TEST(WorkPool, AThreadThatCannotStartIsAnErrorNotAnAbort) {
  EXPECT_EXIT(start_a_pool_past_the_thread_limit(), testing::ExitedWithCode(0), "");
}
#endif

// Keeps a pool of one thread busy until release().
class busy_thread {
 public:
  explicit busy_thread(work_pool& pool) {
    auto released = release_.get_future().share();
    EXPECT_TRUE(pool.try_submit([this, released] {
      started_.count_down();
      released.wait();
    }));
    started_.wait();
  }
  void release() { release_.set_value(); }

 private:
  std::latch started_{1};  // a member: count_down() may still run when wait() returns
  std::promise<void> release_;
};

// The queue bound refuses at once instead of growing: with the only thread
// busy and one job queued, a second one is refused and dropped.
TEST(WorkPool, AFullQueueRefusesAtOnce) {
  work_pool pool(1, 1);
  busy_thread busy(pool);
  std::atomic<int> ran{0};
  ASSERT_TRUE(pool.try_submit([&] { ++ran; }));
  EXPECT_EQ(pool.queued(), 1U);
  EXPECT_FALSE(pool.try_submit([&] { ran += 100; }));
  busy.release();
  pool.drain();
  EXPECT_EQ(ran, 1);
}

// A delayed job whose time comes while the queue is full is refused through
// its `refused` callback, not queued past the bound and not dropped silently.
TEST(WorkPool, ADelayedJobMeetingAFullQueueIsRefused) {
  work_pool pool(1, 1);
  busy_thread busy(pool);
  ASSERT_TRUE(pool.try_submit([] {}));  // the queue is now full
  std::atomic<int> ran{0};
  std::promise<void> refused;
  ASSERT_TRUE(pool.submit_after(
      std::chrono::milliseconds(1), [&] { ++ran; }, [&] { refused.set_value(); }));
  EXPECT_EQ(refused.get_future().wait_for(std::chrono::seconds(20)), std::future_status::ready);
  busy.release();
  pool.drain();
  EXPECT_EQ(ran, 0);
}

// submit_after: delayed jobs run on the pool, and drain() runs the ones
// still waiting instead of dropping them.
TEST(WorkPool, DelayedJobsRunAndDrainRunsTheRest) {
  work_pool pool(1, 4);
  std::promise<void> ran;
  ASSERT_TRUE(pool.submit_after(
      std::chrono::milliseconds(10), [&] { ran.set_value(); }, [] {}));
  EXPECT_EQ(ran.get_future().wait_for(std::chrono::seconds(20)), std::future_status::ready);
  std::atomic<int> late{0};
  ASSERT_TRUE(pool.submit_after(
      std::chrono::hours(1), [&] { ++late; }, [] {}));
  pool.drain();
  EXPECT_EQ(late, 1);
  EXPECT_FALSE(pool.try_submit([] {}));
  EXPECT_FALSE(pool.submit_after(
      std::chrono::milliseconds(1), [] {}, [] {}));
}

}  // namespace
}  // namespace orpheus
