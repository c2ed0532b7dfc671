#include "single_writer.hpp"

#include <algorithm>
#include <string>

namespace orpheus::sqlite_detail {
namespace {

storage_error waited_for_writer(std::size_t waiting) {
  return storage_error::transient("sqlite: waited busy_timeout for the writer connection (" +
                                  std::to_string(waiting) + " waiting)");
}

storage_error batch_rolled_back() {
  return storage_error::transient(
      "sqlite: the database rolled the batch back after an error; nothing of it was committed");
}

// Ending a member failed with `e` (an allocation), and the member was undone
// instead: a plain retryable failure, nothing kept (not in doubt).
storage_error ending_failed(const std::exception_ptr& e) {
  std::string what = "an unknown exception";
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    what = x.what();
  } catch (...) {  // keep the generic text
  }
  return storage_error::transient("sqlite: ending this transaction failed (" + what +
                                  "); it was undone, nothing of it was kept");
}

// A job that was undone (it threw, or its statements failed) in a batch that
// was then lost, or that did not finish in time.
storage_error undone_in_unsure_batch() {
  return storage_error::transient(
      "sqlite: this transaction failed and was undone, in a batch that did not commit: what "
      "it failed on may be another member's write that was never committed; nothing of it "
      "was kept");
}

// Whether the failure a job ended with is a final answer (an orpheus::error
// that is not retryable). Retryable and in-doubt ones already say "retry",
// and any other exception is the caller's own business (the manager's
// Post-RPC failure, which carries whether the RPC ran).
bool is_final_answer(const std::exception_ptr& thrown, const std::optional<storage_error>& own) {
  if (own) return !own->retryable();
  try {
    std::rethrow_exception(thrown);
  } catch (const error& e) {
    return !e.retryable();
  } catch (...) {  // NOLINT(bugprone-empty-catch): not an answer of the store's to change
  }
  return false;
}

// A transaction this thread began inside another on the store: it would wait
// for itself. A programming error, final (codes::nested_transaction), whatever
// the key a request holds.
storage_error nested_transaction(std::string detail) {
  // NOLINTNEXTLINE(modernize-return-braced-init-list): the constructor is explicit
  return storage_error(error_info::of(error_class::internal, codes::nested_transaction,
                                      "a transaction was begun inside another on the same thread")
                           .with_internal(std::move(detail)));
}

storage_error deferred_foreign_key() {
  return storage_error::permanent(
      "sqlite: FOREIGN KEY constraint failed (a deferred foreign key this transaction left "
      "violated); nothing of it was committed");
}

}  // namespace

single_writer::single_writer(const sqlite_options& o)
    : busy_timeout_(o.busy_timeout),
      max_batch_(o.max_batch),
      max_batch_age_(o.max_batch_age),
      conn_([&] {
        // The hook is in place before the writer thread starts.
        auto c = std::make_unique<connection>(o);
        sqlite3_commit_hook(c->db(), &single_writer::on_commit, this);
        return c;
      }()),
      writer_([this] { writer_loop(); }) {}

int single_writer::on_commit(void* self) {
  auto* w = static_cast<single_writer*>(self);
  if (!w->committing_) w->foreign_commit_ = true;
  return 0;  // let it commit
}

storage_error single_writer::batch_lost() const {
  if (!foreign_commit_) return batch_rolled_back();
  // Found in review: a COMMIT run as a statement (by a transaction that is
  // not the library's: the application's own, from begin_on_shard()) ends
  // the batch with everything in it committed, or about to be. Saying
  // "nothing of it was committed" would be false.
  return storage_error::transient(
      "sqlite: a COMMIT outside the writer ended the batch; what was in it may be committed",
      /*in_doubt=*/true);
}

single_writer::~single_writer() {
  {
    const std::lock_guard lock(m_);
    stopping_ = true;
  }
  writer_wanted_.notify_one();
  writer_.join();
}

