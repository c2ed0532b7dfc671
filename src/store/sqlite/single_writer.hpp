// The one connection of this process that writes to the SQLite file, the
// FIFO queue in front of it, and group commit.
//
// Why: with a connection per thread, writers of one process met at SQLite's
// file lock and slept in its busy handler (tails of most of a second under
// load), and every transaction paid an fsync of its own. Here the threads of
// one process take turns on one connection in arrival order, and each
// transaction (a member) runs as a SAVEPOINT inside a shared outer
// transaction (a batch). A member that ends while others wait hands the
// connection on and waits for the batch's COMMIT; the member that finds no one
// waiting, or the batch full or old, commits it: one fsync for the batch.
// Other processes on the same file still meet at the file lock, with the busy
// timeout, as before.
//
// Durability does not change: synchronous=FULL, and a member's commit
// returns only once the COMMIT that contains it is durable. A member rolled
// back undoes its own savepoint only. A member that ends by rollback also
// waits for its batch: it may have read what earlier members wrote, and
// nothing it answers may be seen before that is durable.
//
// Failure: if the batch's COMMIT fails, every member that committed into it
// gets an in-doubt storage_error. If SQLite rolls the outer transaction back
// on its own (I/O error, full disk), every member that committed into it gets
// a retryable one (nothing was committed), and the member that was running
// is poisoned (see sqlite_store.cpp).
//
// Two kinds of member. A thread member (enter() ... leave()) runs its
// statements on its own thread once its turn comes: it sleeps for its turn,
// then for its batch. A job (run()) is handed to the writer's own thread,
// which runs the jobs queued at once one after the other in its turn, each
// in its savepoint, and the job's thread sleeps once, until its batch is
// durable: on one CPU, every sleep is a context switch, and the turn was one
// per transaction (issue 8). The library's hot transactions are jobs
// (store_backend::transact); the others are thread members.
//
// Thread safety: all members are called from their own threads; the
// connection is used only by the member whose turn it is (the writer thread
// runs jobs in its turns).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "connection.hpp"

namespace orpheus::sqlite_detail {

class single_writer {
 public:
  using clock = std::chrono::steady_clock;

  // A sleeping thread (or the members of a batch) and the flag that wakes
  // it, under a lock of its own:
  // its waker wakes it after releasing m_, so that the woken thread does not
  // run straight into m_ still held by its waker (on one CPU, two more
  // context switches per wake-up). Shared: the waker may still hold it when
  // the sleeper has given up and gone. Public only so that a member can hold
  // its batch's gate (member_ticket); nothing outside this class uses it.
  struct parker {
    std::mutex m;
    std::condition_variable cv;
    bool woken = false;
    // A batch's gate only: why the batch failed, set under single_writer's
    // m_ by finish_batch() before the wake, read under m_. The outcome
    // lives as long as a member that may still read it (found in review:
    // it was kept in a map of the last 4,096 failures, and a member woken
    // after more than that would have read "committed").
    std::optional<storage_error> failure;
    // A batch's gate only: ending the batch failed part way (an
    // allocation), so its outcome is unknown: its members are in doubt.
    // Set under m_ by abandon_batch() before the wake, read under m_.
    bool unknown = false;
    /// False when `until` passed first.
    bool sleep_until(clock::time_point until);
    void wake();
  };

  /// A thread member's place, from enter() to leave(): its batch and that
  /// batch's gate, which carries the batch's outcome.
  struct member_ticket {
    std::uint64_t batch = 0;
    std::shared_ptr<parker> gate;
  };

  explicit single_writer(const sqlite_options& o);
  /// Runs the jobs still queued, then stops the writer thread.
  ~single_writer();
  single_writer(const single_writer&) = delete;
  single_writer& operator=(const single_writer&) = delete;

  /// Runs `body` on the connection as one member of a batch, on the writer
  /// thread, and returns once the batch holding it is durable: enter(),
  /// body, leave() without this thread waiting for a turn. A body that
  /// throws is undone alone (ROLLBACK TO its savepoint) and its exception is
  /// rethrown here once its batch finished. Never returns while `body` runs.
  /// Errors as enter() and leave(): waiting longer than busy_timeout to be
  /// run is retryable (nothing ran); a batch not finished within busy_timeout
  /// after the body is in doubt. From the writer thread itself (a body that
  /// opens another transaction) it throws at once: it would wait for itself.
  void run(const std::function<void(connection&)>& body);

  /// Takes this thread's turn (first come, first served; at most
  /// busy_timeout, else a retryable storage_error), opens a batch if none is
  /// open, and starts the member's savepoint. Returns the member's place.
  member_ticket enter();
  /// The connection, for the member whose turn it is.
  [[nodiscard]] connection& conn() { return *conn_; }
  /// Whether a COMMIT run as a statement ended the open batch, for the
  /// member whose turn it is (the commit hook runs on its thread).
  [[nodiscard]] bool committed_by_a_statement() const noexcept { return foreign_commit_; }
  /// Ends the member whose turn it is: keeps (RELEASE) or undoes (ROLLBACK
  /// TO) its savepoint, then hands the connection on or commits the batch,
  /// and returns once the batch is finished. For a kept member, throws the
  /// batch's failure; an undone member's outcome is its own rollback.
  void leave(const member_ticket& member, bool keep);
  /// Runs `f` on the connection with no batch open (migrations), in turn.
  void exclusively(const std::function<void(connection&)>& f);

