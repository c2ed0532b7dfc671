#include "pool.hpp"

namespace orpheus::mysql_detail {

std::unique_ptr<connection> pool::borrow() {
  std::unique_lock lock(mutex_);
  for (;;) {
    const bool ready = available_.wait_for(lock, options_.pool_wait, [&] {
      return !idle_.empty() || open_ < options_.max_connections_per_shard;
    });
    if (!ready) {
      throw storage_error::transient("mysql: no free connection to " + shard_.host + ":" +
                                     std::to_string(shard_.port) + " within pool_wait");
    }
    if (idle_.empty()) break;
    auto c = std::move(idle_.back());
    idle_.pop_back();
    const auto idle_for = steady::now() - c->last_used();
    if (idle_for >= discard_after_) {
      --open_;  // closed by the server, or about to be: drop it and look again
      lock.unlock();
      c.reset();
      lock.lock();
      continue;
    }
    const bool suspect = c->generation() != generation_.load() || idle_for > ping_after_;
    if (!suspect) return c;
    const std::uint64_t gen = generation_.load();
    lock.unlock();
    bool ok = false;
    try {
      ok = c->raw().isValid();
    } catch (const sql::SQLException&) {
      ok = false;
    }
    if (ok) {
      c->set_generation(gen);
      return c;
    }
    c.reset();
    lock.lock();
    --open_;  // dead: drop it and look again
  }
  ++open_;
  const std::uint64_t gen = generation_.load();
  lock.unlock();
  try {
    return std::make_unique<connection>(shard_, options_, autocommit_, gen);
  } catch (const sql::SQLException& e) {
    forget_one();
    throw classify(e, "connect", false);
  } catch (...) {
    forget_one();
    throw;
  }
}

void pool::give_back(std::unique_ptr<connection> c, bool broken) {
  if (broken) {
    c.reset();
    std::lock_guard lock(mutex_);
    --open_;
    ++generation_;
    available_.notify_one();
    return;
  }
  c->touch();
  std::lock_guard lock(mutex_);
  idle_.push_back(std::move(c));
  available_.notify_one();
}

void pool::forget_one() {
  std::lock_guard lock(mutex_);
  --open_;
  ++generation_;
  available_.notify_one();
}

}  // namespace orpheus::mysql_detail