bool single_writer::parker::sleep_until(clock::time_point until) {
  std::unique_lock lock(m);
  return cv.wait_until(lock, until, [&] { return woken; });
}

void single_writer::parker::wake() {
  {
    const std::lock_guard lock(m);
    woken = true;
  }
  cv.notify_all();
}

void single_writer::take_turn(std::unique_lock<std::mutex>& lock,
                              std::shared_ptr<parker>* waiting_as) {
  if (!taken_ && line_.empty()) {
    taken_ = true;
    return;
  }
  auto me = std::make_shared<parker>();
  line_.push_back(me);
  if (waiting_as != nullptr) *waiting_as = me;
  const auto until = clock::now() + busy_timeout_;
  lock.unlock();
  me->sleep_until(until);
  lock.lock();
  // Off the line means given the connection, even if the wake-up came after
  // the deadline; still on it means nobody gave it: leave the line.
  if (const auto it = std::find(line_.begin(), line_.end(), me); it != line_.end()) {
    line_.erase(it);
    throw waited_for_writer(line_.size() + 1);
  }
}

// Gives the connection to the next in line (woken by wake_and_unlock), or
// frees it.
void single_writer::pass_turn(std::unique_lock<std::mutex>& lock) noexcept {
  turn_holder_ = {};
  if (line_.empty()) {
    taken_ = false;
    return;
  }
  std::shared_ptr<parker> next = std::move(line_.front());
  line_.pop_front();
  defer_wake(lock, next);
}

// Found in review: to_wake_ is emptied of its capacity at every hand-off, so
// each push allocates; one that threw (out of memory) in pass_turn left the
// turn taken for good, and every later write waited for it. A parker that
// cannot be queued is woken now, under the lock: slower, never lost.
void single_writer::defer_wake(std::unique_lock<std::mutex>&,
                               const std::shared_ptr<parker>& p) noexcept {
  try {
    to_wake_.push_back(p);
  } catch (...) {
    p->wake();
  }
}

void single_writer::wake_and_unlock(std::unique_lock<std::mutex>& lock) {
  std::vector<std::shared_ptr<parker>> now;
  now.swap(to_wake_);
  lock.unlock();
  for (const auto& p : now) p->wake();
}

bool single_writer::has_waiter(std::unique_lock<std::mutex>&) const { return !line_.empty(); }

bool single_writer::batch_may_grow(std::unique_lock<std::mutex>&) const {
  // A doomed batch (undo_member()) is ended at once: a member joining it
  // would only lose its work.
  return !doomed_ && kept_ < max_batch_ && clock::now() - batch_started_ < max_batch_age_;
}

void single_writer::refuse_on_writer_thread() const {
  if (std::this_thread::get_id() == writer_.get_id()) {
    throw nested_transaction(
        "sqlite: a transaction begun inside another one on this store would wait for itself");
  }
}

void single_writer::refuse_if_turn_is_mine(std::unique_lock<std::mutex>&) const {
  // Found in review: a thread that began a transaction on the store and,
  // before ending it, began another or called process() queued behind
  // itself: every write of the process stalled for busy_timeout, and the
  // caller was told to retry (storage_unavailable) something that cannot
  // ever succeed. It works on MySQL (two connections); here it cannot.
  if (taken_ && turn_holder_ == std::this_thread::get_id()) {
    throw nested_transaction(
        "sqlite: this thread holds a transaction on this store that it has not ended; a "
        "second one (a transaction, or a request's) would wait for the first: end it first");
  }
}

// BEGIN IMMEDIATE (other processes: the busy timeout) without m_ held.
// Throws what BEGIN threw, with m_ held again and no batch open.
void single_writer::open_batch(std::unique_lock<std::mutex>& lock) {
  lock.unlock();
  try {
    end_leftover_transaction();
    conn_->exec("BEGIN IMMEDIATE");
  } catch (...) {
    lock.lock();
    throw;
  }
  lock.lock();
  batch_open_ = true;
  foreign_commit_ = false;
  doomed_ = false;
  ++batch_;
  kept_ = 0;
  batch_started_ = clock::now();
  batch_gate_ = std::make_shared<parker>();
}

