// The completer: finishes requests whose clients went away, on the server
// side (SPEC section 8, docs/operations.md).
//
//   orpheus::manager m(store, cfg);
//   m.register_handler("create_payment", 1, pre, rpc, post);   // before serving
//   orpheus::completer c(m);
//   c.start();            // a background thread; c.stop() or ~completer() ends it
//   ... m.process("create_payment", id) from the request path ...
//
// A pass works through every shard, up to `batch` records each, one record
// at a time: it claims the most overdue record that names a handler
// registered here (in a version this build has): a retryable one whose
// backoff has passed (next_attempt_us, from config::retry_backoff_base and
// retry_backoff_max) or one in progress whose lease expired (a crashed or
// stalled attempt). The claim is one short transaction (`SELECT ... FOR
// UPDATE SKIP LOCKED` on MySQL, the single writer on SQLite) that pushes the
// record's next attempt a lease into the future, so other completers pass
// over it. Then it is resumed with manager::complete(): a take-over like a
// client's retry (is_retry() true, the stored Pre-RPC result, a new lease
// and fencing token), so any number of completers and servers may run at
// once and no attempt of a key overlaps another. A request out of attempts
// or window is parked, as on the request path, and so is one whose stored
// Pre-RPC result the handler cannot read. Records of handlers this build
// does not have are left alone (another service's, or a newer version's).
//
// Thread safety: run_once() may be called from several threads, and several
// completers may share a manager. The manager must outlive the completer.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <thread>

#include "orpheus/manager.hpp"

namespace orpheus {

struct completer_options {
  /// Records claimed per shard per pass.
  std::size_t batch = 32;
  /// How long the background thread waits after a pass that found nothing
  /// due (or failed to reach a shard) before the next one.
  std::chrono::milliseconds idle_wait = std::chrono::seconds{1};
};

/// What one pass did.
struct completer_pass {
  std::size_t claimed = 0;       ///< due records claimed
  std::size_t finished = 0;      ///< resumed and recorded (success or final failure)
  std::size_t retrying = 0;      ///< failed again in a way safe to retry: due again later
  std::size_t parked = 0;        ///< out of attempts or window, or no handler for them
  std::size_t skipped = 0;       ///< taken by someone else meanwhile (409), or gone
  std::size_t shard_errors = 0;  ///< shards whose claim failed (logged)
  bool full = false;             ///< some shard gave a whole batch: more may be due
};

class completer {
 public:
  /// Throws config_error when o.batch is 0 or o.idle_wait is not 1 ms to
  /// 24 hours.
  explicit completer(manager& m, completer_options o = {});
  completer(const completer&) = delete;
  completer& operator=(const completer&) = delete;
  /// Stops the background thread, if started; a pass in progress finishes
  /// the request it is running and claims no other.
  ~completer();

  /// One pass over every shard, on the calling thread; it ends early once
  /// stop() was called.
  completer_pass run_once();

  /// Runs passes on a background thread until stop(). On that thread (from
  /// a handler or an observer) start() does nothing and stop() only ends the
  /// loop after its pass, to be joined by a later start() or stop() on
  /// another thread; the completer must not be destroyed on that thread.
  void start();
  void stop();

 private:
  void loop();

  manager& manager_;
  completer_options options_;
  std::mutex m_;
  std::condition_variable wake_;
  bool stopping_ = false;
  /// Held by start() and stop() from end to end (stop() joins under it), so
  /// that they run one at a time; thread_ is touched only under it.
  std::mutex lifecycle_;
  std::thread thread_;
  /// The background thread's id while it runs: start() and stop() called on
  /// it (from a handler, an observer) must not wait for lifecycle_, which a
  /// stop() on another thread holds while it joins this one.
  std::atomic<std::thread::id> loop_thread_{};
};

}  // namespace orpheus
