#include "replay_cache.hpp"

#include <algorithm>
#include <utility>

namespace orpheus::detail {
namespace {

// Scope and key, length-prefixed so that no two ids share a cache key.
std::string key_of(const request_id& id) {
  std::string k = std::to_string(id.scope.size());
  k += ':';
  k += id.scope;
  k += id.key;
  return k;
}

// What an entry holds, roughly: its strings and a fixed allowance for the
// list node, the index slot and the allocations.
std::size_t bytes_of(const std::string& key, const record& r) {
  std::size_t n = 256 + 2 * key.size() + r.fingerprint.size() + r.recorded.body.size();
  for (const auto& [name, value] : r.recorded.headers) n += 64 + name.size() + value.size();
  return n;
}

}  // namespace

replay_cache::replay_cache(std::size_t max_bytes, std::chrono::milliseconds ttl,
                           std::function<clock::time_point()> now)
    : max_bytes_(max_bytes), ttl_(ttl), now_(std::move(now)) {}

replay_cache::lookup replay_cache::find(const request_id& id) {
  const std::string k = key_of(id);
  const auto t = now_();
  std::lock_guard lock(mu_);
  const auto at = index_.find(k);
  if (at == index_.end()) return {nullptr, generation_, t};
  const auto it = at->second;
  if (t >= it->expires) {
    erase(it);
    return {nullptr, generation_, t};
  }
  lru_.splice(lru_.begin(), lru_, it);
  return {it->value, generation_, t};
}

std::uint64_t replay_cache::generation() const {
  std::lock_guard lock(mu_);
  return generation_;
}

void replay_cache::put(const request_id& id, const record& r, std::uint64_t read_at,
                       clock::time_point read_started) {
  if (!is_terminal(r.state)) return;
  // Found in review: an entry outlived its row. Another process purged the
  // record at its expiry, a request with the key ran as new and charged, and
  // this cache went on answering the old record, or a false 422 for the new
  // payload, for the rest of its ttl. Both times are the database's, read in
  // the same statement; read_started is before that statement ran, so the
  // entry ends no later than the row may be purged.
  const std::int64_t left_us = r.expires_us - r.db_now_us;
  if (r.expires_us <= 0 || left_us <= 0) return;
  // In microseconds first: an expiry of "for good" does not fit the clock.
  const std::chrono::microseconds keep =
      std::min(std::chrono::microseconds(left_us),
               std::chrono::duration_cast<std::chrono::microseconds>(ttl_));
  std::string k = key_of(id);
  const std::size_t n = bytes_of(k, r);
  if (n > max_bytes_) return;
  auto value = std::make_shared<const entry>(entry{r.fingerprint, r.recorded});
  const auto expires = read_started + std::chrono::duration_cast<clock::duration>(keep);
  std::lock_guard lock(mu_);
  if (read_at != generation_) return;  // read before a purge: it may be gone
  if (const auto at = index_.find(k); at != index_.end()) erase(at->second);
  while (bytes_ + n > max_bytes_ && !lru_.empty()) erase(std::prev(lru_.end()));
  lru_.push_front(node{k, std::move(value), expires, n});
  index_.emplace(std::move(k), lru_.begin());
  bytes_ += n;
}

void replay_cache::clear() {
  std::lock_guard lock(mu_);
  index_.clear();
  lru_.clear();
  bytes_ = 0;
  ++generation_;
}

std::size_t replay_cache::size() const {
  std::lock_guard lock(mu_);
  return lru_.size();
}

std::size_t replay_cache::bytes() const {
  std::lock_guard lock(mu_);
  return bytes_;
}

void replay_cache::erase(std::list<node>::iterator it) {
  bytes_ -= it->bytes;
  index_.erase(it->key);
  lru_.erase(it);
}

}  // namespace orpheus::detail
