// The embedded default store: one SQLite file in WAL mode.
//
//   orpheus::sqlite_store store({.path = "orpheus.db"});
//   store.migrate();
//   orpheus::manager m(store, cfg);
//
// For development, tests, single-node deployments and the demo. Durability:
// synchronous=FULL, so a committed record survives a crash of the process
// and of the machine; commit() returns only once its transaction is durable.
// Writes: the threads of one process take turns, first come first served, on
// one writer connection (no sleeping in SQLite's busy handler), and
// transactions that end while others wait share one COMMIT, so one fsync
// (group commit; each transaction is a SAVEPOINT of the batch and rolls back
// alone). The two transactions every request makes (the new key with its
// Pre-RPC, and the record with its Post-RPC) run on the store's writer
// thread, queued jobs one after the other, while the request's thread waits
// once, for the commit: Pre-RPC and Post-RPC code then runs on that thread,
// not the caller's, and must not begin another transaction on this store. Other processes on the
// same file wait up to busy_timeout for the file lock. Reads (the replay fast path) use a pool of
// connections beside the writer. Timestamps come from SQLite's clock, which here is the host's
// clock: with one file there is only one host.
//
// Errors: SQLITE_BUSY/LOCKED (another writer past busy_timeout), I/O errors
// and a full disk are retryable storage_errors; SQL errors (bad statement,
// missing table) are not. A failed COMMIT is reported in doubt, to every
// transaction of its batch. Waiting longer than busy_timeout for the writer or
// a read connection is a retryable error, never a hang. The one exception is
// of the application's making: Pre-RPC and Post-RPC code runs holding the
// writer, so code that blocks there (a network call, a lock held elsewhere)
// stalls every write of the process; the others are then told to retry after
// busy_timeout, but the blocked one waits as long as its code does.
//
// Thread safety: the store is shared by all threads; it pools connections.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "orpheus/store.hpp"

namespace orpheus {

struct sqlite_options {
  std::string path;  ///< the database file; created if missing
  /// How long a writer waits for another writer before SQLITE_BUSY, for its
  /// turn on the writer connection, and for its batch's COMMIT (then in
  /// doubt). Positive, at most 24 hours.
  std::chrono::milliseconds busy_timeout = std::chrono::milliseconds(5000);
  /// Read connections kept open (readers beyond this wait for one).
  std::size_t max_connections = 16;
  /// Transactions that share one COMMIT at most (1: every transaction
  /// commits alone, as without group commit).
  std::size_t max_batch = 64;
  /// A batch older than this is committed by the next transaction that ends,
  /// even when others wait, so the first one's wait stays short under steady
  /// load. Long next to an fsync (0.1-2 ms), short next to a request.
  std::chrono::microseconds max_batch_age = std::chrono::microseconds(2000);
};

/// What the writer did since the store was opened (tests, benchmarks).
struct sqlite_writer_stats {
  std::uint64_t transactions = 0;    ///< write transactions that ended
  std::uint64_t rollbacks = 0;       ///< of which were undone
  std::uint64_t commits = 0;         ///< COMMITs run: one fsync each
  std::uint64_t failed_batches = 0;  ///< COMMITs that failed or were lost
  std::size_t waiting = 0;           ///< transactions waiting for the writer now
};

class sqlite_store final : public store {
 public:
  /// Opens (or creates) the file. Throws config_error when the path is empty,
  /// ":memory:" or a URI ("file:..."), max_connections or max_batch is 0, or
  /// the file cannot use WAL;
  /// storage_error when the file cannot be opened.
  explicit sqlite_store(sqlite_options options);
  sqlite_store(const sqlite_store&) = delete;
  sqlite_store& operator=(const sqlite_store&) = delete;
  ~sqlite_store() override;

  [[nodiscard]] sqlite_writer_stats writer_stats();
};

}  // namespace orpheus
