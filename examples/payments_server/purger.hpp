// Deletes expired idempotency records every `every`, a bounded batch per
// statement and a bounded number of batches per round, so that the records
// table does not grow without limit (issue 7, defect 12). stop() wakes it and
// joins; a purge in progress finishes its batch first.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <thread>

#include "metrics.hpp"

namespace orpheus {
class manager;
}

namespace examples::payments_server {

class purger {
 public:
  /// Starts the purging thread; `m` and `stats` must outlive it.
  purger(orpheus::manager& m, metrics& stats, std::chrono::milliseconds every, std::size_t batch);
  purger(const purger&) = delete;
  purger& operator=(const purger&) = delete;
  ~purger();  ///< stop()

  /// Wakes the thread and joins it. Idempotent.
  void stop();

 private:
  void run();

  orpheus::manager& manager_;
  metrics& stats_;
  std::chrono::milliseconds every_;
  std::size_t batch_;
  std::mutex m_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace examples::payments_server
