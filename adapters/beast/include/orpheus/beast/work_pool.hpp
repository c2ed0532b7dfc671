// A bounded pool of threads for blocking work (database transactions), so
// that it never runs on the io_context threads.
//
//   orpheus::beast::work_pool pool(8, 256);   // 8 threads, at most 256 queued
//   if (!pool.try_submit([] { ... })) answer_503_retryable();
//
// The queue is bounded on purpose: under overload a request is refused at
// once (retryable), instead of waiting in a queue that grows without limit
// while its client times out and retries.
//
// Thread safety: all members may be called from any thread. The destructor
// runs the jobs already queued, then joins the threads.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace orpheus::beast {

class work_pool {
 public:
  /// Throws std::invalid_argument when threads or max_queue is 0.
  work_pool(std::size_t threads, std::size_t max_queue);
  work_pool(const work_pool&) = delete;
  work_pool& operator=(const work_pool&) = delete;
  ~work_pool();

  /// Queues `job`; false (and `job` dropped) when the queue is full or the
  /// pool is stopping.
  bool try_submit(std::function<void()> job);

  /// Jobs queued and not yet started.
  [[nodiscard]] std::size_t queued() const;

 private:
  void work();

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> jobs_;
  std::size_t max_queue_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace orpheus::beast
