// The completer (orpheus/completer.hpp): claim due records, then resume each
// through the manager, which decides everything as it does for a client.
#include "orpheus/completer.hpp"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "orpheus/detail/record_row.hpp"
#include "orpheus/detail/records.hpp"
#include "orpheus/log.hpp"

namespace orpheus {
namespace {

struct claimed {
  request_id id;
  std::string handler;
  int version = 0;
};

// Whether the record now holds a final outcome (one read, only after a
// final error; a read that fails says no).
bool recorded_final(store& s, const request_id& id) {
  try {
    const auto r = s.inspect(id);
    return r && is_terminal(r->state);
  } catch (const std::exception&) {
    return false;
  }
}

// One short transaction: the most overdue due record that names one of
// `handlers`, locked, pushed a lease ahead so that other completers pass
// over it while this one works. One at a time, each just before it runs, so
// that no claim goes stale behind a slow batch (found in review).
std::optional<claimed> claim_one(store& s, std::size_t shard, const std::string& sql,
                                 const std::vector<std::pair<std::string, int>>& handlers,
                                 std::int64_t hold_us) {
  auto t = s.backend_for_records(shard).begin(shard);
  std::vector<sql_value> p;
  for (const auto& [name, version] : handlers) {
    p.emplace_back(name);
    p.emplace_back(std::int64_t{version});
  }
  const auto rows = t->query_values(sql, p);
  if (rows.empty()) {
    t->rollback();
    return std::nullopt;
  }
  const auto& v = rows.front().values;
  claimed c{{detail::text_or_empty(v.at(0)), detail::text_or_empty(v.at(1)),
             detail::text_or_empty(v.at(2))},
            detail::text_or_empty(v.at(3)),
            static_cast<int>(detail::int_or_zero(v.at(4)))};
  const sql_value hold[] = {hold_us, c.id.scope, c.id.key};
  t->execute_values(s.statements().claim_hold, hold);
  t->commit();
  return c;
}

}  // namespace

completer::completer(manager& m, completer_options o) : manager_(m), options_(o) {
  if (options_.batch == 0) throw config_error("completer_options::batch is 0");
  // Found in review: a huge wait wrapped the condition variable's deadline
  // into the past, and the completer claimed on every shard without a pause.
  if (options_.idle_wait.count() <= 0 || options_.idle_wait > std::chrono::hours{24}) {
    throw config_error("completer_options::idle_wait must be positive and at most 24 hours");
  }
}

completer::~completer() { stop(); }

completer_pass completer::run_once() {
  completer_pass pass;
  // Only records of the handlers registered here, in a version this build
  // has: another service's records, or a newer version's during a deploy,
  // are left to the completers that can run them (found in review).
  const auto handlers = manager_.handlers();
  if (handlers.empty()) return pass;
  store& s = manager_.storage();
  std::string sql = s.statements().claim_head;
  for (std::size_t i = 0; i < handlers.size(); ++i) {
    sql += (i == 0 ? "" : " OR ");
    sql += "(handler = ? AND handler_version <= ?)";
  }
  sql += s.statements().claim_tail;
  const std::int64_t hold_us =
      std::chrono::duration_cast<std::chrono::microseconds>(manager_.settings().lease).count();
  for (std::size_t shard = 0; shard < s.shard_count(); ++shard) {
    for (std::size_t n = 0; n < options_.batch; ++n) {
      {
        const std::lock_guard lock(m_);
        if (stopping_) return pass;
      }
      std::optional<claimed> c;
      try {
        c = claim_one(s, shard, sql, handlers, hold_us);
      } catch (const std::exception& e) {
        ++pass.shard_errors;
        log(log_level::warning,
            "completer: could not claim on shard " + std::to_string(shard) + ": " + e.what());
        break;
      }
      if (!c) break;
      ++pass.claimed;
      if (n + 1 == options_.batch) pass.full = true;
      try {
        (void)manager_.complete(c->id, c->handler, c->version);
        ++pass.finished;
      } catch (const error& e) {
        if (e.code() == codes::request_parked) {
          ++pass.parked;
        } else if (e.code() == codes::in_progress) {
          ++pass.skipped;
        } else if (e.retryable()) {
          ++pass.retrying;
        } else if (recorded_final(s, c->id)) {
          ++pass.finished;  // a final failure, recorded by the manager
        } else {
          // Found in review: a final error that recorded nothing (a
          // permanent storage error in the first transaction) was counted
          // as finished; the key is due again later.
          ++pass.retrying;
          log(log_level::warning,
              "completer: scope " + c->id.scope + " key " + c->id.key + ": " + e.what());
        }
      } catch (const std::exception& e) {
        ++pass.retrying;
        log(log_level::warning,
            "completer: scope " + c->id.scope + " key " + c->id.key + ": " + e.what());
      } catch (...) {
        // Found in review: anything else (a handler's decoding that throws
        // something not derived from std::exception) left run_once(), and
        // on the completer's thread ended the process.
        ++pass.retrying;
        log(log_level::warning, "completer: scope " + c->id.scope + " key " + c->id.key +
                                    ": an exception that is not a std::exception");
      }
    }
  }
  return pass;
}

void completer::start() {
  if (std::this_thread::get_id() == loop_thread_.load()) return;  // it runs: this is it
  const std::lock_guard life(lifecycle_);
  if (thread_.joinable()) {
    bool ending = false;
    {
      const std::lock_guard lock(m_);
      ending = stopping_;  // stopped from its own thread, and not joined yet
    }
    if (!ending) return;
    thread_.join();
  }
  {
    const std::lock_guard lock(m_);
    stopping_ = false;
  }
  thread_ = std::thread([this] { loop(); });
}

void completer::stop() {
  // One at a time with start() (found in review: two stop()s, or a stop()
  // beside a start(), raced on thread_). The loop takes only m_, so joining
  // under lifecycle_ cannot wait for itself.
  if (std::this_thread::get_id() == loop_thread_.load()) {
    // On the background thread itself: it ends after this pass; a stop() or
    // start() on another thread joins it (the completer must not be
    // destroyed on its own thread).
    const std::lock_guard lock(m_);
    stopping_ = true;
    return;
  }
  const std::lock_guard life(lifecycle_);
  {
    const std::lock_guard lock(m_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void completer::loop() {
  loop_thread_.store(std::this_thread::get_id());
  struct forget_id {
    std::atomic<std::thread::id>& id;
    ~forget_id() { id.store(std::thread::id{}); }
  } on_exit{loop_thread_};
  for (;;) {
    completer_pass pass;
    try {
      pass = run_once();
    } catch (...) {
      // What run_once() does not count (an allocation failing while it
      // lists the handlers): this pass is over, the next one tries again.
      // An exception on this thread would end the process.
      log(log_level::error, "completer: a pass failed; the next one runs after idle_wait");
    }
    std::unique_lock lock(m_);
    if (stopping_) return;
    // A shard that filled its batch may have more due: go on at once.
    const bool more = pass.full && pass.shard_errors == 0;
    if (!more) wake_.wait_for(lock, options_.idle_wait, [this] { return stopping_; });
    if (stopping_) return;
  }
}

}  // namespace orpheus
