// A bounded pool of threads for blocking work (database transactions), so
// that it never runs on the io_context threads.
//
//   orpheus::work_pool pool(8, 256);   // 8 threads, at most 256 queued
//   if (!pool.try_submit([] { ... })) answer_503_retryable();
//
// The queue is bounded on purpose: under overload a request is refused at
// once (retryable), instead of waiting in a queue that grows without limit
// while its client times out and retries.
//
// Work that must wait (a request polling for a key another attempt holds)
// is handed to submit_after(): one timer thread keeps it until it is due, so
// waiting never occupies a pool thread.
//
// It is part of the core (no Asio, no Beast): the Beast middleware runs its
// transactions on one, and any other front end can do the same.
//
// Thread safety: all members may be called from any thread, except drain()
// and the destructor, which must not be called from a job.
//
// Lifetime: jobs usually refer to objects created after the pool (the
// middleware, the manager, the store). drain() the pool before any of those
// is destroyed; the destructor drains too, which is only enough when the
// pool is destroyed first.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "orpheus/error.hpp"

namespace orpheus {

class work_pool {
 public:
  /// Throws config_error when threads or max_queue is 0.
  work_pool(std::size_t threads, std::size_t max_queue);
  work_pool(const work_pool&) = delete;
  work_pool& operator=(const work_pool&) = delete;
  ~work_pool();  ///< drain()

  /// Queues `job`; false (and `job` dropped) when the queue is full or the
  /// pool is draining.
  bool try_submit(std::function<void()> job);

  /// Queues `job` once `delay` has passed, without holding a pool thread
  /// meanwhile. If the queue is full at that time, `refused` is called
  /// instead, on the timer thread (it must not block). Returns false (and
  /// drops both) when the pool is draining. drain() queues delayed jobs at
  /// once rather than dropping them.
  bool submit_after(std::chrono::milliseconds delay, std::function<void()> job,
                    std::function<void()> refused);

  /// Stops taking jobs, runs every job already queued or delayed, and joins
  /// the threads. Idempotent.
  void drain();

  /// True once drain() has begun: a job may then refuse to start new work
  /// (the middleware answers a request still queued 503 server_stopping
  /// rather than calling downstream while the process stops).
  [[nodiscard]] bool draining() const noexcept { return draining_.load(); }

  /// What a front end answers a request it did not start because the pool
  /// is draining: 503 server_stopping, retryable (nothing of it ran). The
  /// Beast middleware and the gRPC adapter both answer so.
  [[nodiscard]] static error_info draining_refusal();

  /// Jobs queued and not yet started (delayed ones not counted).
  [[nodiscard]] std::size_t queued() const;

 private:
  struct delayed {
    std::function<void()> job;
    std::function<void()> refused;
  };
  void work();
  void run_timer();

  mutable std::mutex mutex_;
  std::condition_variable wake_;        // workers
  std::condition_variable wake_timer_;  // the timer thread
  std::deque<std::function<void()>> jobs_;
  std::multimap<std::chrono::steady_clock::time_point, delayed> delayed_;
  std::size_t max_queue_;
  bool stopping_ = false;
  std::atomic<bool> draining_{false};  // stopping_, readable without the lock
  bool timer_done_ = false;            // the timer thread has handed over its last job
  std::mutex join_mutex_;              // one drain() joins, a concurrent one waits
  std::vector<std::thread> threads_;
  std::thread timer_;
};

}  // namespace orpheus
