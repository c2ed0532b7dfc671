#include "purger.hpp"

#include <exception>
#include <string>
#include <utility>

#include "orpheus/log.hpp"
#include "orpheus/manager.hpp"

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

void purger::run() {
  std::unique_lock lock(m_);
  while (!wake_.wait_for(lock, every_, [&] { return stopping_; })) {
    lock.unlock();
    try {
      // At most 100 batches a round: a backlog is worked off over several
      // rounds instead of holding the database busy in one go.
      for (int i = 0; i < 100; ++i) {
        const std::size_t n = manager_.purge_expired(batch_);
        if (purged_) purged_(n);
        if (n < batch_) break;
        std::lock_guard check(m_);
        if (stopping_) break;
      }
    } catch (const std::exception& e) {
      orpheus::log(orpheus::log_level::warning,
                   std::string("purge failed, retried next round: ") + e.what());
    }
    lock.lock();
  }
}

}  // namespace examples::payments_server