void single_writer::run(const std::function<void(connection&)>& body) {
  refuse_on_writer_thread();
  auto j = std::make_shared<job>();
  j->body = &body;
  std::unique_lock lock(m_);
  refuse_if_turn_is_mine(lock);
  if (stopping_) throw storage_error::transient("sqlite: the store is closing; nothing was run");
  if (!jobs_gate_) jobs_gate_ = std::make_shared<parker>();
  j->gate = jobs_gate_;
  jobs_.push_back(j);
  const bool wake_writer = writer_idle_ && jobs_.size() == 1;
  lock.unlock();
  if (wake_writer) writer_wanted_.notify_one();

  // One sleep, until the batch that ran the job finished. A job left behind
  // by a full batch is given a new gate and sleeps again.
  const auto until = clock::now() + busy_timeout_;
  lock.lock();
  // A job whose batch was lost may be put back in line to run again
  // (put_back_after_lost_batch), also while its caller waits for the batch
  // to finish: it is waited for again, by the same bounds.
  for (;;) {
    while (j->at == job::state::queued) {
      if (clock::now() >= until) {  // never started (or undone and put back): nothing happened
        j->at = job::state::abandoned;
        std::erase(jobs_, j);
        throw waited_for_writer(line_.size() + jobs_.size() + 1);
      }
      const std::shared_ptr<parker> gate = j->gate;
      lock.unlock();
      gate->sleep_until(until);
      lock.lock();
    }
    // The body may use this thread's stack: never return while it runs.
    while (j->at == job::state::running) {
      const std::shared_ptr<parker> gate = j->gate;
      lock.unlock();
      gate->sleep_until(clock::now() + std::chrono::milliseconds(20));
      lock.lock();
    }
    if (j->at == job::state::queued) continue;
    const std::uint64_t waited_for = j->batch;
    if (finished_ < j->batch) {  // like leave(): at most busy_timeout after the body
      const std::shared_ptr<parker> gate = j->gate;
      lock.unlock();
      gate->sleep_until(std::max(until, clock::now() + busy_timeout_));
      lock.lock();
    }
    // Only once it ran in the batch waited for (found in review: put back
    // and running again, or run again, while its caller slept here, it was
    // taken for unfinished: its body ran on after the caller returned, or a
    // commit was reported in doubt).
    if (j->at == job::state::ran && j->batch == waited_for) break;
  }
  const bool done = finished_ >= j->batch && !(j->gate && j->gate->unknown);
  // Found in review: a caller that leaves before its batch finished must not
  // have its job put back in line after it left (the body it points to is
  // gone): marked as given up, which a lost batch leaves alone.
  if (!done) j->at = job::state::abandoned;
  // The gate of the round it ran in: finish_batch() wrote the outcome there.
  std::optional<storage_error> batch_failure;
  if (done && j->batch != 0) batch_failure = j->gate->failure;
  lock.unlock();
  if (j->thrown || j->own) {  // undone: its own outcome, if its batch committed
    // Found in review: a job reads what the members before it in the batch
    // wrote, uncommitted. If the batch is lost (or not known to be
    // committed), a final failure may rest on writes that never existed: a
    // UNIQUE row, funds a member before it reserved. A final answer drawn
    // from that would be false; it kept nothing, so it is told to retry.
    if ((!done || batch_failure) && is_final_answer(j->thrown, j->own) && !j->ended_batch_alone) {
      throw undone_in_unsure_batch();
    }
    if (j->thrown) std::rethrow_exception(j->thrown);
    throw *j->own;
  }
  if (!done) {
    throw storage_error::transient(
        "sqlite: the batch holding this commit did not finish within busy_timeout",
        /*in_doubt=*/true);
  }
  if (batch_failure) throw *batch_failure;
}

