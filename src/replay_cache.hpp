// A bounded memory of terminal records, in this process, for the replay fast
// path (config::replay_cache_bytes).
//
// Why it is safe: a terminal record (succeeded or failed) never changes until
// it is purged, so a copy answers a replay exactly as the database would, and
// only records read back from the database are kept (they are durable). What
// a copy cannot see is a purge by another process, or a row deleted by hand:
// each entry answers for at most `ttl`, and never past the record's own
// expiry (expires_us, after which any process may purge it and a request
// with its key runs as new); a purge in this process that deleted rows (or
// failed part way) empties the cache. A row deleted by hand before its
// expiry is answered from memory for up to `ttl` longer, never run again
// early.
//
// Thread safety: every member may be called from any number of threads.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "orpheus/request.hpp"
#include "orpheus/store.hpp"

namespace orpheus::detail {

class replay_cache {
 public:
  using clock = std::chrono::steady_clock;

  /// What a replay needs: the fingerprint to compare and the answer.
  struct entry {
    std::string fingerprint;
    response recorded;
  };

  /// `now` is the clock entries expire by (tests pass their own).
  replay_cache(std::size_t max_bytes, std::chrono::milliseconds ttl,
               std::function<clock::time_point()> now = clock::now);

  struct lookup {
    /// The remembered record, or nullptr (never seen, evicted, or older than
    /// the ttl).
    std::shared_ptr<const entry> hit;
    /// generation() at the lookup: on a miss, pass it to put() with what
    /// the store read afterwards.
    std::uint64_t generation = 0;
    /// The cache's clock at the lookup, before that read: pass it to put().
    clock::time_point at{};
  };
  [[nodiscard]] lookup find(const request_id& id);
  /// Bumped by clear(). Read it before reading a record from the store, and
  /// pass it to put(): a record read before a purge is then not remembered
  /// after it.
  [[nodiscard]] std::uint64_t generation() const;
  /// Remembers `r` when it is terminal, fits in max_bytes on its own, and no
  /// clear() happened since `read_at` (a generation()); evicts the least
  /// recently used entries to make room. `read_started`, on the cache's
  /// clock, is a time before the store read `r`: the entry ends `ttl` after
  /// it, or sooner at the record's expiry (r.expires_us - r.db_now_us after
  /// it); a record already expired, or without an expiry, is not kept.
  void put(const request_id& id, const record& r, std::uint64_t read_at,
           clock::time_point read_started);
  void clear();

  [[nodiscard]] std::size_t size() const;
  [[nodiscard]] std::size_t bytes() const;

 private:
  struct node {
    std::string key;
    std::shared_ptr<const entry> value;
    clock::time_point expires;
    std::size_t bytes;
  };
  void erase(std::list<node>::iterator it);  // requires mu_

  const std::size_t max_bytes_;
  const std::chrono::milliseconds ttl_;
  const std::function<clock::time_point()> now_;
  mutable std::mutex mu_;
  std::list<node> lru_;  // most recently used first
  std::unordered_map<std::string, std::list<node>::iterator> index_;
  std::size_t bytes_ = 0;
  std::uint64_t generation_ = 0;
};

}  // namespace orpheus::detail