  [[nodiscard]] sqlite_writer_stats stats();

  /// Tests only: called by leave() on a member's thread once it stops
  /// waiting for its batch, before it reads the batch's outcome (a thread
  /// the scheduler put off that long). Set before any member enters.
  void on_batch_waited_for_tests(std::function<void()> hook) { batch_waited_ = std::move(hook); }
  /// Tests only: called as a member's savepoint is ended, on the thread
  /// whose turn it is; what it throws stands for a failure there (an
  /// allocation). Set before any member enters.
  void on_end_member_for_tests(std::function<void()> hook) { end_member_hook_ = std::move(hook); }
  /// Tests only: when it returns true, undoing a member runs no statement,
  /// as when SQLite cannot prepare any (out of memory). Set before any
  /// member enters.
  void on_undo_for_tests(std::function<bool()> fails) { undo_fails_ = std::move(fails); }
  /// Tests only: when it returns true, a batch's ROLLBACK runs no statement,
  /// as when SQLite cannot prepare one (out of memory). Set before any
  /// member enters.
  void on_rollback_for_tests(std::function<bool()> fails) { rollback_fails_ = std::move(fails); }
  /// Tests only: when it returns true, a member's SAVEPOINT fails in
  /// enter(), as when SQLite cannot prepare it (out of memory). Set before
  /// any member enters.
  void on_savepoint_for_tests(std::function<bool()> fails) { savepoint_fails_ = std::move(fails); }
  /// Tests only: called as a batch is ended, under the writer's lock; what
  /// it throws stands for a failure there (an allocation). Set before any
  /// member enters.
  void on_finish_batch_for_tests(std::function<void()> hook) {
    finish_batch_hook_ = std::move(hook);
  }

  /// From exclusively()'s function, before it turns the connection's
  /// foreign keys off: until it calls foreign_keys_on(), every batch (and
  /// exclusively()) first turns them on again, and reads them back.
  void foreign_keys_off() noexcept { foreign_keys_off_ = true; }
  /// They are on again (read back).
  void foreign_keys_on() noexcept { foreign_keys_off_ = false; }

 private:
  // A job: a body and what became of it. Written under m_, except by the
  // writer thread between taking it and finishing its batch.
  struct job {
    const std::function<void(connection&)>* body = nullptr;
    // queued: in jobs_, or taken into a round and not started; abandoned:
    // its caller gave up while it was queued (it never runs).
    enum class state { queued, abandoned, running, ran } at = state::queued;
    std::shared_ptr<parker> gate;      // what its caller sleeps on
    std::uint64_t batch = 0;           // the batch it ran in
    bool kept = false;                 // its savepoint was released
    std::exception_ptr thrown;         // what the body threw (or ending it, out of memory)
    std::optional<storage_error> own;  // its own SAVEPOINT or RELEASE failed
    // Its own statement ended the batch (a final refusal that rolled the
    // whole transaction back) while it was the first to write in it: the
    // refusal rests on committed data alone, and is its answer.
    bool ended_batch_alone = false;
    bool run_again = false;  // put back once after ending a batch it did not write first
  };
  void writer_loop();
  /// On the writer thread, in its turn, batch open: runs the queued jobs
  /// while the batch may grow.
  void run_jobs(std::unique_lock<std::mutex>& lock);
  void run_one(job& j);
  /// After a round's batch was lost: puts back in line what may run again.
  void put_back_after_lost_batch(std::unique_lock<std::mutex>& lock,
                                 const std::vector<std::shared_ptr<job>>& round,
                                 const std::shared_ptr<job>& ended_it);
  bool end_member(bool keep, std::optional<storage_error>& own);
  bool end_member_or_undo(bool keep, std::optional<storage_error>& own,
                          std::exception_ptr& thrown) noexcept;
  void undo_member() noexcept;
  void open_batch(std::unique_lock<std::mutex>& lock);
  /// Rolls back a transaction a failed batch left open on the connection;
  /// throws storage_error::transient when it is still open. Without m_.
  void end_leftover_transaction();
  /// The open batch may take more members (max_batch, max_batch_age).
  [[nodiscard]] bool batch_may_grow(std::unique_lock<std::mutex>& lock) const;
  /// From the writer thread (a body that begins another transaction on this
  /// store), waiting for a turn would wait for itself: a permanent error.
  void refuse_on_writer_thread() const;
  /// The same for a thread that holds a member's turn (a transaction it has
  /// not ended): the turn it would wait for is its own. Under m_.
  void refuse_if_turn_is_mine(std::unique_lock<std::mutex>& lock) const;