void single_writer::writer_loop() {
  std::unique_lock lock(m_);
  for (;;) {
    writer_idle_ = true;
    writer_wanted_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
    writer_idle_ = false;
    if (jobs_.empty()) return;  // stopping, and nothing is left to run
    try {
      take_turn(lock, &writer_in_line_);
      writer_in_line_.reset();
    } catch (const storage_error&) {
      writer_in_line_.reset();
      continue;  // a thread member held the connection that long; each job has its deadline
    }
    if (!batch_open_) {
      try {
        open_batch(lock);
      } catch (const storage_error& e) {  // nothing ran: every queued job gets the error
        for (auto& j : jobs_) {
          j->at = job::state::ran;
          j->own = e;
        }
        jobs_.clear();
        if (jobs_gate_) defer_wake(lock, jobs_gate_);
        jobs_gate_.reset();
        pass_turn(lock);
        wake_and_unlock(lock);
        lock.lock();
        continue;
      }
    }
    run_jobs(lock);
    if (batch_open_ && !(has_waiter(lock) && batch_may_grow(lock))) commit_batch(lock);
    pass_turn(lock);
    wake_and_unlock(lock);
    lock.lock();
  }
}

// Rounds of the jobs queued, each job in its savepoint, while the batch may
// grow. The first round always runs, as a thread member always joins the
// batch it is handed (a batch handed on full or old still takes one round).
void single_writer::run_jobs(std::unique_lock<std::mutex>& lock) {
  bool first = true;
  while (!jobs_.empty() && batch_open_ && (first || batch_may_grow(lock))) {
    first = false;
    // At most what max_batch leaves (at least one); the rest wait for the
    // next batch, on a gate of their own.
    const std::size_t room = std::max<std::size_t>(1, max_batch_ > kept_ ? max_batch_ - kept_ : 0);
    std::vector<std::shared_ptr<job>> round;
    if (jobs_.size() <= room) {
      round.swap(jobs_);
      job_gates_.push_back(std::move(jobs_gate_));
      jobs_gate_.reset();
    } else {
      // Split: each part gets a gate of its own, and the callers of both,
      // asleep on the old one, wake once and sleep again on theirs.
      const auto cut = jobs_.begin() + static_cast<std::ptrdiff_t>(room);
      round.assign(jobs_.begin(), cut);
      jobs_.erase(jobs_.begin(), cut);
      defer_wake(lock, jobs_gate_);
      job_gates_.push_back(std::make_shared<parker>());
      for (auto& j : round) j->gate = job_gates_.back();
      jobs_gate_ = std::make_shared<parker>();
      for (auto& j : jobs_) j->gate = jobs_gate_;
    }
    const std::uint64_t batch = batch_;
    bool outer_lost = false;
    std::shared_ptr<job> ended_it;  // the job whose own statements ended the batch
    for (auto& j : round) {
      if (j->at == job::state::abandoned) continue;  // its caller gave up before it started
      if (outer_lost) continue;                      // not run: put back in line below
      j->at = job::state::running;
      j->batch = batch;
      // Nothing uncommitted under its statements (a doomed batch keeps a
      // member's writes it could not undo).
      const bool wrote_first = kept_ == 0 && !doomed_;
      lock.unlock();
      run_one(*j);
      outer_lost = sqlite3_get_autocommit(conn_->db()) != 0;
      lock.lock();
      j->at = job::state::ran;
      ++stats_.transactions;
      if (j->kept) {
        ++kept_;
      } else {
        ++stats_.rollbacks;
      }
      if (outer_lost && !foreign_commit_ && is_final_answer(j->thrown, j->own)) {
        ended_it = j;
        j->ended_batch_alone = wrote_first;
      }
    }
    if (outer_lost) {
      // SQLite rolled the outer transaction back on its own (or a foreign
      // COMMIT ended it): every member that committed into it lost its work.
      finish_batch(lock, batch, batch_lost());
      put_back_after_lost_batch(lock, round, ended_it);
      return;
    }
  }
}

