// Deletes expired idempotency records every `every`, a bounded batch per
// statement and a bounded number of batches per shard and round, so that the
// records table does not grow without limit (issue 7, defect 12). A shard
// that fails is logged and tried again next round; the others go on. stop()
// wakes it and joins; a purge in progress finishes its batch first. Shared by
// the HTTP and the gRPC payments servers.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>

namespace orpheus {
class manager;
}

namespace examples::payments_server {

class purger {
 public:
  /// Called after each batch with the records it deleted (e.g. a metric).
  using on_purged = std::function<void(std::size_t)>;

  /// Starts the purging thread; `m` must outlive it.
  purger(orpheus::manager& m, std::chrono::milliseconds every, std::size_t batch,
         on_purged purged = {});
  purger(const purger&) = delete;
  purger& operator=(const purger&) = delete;
  ~purger();  ///< stop()

  /// Wakes the thread and joins it. Idempotent.
  void stop();

 private:
  void run();
  bool stopping();

  orpheus::manager& manager_;
  on_purged purged_;
  std::chrono::milliseconds every_;
  std::size_t batch_;
  std::mutex m_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace examples::payments_server