  /// `waiting_as`, when given, is set to what this thread waits on in line.
  void take_turn(std::unique_lock<std::mutex>& lock, std::shared_ptr<parker>* waiting_as = nullptr);
  void pass_turn(std::unique_lock<std::mutex>& lock) noexcept;
  /// Queues `p` for wake_and_unlock(), or, when that cannot allocate, wakes
  /// it now. Under m_.
  void defer_wake(std::unique_lock<std::mutex>& lock, const std::shared_ptr<parker>& p) noexcept;
  [[nodiscard]] bool has_waiter(std::unique_lock<std::mutex>& lock) const;
  void commit_batch(std::unique_lock<std::mutex>& lock);
  /// Why the members of the open batch lost it when SQLite's transaction
  /// ended under them: rolled back (nothing committed), or, when a COMMIT
  /// other than the writer's own ran (a statement of someone's own
  /// transaction), in doubt: their work may be committed.
  [[nodiscard]] storage_error batch_lost() const;
  /// sqlite3_commit_hook: notes a COMMIT that is not the writer's own.
  static int on_commit(void* self);
  void finish_batch(std::unique_lock<std::mutex>& lock, std::uint64_t batch,
                    const std::optional<storage_error>& failure);
  /// Ends the open batch whose ending failed part way: its members are told
  /// its outcome is unknown, and the next member opens a new batch (after
  /// rolling back a transaction left open: end_leftover_transaction()).
  void abandon_batch(std::unique_lock<std::mutex>& lock) noexcept;
  /// Unlocks, then wakes everyone pass_turn() and finish_batch() chose.
  void wake_and_unlock(std::unique_lock<std::mutex>& lock);

  const std::chrono::milliseconds busy_timeout_;
  const std::size_t max_batch_;
  const std::chrono::microseconds max_batch_age_;
  std::unique_ptr<connection> conn_;

  std::mutex m_;
  // The line: one parker per thread waiting for its turn, served in order,
  // each woken alone (a pass wakes exactly the next one). Being taken off the
  // line by pass_turn() is being given the connection; a waiter that gave up
  // takes itself off.
  std::deque<std::shared_ptr<parker>> line_;
  bool taken_ = false;           // a member (or exclusively()) has the connection
  std::thread::id turn_holder_;  // the thread member's, while it has it
  // What members of the open batch sleep on until it finishes: one for the
  // whole batch, woken once (notify_all) when it finishes. Only one batch at
  // a time has members waiting (the next one opens after it finished), so a
  // batch's end wakes its own members only, with one system call rather
  // than one per member (each of which may switch the waker out).
  std::shared_ptr<parker> batch_gate_;
  std::vector<std::shared_ptr<parker>> to_wake_;  // once m_ is released
  // The batch: open between its BEGIN and its COMMIT.
  bool batch_open_ = false;
  std::uint64_t batch_ = 0;     // the open (or last) batch
  std::uint64_t finished_ = 0;  // every batch up to this one is finished
  std::size_t kept_ = 0;        // members of the open batch that committed
  clock::time_point batch_started_;
  // Set by the connection's thread (the one whose turn it is) only.
  bool committing_ = false;      // commit_batch()'s own COMMIT is running
  bool foreign_commit_ = false;  // another COMMIT ran since the batch opened
  bool doomed_ = false;          // a member could not be undone: never COMMIT
  sqlite_writer_stats stats_;
  std::function<void()> batch_waited_;       // on_batch_waited_for_tests()
  std::function<void()> end_member_hook_;    // on_end_member_for_tests()
  std::function<bool()> undo_fails_;         // on_undo_for_tests()
  std::function<bool()> rollback_fails_;     // on_rollback_for_tests()
  std::function<void()> finish_batch_hook_;  // on_finish_batch_for_tests()
  std::function<bool()> savepoint_fails_;    // on_savepoint_for_tests()
  // Set and read only by the thread whose turn it is (exclusively()'s, then
  // the batch's): the turn orders them.
  bool foreign_keys_off_ = false;

  // Jobs not yet run, in arrival order, and the gate their threads sleep on:
  // the jobs queued together run together (the writer takes them all), and
  // the gate is woken when the batch they ran in finishes.
  std::vector<std::shared_ptr<job>> jobs_;
  std::shared_ptr<parker> jobs_gate_;
  // Gates of the jobs run in the open batch, woken when it finishes.
  std::vector<std::shared_ptr<parker>> job_gates_;
  std::condition_variable writer_wanted_;  // jobs_ became non-empty, or stop
  bool writer_idle_ = false;               // the writer sleeps on writer_wanted_
  bool stopping_ = false;
  std::shared_ptr<parker> writer_in_line_;  // the writer's place in line_, if any
  std::thread writer_;                      // last: started once everything above is
};

}  // namespace orpheus::sqlite_detail