// Found in review: a job whose own statement rolls the whole transaction
// back (SQLite's ROLLBACK conflict resolution: INSERT OR ROLLBACK, a table's
// ON CONFLICT ROLLBACK, a trigger's RAISE(ROLLBACK)) took its batch-mates'
// work with it, and was itself told to retry, as a member of a lost batch:
// each retry of a request refused for good lost another batch. What can run
// again does, in a batch of its own turn:
//   - the jobs of this round that had not run (nothing of them ran);
//   - when a job's final refusal ended it (SQLite's own rollback, not a
//     foreign COMMIT), the jobs of this round that ran before it, all undone
//     with the batch: a body runs again as a retry would (backend.hpp);
//   - that job itself, once, first in line, when what it was refused on may
//     be another member's uncommitted write: run first in a batch, its
//     refusal rests on committed data alone, and is its answer
//     (job::ended_batch_alone).
// Thread members of the batch (they run code of their own between
// statements) and jobs of its earlier rounds are told it was lost
// (retryable, nothing committed), as before.
void single_writer::put_back_after_lost_batch(std::unique_lock<std::mutex>& /*lock*/,
                                              const std::vector<std::shared_ptr<job>>& round,
                                              const std::shared_ptr<job>& ended_it) {
  std::vector<std::shared_ptr<job>> again;
  try {  // what may allocate, before anything changes
    again.reserve(round.size());
    jobs_.reserve(jobs_.size() + round.size());
    if (!jobs_gate_) jobs_gate_ = std::make_shared<parker>();
  } catch (...) {  // out of memory: nothing is put back; those that never ran are told
    for (const auto& j : round) {
      if (j->at == job::state::queued) {
        j->at = job::state::ran;
        j->own = batch_lost();
      }
    }
    return;
  }
  if (ended_it && !ended_it->ended_batch_alone && !ended_it->run_again) {
    ended_it->run_again = true;
    again.push_back(ended_it);
  }
  bool before_it = true;
  for (const auto& j : round) {
    if (j == ended_it) {
      before_it = false;
      continue;
    }
    const bool never_ran = j->at == job::state::queued;
    const bool undone_with_it = j->at == job::state::ran && ended_it && before_it;
    if (never_ran || undone_with_it) again.push_back(j);
  }
  for (const auto& j : again) {
    j->at = job::state::queued;
    j->batch = 0;
    j->kept = false;
    j->thrown = nullptr;
    j->own.reset();
    j->gate = jobs_gate_;  // its caller, woken by the lost batch's end, sleeps again on this
  }
  jobs_.insert(jobs_.begin(), again.begin(), again.end());
}

void single_writer::run_one(job& j) {
  try {
    conn_->exec_cached("SAVEPOINT orpheus_member");
  } catch (const storage_error& e) {
    j.own = e;
    return;
  }
  try {
    (*j.body)(*conn_);
  } catch (...) {
    j.thrown = std::current_exception();
  }
  std::exception_ptr ending;
  j.kept = end_member_or_undo(!j.thrown, j.own, ending);
  if (ending && !j.thrown) {
    try {
      j.own = ending_failed(ending);
    } catch (...) {  // out of memory again: the exception itself says it
      j.thrown = ending;
    }
  }
}

