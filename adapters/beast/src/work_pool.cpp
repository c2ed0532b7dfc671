#include "orpheus/beast/work_pool.hpp"

#include <stdexcept>

namespace orpheus::beast {

work_pool::work_pool(std::size_t threads, std::size_t max_queue) : max_queue_(max_queue) {
  if (threads == 0 || max_queue == 0) {
    throw std::invalid_argument("work_pool: threads and max_queue must be positive");
  }
  threads_.reserve(threads);
  for (std::size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { work(); });
}

work_pool::~work_pool() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& t : threads_) t.join();
}

bool work_pool::try_submit(std::function<void()> job) {
  {
    std::lock_guard lock(mutex_);
    if (stopping_ || jobs_.size() >= max_queue_) return false;
    jobs_.push_back(std::move(job));
  }
  wake_.notify_one();
  return true;
}

std::size_t work_pool::queued() const {
  std::lock_guard lock(mutex_);
  return jobs_.size();
}

void work_pool::work() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping, and nothing left to run
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    try {
      job();
    } catch (...) {  // NOLINT(bugprone-empty-catch): a job reports its own errors
    }
  }
}

}  // namespace orpheus::beast
