#include "purger.hpp"

#include <exception>
#include <string>
#include <utility>

#include "orpheus/log.hpp"
#include "orpheus/manager.hpp"
#include "orpheus/store.hpp"

namespace examples::payments_server {

purger::purger(orpheus::manager& m, std::chrono::milliseconds every, std::size_t batch,
               on_purged purged)
    : manager_(m), purged_(std::move(purged)), every_(every), batch_(batch), thread_([this] {
        run();
      }) {}

purger::~purger() { stop(); }

void purger::stop() {
  {
    std::lock_guard lock(m_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool purger::stopping() {
  std::lock_guard lock(m_);
  return stopping_;
}

void purger::run() {
  std::unique_lock lock(m_);
  while (!wake_.wait_for(lock, every_, [&] { return stopping_; })) {
    lock.unlock();
    // Shard by shard, so that one that fails (down, not migrated yet) costs
    // only its own purge, and each works off its own backlog: at most 100
    // batches a round, over several rounds instead of holding the database
    // busy in one go.
    const std::size_t shards = manager_.storage().shard_count();
    for (std::size_t s = 0; s < shards && !stopping(); ++s) {
      try {
        for (int i = 0; i < 100 && !stopping(); ++i) {
          const std::size_t n = manager_.purge_expired_on(s, batch_);
          if (purged_) purged_(n);
          if (n < batch_) break;
        }
      } catch (const std::exception& e) {
        orpheus::log(orpheus::log_level::warning, "purge of shard " + std::to_string(s) +
                                                      " failed, retried next round: " + e.what());
      } catch (...) {  // must not end the thread (std::terminate) and the server
        orpheus::log(orpheus::log_level::warning,
                     "purge of shard " + std::to_string(s) + " failed, retried next round");
      }
    }
    lock.lock();
  }
}

}  // namespace examples::payments_server