single_writer::member_ticket single_writer::enter() {
  refuse_on_writer_thread();
  std::unique_lock lock(m_);
  refuse_if_turn_is_mine(lock);
  take_turn(lock);
  turn_holder_ = std::this_thread::get_id();
  try {
    if (!batch_open_) open_batch(lock);
    member_ticket member{batch_, batch_gate_};
    lock.unlock();
    if (savepoint_fails_ && savepoint_fails_()) {
      throw storage_error::transient("sqlite: SAVEPOINT failed (a test's failure)");
    }
    conn_->exec_cached("SAVEPOINT orpheus_member");
    return member;
  } catch (...) {
    if (!lock.owns_lock()) lock.lock();
    try {
      if (batch_open_ && sqlite3_get_autocommit(conn_->db()) != 0) {
        // The failure took the outer transaction with it: its members lost
        // their work, and the next member must open a new batch.
        finish_batch(lock, batch_, batch_lost());
      }
      // An open batch with members that committed must still be finished
      // by someone: the next member, or this one now.
      if (batch_open_ && !has_waiter(lock)) commit_batch(lock);
    } catch (...) {
      // Ending the batch failed part way (an allocation): the turn is passed
      // on all the same, as leave() does (found in review: every later
      // write waited busy_timeout for it and failed), and the batch's
      // members are told its outcome is unknown.
      if (!lock.owns_lock()) lock.lock();
      if (batch_open_) abandon_batch(lock);
    }
    pass_turn(lock);
    wake_and_unlock(lock);
    throw;
  }
}

void single_writer::leave(const member_ticket& member, bool keep) {
  const std::uint64_t batch = member.batch;
  // 1. The member's own savepoint, while it still has the connection.
  std::optional<storage_error> own_failure;
  std::exception_ptr ending;  // rethrown once the turn is passed on
  const bool kept = end_member_or_undo(keep, own_failure, ending);
  const bool outer_alive = sqlite3_get_autocommit(conn_->db()) == 0;

  std::unique_lock lock(m_);
  ++stats_.transactions;
  if (!kept) ++stats_.rollbacks;
  const bool mine = batch_open_ && batch_ == batch;
  try {
    if (mine && !outer_alive) {
      // SQLite rolled the outer transaction back on its own: every member
      // that committed into it lost its work, and nothing of it was
      // committed (unless a foreign COMMIT ended it: batch_lost()).
      finish_batch(lock, batch, batch_lost());
    } else if (mine) {
      if (kept) ++kept_;
      if (!(has_waiter(lock) && batch_may_grow(lock))) commit_batch(lock);
    }
  } catch (...) {
    // Ending the batch failed part way (an allocation): the turn is passed
    // on all the same (found in review: every later write waited for it),
    // and the batch's members, this one too, are told its outcome is
    // unknown.
    if (!lock.owns_lock()) lock.lock();
    if (batch_open_ && batch_ == batch) abandon_batch(lock);
    pass_turn(lock);
    wake_and_unlock(lock);
    if (!keep) return;
    throw storage_error::transient(
        "sqlite: ending the batch holding this commit failed (out of memory?); whether it "
        "committed is unknown",
        /*in_doubt=*/true);
  }
  pass_turn(lock);

  // 2. Wait until the batch is durable (or failed). Bounded: a member that
  // holds the connection forever must not hold every earlier one; past the
  // bound the outcome is unknown, which is what in doubt means.
  const auto until = clock::now() + busy_timeout_;
  if (finished_ < batch) {
    // Not finished means it is the open batch (batches finish in order),
    // whose gate this member holds.
    wake_and_unlock(lock);
    member.gate->sleep_until(until);
    if (batch_waited_) batch_waited_();
    lock.lock();
  }
  const bool done = finished_ >= batch && !member.gate->unknown;
  std::optional<storage_error> batch_failure;
  if (done) batch_failure = member.gate->failure;
  wake_and_unlock(lock);
  if (!keep) return;
  if (ending) throw ending_failed(ending);
  if (own_failure) throw *own_failure;
  if (!done) {
    throw storage_error::transient(
        "sqlite: the batch holding this commit did not finish within busy_timeout",
        /*in_doubt=*/true);
  }
  if (batch_failure) throw *batch_failure;
}

