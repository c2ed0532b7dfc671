#include "pool.hpp"

#include "orpheus/log.hpp"

#include <optional>

namespace orpheus::mysql_detail {

std::unique_ptr<connection> pool::borrow() {
  // One deadline for the whole wait: each dead idle connection dropped below
  // used to start pool_wait again.
  const auto deadline = steady::now() + options_.pool_wait;
  std::unique_lock lock(mutex_);
  for (;;) {
    const bool ready = available_.wait_until(lock, deadline, [&] {
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
    // A connection to a node no longer in use (found in review): a host that
    // died silently would make its ping wait read_timeout, one after another.
    // And one older than a failed ping (below).
    if (idle_for >= discard_after_ || c->node() != node_in_use_.load() ||
        c->generation() < dead_since_.load()) {
      ++health_.dropped_unpinged;
      --open_;                  // closed by the server, or about to be: drop it and look again
      available_.notify_one();  // a slot is free
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
    ++health_.pings;
    try {
      ok = c->raw().isValid();
    } catch (...) {  // whatever it was, the connection is not lent; its slot is freed below
      ok = false;
    }
    if (ok) {
      c->set_generation(gen);
      return c;
    }
    ++health_.failed_pings;
    // Dead. Found in review: a node that stopped answering (a frozen or
    // cut-off host keeps its TCP connections open) made this loop ping
    // every idle connection to it, read_timeout each: one borrow took
    // minutes. One failed ping is enough: every connection older than it,
    // in both pools of the shard, is dropped unpinged (dead_since; the rest
    // of idle_ goes on the next turns of this loop), and the caller gets a
    // new connection, or the connect's error. A healthy connection dropped
    // with them costs a reconnect. As for a lost link, new connections try
    // the next node first (Galera).
    move_off(c->node());
    c.reset();
    lock.lock();
    --open_;
    mark_dead();
    available_.notify_one();  // a slot is free
  }
  ++open_;
  const std::uint64_t gen = generation_.load();
  lock.unlock();
  try {
    return connect(gen);
  } catch (const sql::SQLException& e) {
    forget_one();
    throw classify(e, "connect", false);
  } catch (...) {
    forget_one();
    throw;
  }
}

// Found in review: a node of another Galera cluster in a shard's list (one
// spelled differently from the same node under another shard, so that the
// check of duplicates at start-up passed) was taken on a fail-over as any
// ready node, and a retry of a key finished on the shard's own cluster found
// no record there and ran again (a second charge). The shard map check did
// not see it either when that database records the same place, and re-reads
// it only every few seconds. Every node is now held to the cluster of the
// first one this process reached; one of another is passed over (retryable)
// like a node that is not a Galera node. A cluster rebuilt from nothing (a
// new state UUID) needs the process restarted.
void pool::same_cluster(const connection& c, const mysql_host& node) {
  if (c.galera_cluster().empty()) return;
  const std::lock_guard lock(health_.cluster_mutex);
  if (health_.cluster.empty()) health_.cluster = c.galera_cluster();
  if (health_.cluster == c.galera_cluster()) return;
  throw storage_error::transient(
      "mysql: the shard lists " + node.host + ":" + std::to_string(node.port) +
      ", a node of another Galera cluster (wsrep_cluster_state_uuid " + c.galera_cluster() +
      ") than the shard's node this process reached first (" + health_.cluster +
      "), so it is not used: a node listed under the wrong shard would answer for keys "
      "whose records are on another cluster. If the cluster was rebuilt from nothing, "
      "restart this process (docs/sharding.md)");
}

std::unique_ptr<connection> pool::connect(std::uint64_t generation) {
  const std::size_t nodes = 1 + shard_.failover.size();
  std::size_t first = node_in_use_.load() % nodes;
  // Every node refused: a retryable error if any was (a node down), rather
  // than the last node's (found in review: a permanent one, a host blocked,
  // would fail the request for good while another node was merely down).
  std::optional<sql::SQLException> transient;
  // A node that is not a Galera node, or one of another cluster: its
  // refusal (retryable) is the answer when every node failed, so that the
  // reason is seen.
  std::optional<storage_error> passed_over;
  for (std::size_t i = 0;; ++i) {
    const std::size_t n = (first + i) % nodes;
    const mysql_host node = n == 0 ? mysql_host{shard_.host, shard_.port} : shard_.failover[n - 1];
    ++health_.connects;
    try {
      auto c = std::make_unique<connection>(node, n, shard_, options_, autocommit_, generation);
      same_cluster(*c, node);
      // Only if no other thread moved the node in use meanwhile.
      node_in_use_.compare_exchange_strong(first, n);
      return c;
    } catch (const sql::SQLException& e) {
      if (!transient && judge(e, false, false).retryable) transient.emplace(e);
      if (i + 1 == nodes) {
        if (passed_over) throw *passed_over;
        if (transient) throw *transient;
        throw;
      }
    } catch (const storage_error& e) {  // not a node of the shard's cluster: passed over
      log(log_level::error, e.what());
      if (!passed_over) passed_over.emplace(e);
      if (i + 1 == nodes) throw *passed_over;
    }
  }
}

void pool::give_back(std::unique_ptr<connection> c, bool broken, bool link_lost,
                     bool others_suspect) {
  if (broken) {
    // Only a connection as new as the last death, to the node in use, says
    // anything new (found in review: each of N statements in flight on a
    // node that froze would otherwise drop the connections opened since,
    // to the next node, when it timed out).
    const bool news =
        link_lost && c->generation() >= dead_since_.load() && c->node() == node_in_use_.load();
    if (link_lost) move_off(c->node());  // the node may be gone
    c.reset();
    std::lock_guard lock(mutex_);
    --open_;
    // A lost link (a statement that timed out on a frozen server, a reset)
    // says what a failed ping says. Found in CI: a ping that the server
    // answered just before it froze, then a statement that timed out, left
    // the shard's other idle connections merely suspect, and the next read
    // paid a ping (read_timeout) of its own before connecting.
    if (news) {
      mark_dead();
    } else if (link_lost || others_suspect) {
      ++generation_;  // the others are only suspect
    }
    available_.notify_one();
    return;
  }
  c->touch();
  std::lock_guard lock(mutex_);
  idle_.push_back(std::move(c));
  available_.notify_one();
}

// The next connection tries the node after `node` first; only if `node` is
// still the one in use, so that a burst of failures moves on once.
void pool::move_off(std::size_t node) {
  node_in_use_.compare_exchange_strong(node, (node + 1) % (1 + shard_.failover.size()));
}

void pool::mark_dead() {
  const std::uint64_t now_dead = ++generation_;
  for (std::uint64_t was = dead_since_.load();
       was < now_dead && !dead_since_.compare_exchange_weak(was, now_dead);) {
  }
}

void pool::forget_one() {
  std::lock_guard lock(mutex_);
  --open_;
  ++generation_;
  available_.notify_one();
}

}  // namespace orpheus::mysql_detail
