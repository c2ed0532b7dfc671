#include "single_writer.hpp"

#include <algorithm>
#include <string>

namespace orpheus::sqlite_detail {
namespace {

// How many failed batches are remembered for members that still wait: a
// member woken after more failures than this would be told its batch
// committed. Failures are rare (I/O errors, a full disk); this is a bound on
// memory, not a working set.
constexpr std::size_t failures_kept = 4096;

}  // namespace

single_writer::single_writer(const sqlite_options& o)
    : busy_timeout_(o.busy_timeout),
      max_batch_(o.max_batch),
      max_batch_age_(o.max_batch_age),
      conn_(std::make_unique<connection>(o)) {}

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

void single_writer::take_turn(std::unique_lock<std::mutex>& lock) {
  if (!taken_ && line_.empty()) {
    taken_ = true;
    return;
  }
  auto me = std::make_shared<parker>();
  line_.push_back(me);
  const auto until = clock::now() + busy_timeout_;
  lock.unlock();
  me->sleep_until(until);
  lock.lock();
  // Off the line means given the connection, even if the wake-up came after
  // the deadline; still on it means nobody gave it: leave the line.
  if (const auto it = std::find(line_.begin(), line_.end(), me); it != line_.end()) {
    line_.erase(it);
    throw storage_error::transient("sqlite: waited busy_timeout for the writer connection (" +
                                   std::to_string(line_.size() + 1) + " waiting)");
  }
}

// Gives the connection to the next in line (woken by wake_and_unlock), or
// frees it.
void single_writer::pass_turn(std::unique_lock<std::mutex>&) {
  if (line_.empty()) {
    taken_ = false;
    return;
  }
  to_wake_.push_back(std::move(line_.front()));
  line_.pop_front();
}

void single_writer::wake_and_unlock(std::unique_lock<std::mutex>& lock) {
  std::vector<std::shared_ptr<parker>> now;
  now.swap(to_wake_);
  lock.unlock();
  for (const auto& p : now) p->wake();
}

bool single_writer::has_waiter(std::unique_lock<std::mutex>&) const { return !line_.empty(); }

std::uint64_t single_writer::enter() {
  std::unique_lock lock(m_);
  take_turn(lock);
  try {
    if (!batch_open_) {
      lock.unlock();
      conn_->exec("BEGIN IMMEDIATE");  // other processes: the busy timeout
      lock.lock();
      batch_open_ = true;
      ++batch_;
      kept_ = 0;
      batch_started_ = clock::now();
      batch_gate_ = std::make_shared<parker>();
    }
    const std::uint64_t batch = batch_;
    lock.unlock();
    conn_->exec("SAVEPOINT orpheus_member");
    return batch;
  } catch (...) {
    if (!lock.owns_lock()) lock.lock();
    if (batch_open_ && sqlite3_get_autocommit(conn_->db()) != 0) {
      // The failure took the outer transaction with it: its members lost
      // their work, and the next member must open a new batch.
      finish_batch(lock, batch_,
                   storage_error::transient("sqlite: the database rolled the batch back after an "
                                            "error; nothing of it was committed"));
    }
    // An open batch with members that committed must still be finished by
    // someone: the next member, or this one now.
    if (batch_open_ && !has_waiter(lock)) commit_batch(lock);
    pass_turn(lock);
    wake_and_unlock(lock);
    throw;
  }
}

void single_writer::leave(std::uint64_t batch, bool keep) {
  // 1. The member's own savepoint, while it still has the connection.
  std::optional<storage_error> own_failure;
  bool kept = keep;
  sqlite3* db = conn_->db();
  bool outer_alive = sqlite3_get_autocommit(db) == 0;
  if (outer_alive && keep) {
    try {
      conn_->exec("RELEASE SAVEPOINT orpheus_member");
    } catch (const storage_error& e) {
      own_failure = e;
      kept = false;
    }
  }
  if (sqlite3_get_autocommit(db) == 0 && !kept) {
    // Undo this member alone; the savepoint must not stay open under the
    // next member either.
    sqlite3_exec(db, "ROLLBACK TO SAVEPOINT orpheus_member", nullptr, nullptr, nullptr);
    sqlite3_exec(db, "RELEASE SAVEPOINT orpheus_member", nullptr, nullptr, nullptr);
  }
  outer_alive = sqlite3_get_autocommit(db) == 0;

  std::unique_lock lock(m_);
  ++stats_.transactions;
  if (!kept) ++stats_.rollbacks;
  const bool mine = batch_open_ && batch_ == batch;
  if (mine && !outer_alive) {
    // SQLite rolled the outer transaction back on its own: every member that
    // committed into it lost its work, and nothing of it was committed.
    finish_batch(lock, batch,
                 storage_error::transient("sqlite: the database rolled the batch back after an "
                                          "error; nothing of it was committed"));
  } else if (mine) {
    if (kept) ++kept_;
    const bool hand_on =
        has_waiter(lock) && kept_ < max_batch_ && clock::now() - batch_started_ < max_batch_age_;
    if (!hand_on) commit_batch(lock);
  }
  pass_turn(lock);

  // 2. Wait until the batch is durable (or failed). Bounded: a member that
  // holds the connection forever must not hold every earlier one; past the
  // bound the outcome is unknown, which is what in doubt means.
  const auto until = clock::now() + busy_timeout_;
  if (finished_ < batch) {
    // Not finished means it is the open batch (batches finish in order).
    const std::shared_ptr<parker> gate = batch_gate_;
    wake_and_unlock(lock);
    gate->sleep_until(until);
    lock.lock();
  }
  const bool done = finished_ >= batch;
  std::optional<storage_error> batch_failure;
  if (const auto f = failed_.find(batch); done && f != failed_.end()) batch_failure = f->second;
  wake_and_unlock(lock);
  if (!keep) return;
  if (own_failure) throw *own_failure;
  if (!done) {
    throw storage_error::transient(
        "sqlite: the batch holding this commit did not finish within busy_timeout",
        /*in_doubt=*/true);
  }
  if (batch_failure) throw *batch_failure;
}

void single_writer::commit_batch(std::unique_lock<std::mutex>& lock) {
  const std::uint64_t batch = batch_;
  const bool any = kept_ > 0;
  lock.unlock();
  std::optional<storage_error> failure;
  sqlite3* db = conn_->db();
  // A batch nobody kept anything in needs no fsync: roll it back.
  const int rc = sqlite3_exec(db, any ? "COMMIT" : "ROLLBACK", nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK && any) {
    try {
      throw_sqlite(db, rc, "commit", /*in_commit=*/true);
    } catch (const storage_error& e) {
      failure = e;
    }
  }
  if (sqlite3_get_autocommit(db) == 0) sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
  lock.lock();
  if (any) ++stats_.commits;
  finish_batch(lock, batch, std::move(failure));
}

void single_writer::finish_batch(std::unique_lock<std::mutex>&, std::uint64_t batch,
                                 std::optional<storage_error> failure) {
  batch_open_ = false;
  finished_ = batch;
  if (failure) {
    ++stats_.failed_batches;
    failed_.insert_or_assign(batch, std::move(*failure));
    while (failed_.size() > failures_kept) failed_.erase(failed_.begin());
  }
  if (batch_gate_) to_wake_.push_back(std::move(batch_gate_));
  batch_gate_.reset();
}

void single_writer::exclusively(const std::function<void(connection&)>& f) {
  std::unique_lock lock(m_);
  take_turn(lock);
  try {
    if (batch_open_) commit_batch(lock);  // handed an open batch: finish it first
    wake_and_unlock(lock);                // its members, before f runs
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
  out.waiting = line_.size();
  return out;
}

}  // namespace orpheus::sqlite_detail