// Ends the member whose turn it is: keeps its savepoint (RELEASE) when
// `keep`, else undoes it alone. Returns whether it was kept; `own` gets why a
// member meant to be kept was not (its statements ended the batch, or
// RELEASE failed).
bool single_writer::end_member(bool keep, std::optional<storage_error>& own) {
  if (keep && sqlite3_get_autocommit(conn_->db()) != 0) {
    own = batch_lost();
    return false;
  }
  if (keep) {
    // SQLite checks a deferred foreign key only at the outermost COMMIT:
    // one member's violation would fail the whole batch there, batch-mates
    // and all (found in review). It is this member's own failure: undone
    // alone, here.
    int deferred = 0;
    int highwater = 0;
    if (sqlite3_db_status(conn_->db(), SQLITE_DBSTATUS_DEFERRED_FKS, &deferred, &highwater, 0) ==
            SQLITE_OK &&
        deferred > 0) {
      own = deferred_foreign_key();
      undo_member();
      return false;
    }
    try {
      conn_->exec_cached("RELEASE SAVEPOINT orpheus_member");
      return true;
    } catch (const storage_error& e) {
      own = e;
    }
  }
  undo_member();
  return false;
}

// end_member(), and when that throws (an allocation: found in review, the
// turn was never passed on and every later write of the process waited for
// good), the member is undone instead and `thrown` says why.
bool single_writer::end_member_or_undo(bool keep, std::optional<storage_error>& own,
                                       std::exception_ptr& thrown) noexcept {
  try {
    if (end_member_hook_) end_member_hook_();
    return end_member(keep, own);
  } catch (...) {
    thrown = std::current_exception();
  }
  undo_member();
  return false;
}

// Undoes the member whose turn it is, alone; its savepoint must not stay
// open under the next member either. If SQLite cannot undo it alone, the
// whole batch goes (nothing of it is committed, and the caller sees the
// outer transaction gone): a member's partial writes are never kept. If even
// that fails (out of memory: the statements could not be prepared), the
// batch is doomed: commit_batch() rolls it back instead of committing it
// (found in review: it went on, and its COMMIT would have kept the writes
// of a member told "nothing kept").
void single_writer::undo_member() noexcept {
  sqlite3* db = conn_->db();
  if (sqlite3_get_autocommit(db) != 0) return;     // the batch is gone already
  const bool fail = undo_fails_ && undo_fails_();  // tests: as if no statement could run
  if (!fail &&
      sqlite3_exec(db, "ROLLBACK TO SAVEPOINT orpheus_member", nullptr, nullptr, nullptr) ==
          SQLITE_OK &&
      sqlite3_exec(db, "RELEASE SAVEPOINT orpheus_member", nullptr, nullptr, nullptr) ==
          SQLITE_OK) {
    return;
  }
  if (!fail) sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
  if (sqlite3_get_autocommit(db) == 0) doomed_ = true;
}

// Found in review: a batch whose COMMIT, and then ROLLBACK, failed (out of
// memory) left the connection inside its transaction, and every later BEGIN
// failed with "cannot start a transaction within a transaction", a permanent
// error: every request was told not to retry until the process restarted,
// and other processes waited on the write lock. Nothing of that batch was
// kept (its members were told so): it is rolled back here, or this
// transaction is refused as retryable.
void single_writer::end_leftover_transaction() {
  sqlite3* db = conn_->db();
  if (sqlite3_get_autocommit(db) == 0) {
    const bool fail = rollback_fails_ && rollback_fails_();
    if (!fail) sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
    if (sqlite3_get_autocommit(db) == 0) {
      throw storage_error::transient(
          "sqlite: an earlier batch's transaction could not be rolled back yet (out of "
          "memory?); nothing of this transaction ran");
    }
  }
  // A migration (sqlite_store::exclusively) turns foreign keys off, and may
  // not have turned them on again (inside a transaction left open the
  // PRAGMA does nothing; out of memory): every connection of the store has
  // them on.
  if (foreign_keys_off_) {
    sqlite3_exec(db, "PRAGMA foreign_keys=ON", nullptr, nullptr, nullptr);
    const auto on = conn_->run("PRAGMA foreign_keys", {});
    if (on.empty() || on[0].get<std::int64_t>(0) != 1) {
      throw storage_error::transient(
          "sqlite: foreign keys could not be turned on again after a migration; nothing of "
          "this transaction ran");
    }
    foreign_keys_off_ = false;
  }
}

void single_writer::commit_batch(std::unique_lock<std::mutex>& lock) {
  const std::uint64_t batch = batch_;
  const bool any = kept_ > 0;
  const bool doomed = doomed_;
  lock.unlock();
  std::optional<storage_error> failure;
  sqlite3* db = conn_->db();
  // A batch nobody kept anything in needs no fsync: roll it back. So does a
  // doomed one (undo_member()): its members that kept are told it failed.
  const bool commit = any && !doomed;
  const bool rollback_fails = rollback_fails_ && rollback_fails_();  // tests: out of memory
  committing_ = true;
  const int rc = !commit && rollback_fails
                     ? SQLITE_NOMEM
                     : sqlite3_exec(db, commit ? "COMMIT" : "ROLLBACK", nullptr, nullptr, nullptr);
  committing_ = false;
  if (any && doomed) {
    failure = storage_error::transient(
        "sqlite: the batch was rolled back: one of its transactions could not be undone "
        "alone; nothing of it was committed");
  } else if (rc != SQLITE_OK && any) {
    try {
      throw_sqlite(db, rc, "commit", /*in_commit=*/true);
    } catch (const storage_error& e) {
      failure = e;
    }
  }
  if (sqlite3_get_autocommit(db) == 0 && !rollback_fails) {
    sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
  }
  lock.lock();
  if (any) ++stats_.commits;
  finish_batch(lock, batch, failure);
}

void single_writer::finish_batch(std::unique_lock<std::mutex>& lock, std::uint64_t batch,
                                 const std::optional<storage_error>& failure) {
  if (finish_batch_hook_) finish_batch_hook_();
  // Its outcome goes on every gate its members hold, and lives as long as
  // the last of them: the thread members' gate and each round's of jobs.
  // Copying it may throw (an allocation): before the batch is marked
  // finished, so that a member never reads "finished, no failure" of a
  // batch whose failure was not written; it times out in doubt instead.
  if (batch_gate_) batch_gate_->failure = failure;
  for (auto& g : job_gates_) g->failure = failure;
  batch_open_ = false;
  finished_ = batch;
  if (failure) ++stats_.failed_batches;
  if (batch_gate_) defer_wake(lock, batch_gate_);
  batch_gate_.reset();
  for (auto& g : job_gates_) defer_wake(lock, g);
  job_gates_.clear();
}

void single_writer::abandon_batch(std::unique_lock<std::mutex>& lock) noexcept {
  if (batch_gate_) {
    batch_gate_->unknown = true;
    defer_wake(lock, batch_gate_);
  }
  batch_gate_.reset();
  for (auto& g : job_gates_) {
    g->unknown = true;
    defer_wake(lock, g);
  }
  job_gates_.clear();
  batch_open_ = false;
  finished_ = batch_;
}

void single_writer::exclusively(const std::function<void(connection&)>& f) {
  refuse_on_writer_thread();
  std::unique_lock lock(m_);
  refuse_if_turn_is_mine(lock);
  take_turn(lock);
  try {
    if (batch_open_) commit_batch(lock);  // handed an open batch: finish it first
    wake_and_unlock(lock);                // its members, before f runs
    end_leftover_transaction();
    f(*conn_);
    lock.lock();
  } catch (...) {
    if (!lock.owns_lock()) lock.lock();
    pass_turn(lock);
    wake_and_unlock(lock);
    throw;
  }
  pass_turn(lock);
  wake_and_unlock(lock);
}

sqlite_writer_stats single_writer::stats() {
  std::unique_lock lock(m_);
  sqlite_writer_stats out = stats_;
  // Transactions, not threads: the writer waits in line for the jobs.
  out.waiting = jobs_.size() + line_.size() -
                static_cast<std::size_t>(std::count(line_.begin(), line_.end(), writer_in_line_));
  return out;
}

}  // namespace orpheus::sqlite_detail
