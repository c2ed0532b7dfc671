// The bounded connection pool of one shard, and the borrowed connection
// that runs statements and translates driver errors (errors.hpp).
#pragma once

#include <cppconn/exception.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "connection.hpp"
#include "errors.hpp"

namespace orpheus::mysql_detail {

/// What the two pools of one shard (transactions, fast-path reads) know of
/// its nodes together.
struct shard_health {
  /// Bumped by every broken connection or failed ping: each idle connection
  /// opened or pinged before is suspect (pinged before it is lent).
  std::atomic<std::uint64_t> epoch{0};
  /// The index (0 is shard.host, then shard.failover) of the node new
  /// connections try first.
  std::atomic<std::size_t> node_in_use{0};
  /// The epoch at which a ping last failed or a link was lost: connections
  /// opened or pinged before it are dropped unpinged. A node that stopped
  /// answering costs a caller at most one ping or statement (read_timeout),
  /// not one per idle connection.
  std::atomic<std::uint64_t> dead_since{0};
  /// What the two pools did (mysql_store::pool_stats()).
  std::atomic<std::uint64_t> pings{0};
  std::atomic<std::uint64_t> failed_pings{0};
  std::atomic<std::uint64_t> connects{0};
  std::atomic<std::uint64_t> dropped_unpinged{0};
  /// The Galera cluster (wsrep_cluster_state_uuid) of the first node either
  /// pool connected to; a node of another cluster is never used (see
  /// pool::connect). Empty until then, and for a shard of one server.
  std::mutex cluster_mutex;
  std::string cluster;
};

class pool {
 public:
  /// `health` is shared by the two pools of one shard (see shard_health).
  pool(mysql_shard shard, const mysql_options& o, bool autocommit, shard_health& health)
      : shard_(std::move(shard)),
        options_(o),
        autocommit_(autocommit),
        generation_(health.epoch),
        node_in_use_(health.node_in_use),
        dead_since_(health.dead_since),
        health_(health),
        // The server closes a session idle for session_idle_timeout (its
        // wait_timeout). The client's idle clock starts a little after the
        // server's, so a connection idle for most of the timeout is dropped
        // unasked rather than lent out to die on its first statement (bug 9);
        // one idle for half of it is pinged first.
        discard_after_(o.session_idle_timeout - o.session_idle_timeout / 4),
        ping_after_(std::min<steady::duration>(o.ping_after_idle, o.session_idle_timeout / 2)) {}

  /// Lends a connection: an idle one (pinged first when suspect, dropped
  /// when the server has closed it for idleness) or a new one. Waits at most
  /// pool_wait for a free one, then throws a retryable storage_error; on top
  /// of that at most one ping (read_timeout) and one connect per node
  /// (connect_timeout for the server's greeting, read_timeout for each
  /// round trip of the login and session set-up after it).
  std::unique_ptr<connection> borrow();
  /// Returns a connection; a broken one is closed. `link_lost`: its link
  /// failed (lost connection, a node not ready), so every idle connection of
  /// the shard opened before it is dropped unpinged and the next connection
  /// tries the shard's next node first; a session closed for other reasons
  /// (a failed COMMIT, a certification conflict) leaves the node in use and
  /// the idle connections are pinged before their next use, unless
  /// `others_suspect` is false: the server itself answered the failure that
  /// closed it (a failed fence's SIGNAL), so the link was up.
  void give_back(std::unique_ptr<connection> c, bool broken, bool link_lost,
                 bool others_suspect = true);

  const mysql_shard& shard() const { return shard_; }

 private:
  void forget_one();
  void move_off(std::size_t node);
  /// Every connection of the shard opened or pinged before now is dropped
  /// unpinged (shard_health::dead_since).
  void mark_dead();
  /// A new connection to the node in use, or else to the next node that
  /// answers (and is ready), in order around the list; that node is then in
  /// use. Throws, when every node failed: the refusal of a node that is not
  /// a Galera node if any (retryable), else a retryable node's error if any,
  /// else the last node's.
  std::unique_ptr<connection> connect(std::uint64_t generation);
  /// Throws storage_error::transient when `c` is a node of another Galera
  /// cluster than the shard's first (shard_health::cluster).
  void same_cluster(const connection& c, const mysql_host& node);

  mysql_shard shard_;
  const mysql_options& options_;
  bool autocommit_;
  std::mutex mutex_;
  std::condition_variable available_;
  std::vector<std::unique_ptr<connection>> idle_;
  std::size_t open_ = 0;
  std::atomic<std::uint64_t>& generation_;
  std::atomic<std::size_t>& node_in_use_;
  std::atomic<std::uint64_t>& dead_since_;
  shard_health& health_;
  steady::duration discard_after_;
  steady::duration ping_after_;
};

/// A borrowed connection, returned on destruction (discarded if broken).
class borrowed {
 public:
  explicit borrowed(pool& p) : pool_(&p), conn_(p.borrow()) {}
  borrowed(const borrowed&) = delete;
  borrowed& operator=(const borrowed&) = delete;
  ~borrowed() {
    if (conn_) pool_->give_back(std::move(conn_), broken_, link_lost_, others_suspect_);
  }
  connection& operator*() { return *conn_; }
  connection* operator->() { return conn_.get(); }
  /// Never lend this connection again. `link_up`: the failure that made it
  /// so was the server's own answer (a failed fence's SIGNAL), so the
  /// shard's other idle connections are not suspect (found in review: each
  /// failed fence, a take-over race say, had them all pinged before their
  /// next loan). Anything else that breaks it later makes them suspect.
  void mark_broken(bool link_up = false) {
    broken_ = true;
    if (!link_up) others_suspect_ = true;
  }
  [[nodiscard]] bool broken() const { return broken_; }
  /// The driver's code of the last failed statement (0 if it succeeded).
  [[nodiscard]] int last_error_code() const { return last_code_; }
  /// The last failed statement ended the server-side transaction (deadlock,
  /// lost connection, ...): see mysql_detail::verdict.
  [[nodiscard]] bool transaction_ended() const { return ended_; }

  /// Runs `f`, translating driver errors; a broken link marks the connection.
  template <class F>
  auto guarded(std::string_view what, F&& f, bool in_commit = false) {
    last_code_ = 0;
    ended_ = false;
    try {
      return f(*conn_);
    } catch (const sql::SQLException& e) {
      last_code_ = e.getErrorCode();
      const bool timeout_rolls_back = conn_->rollback_on_timeout();
      const auto v = mysql_detail::judge(e, in_commit, timeout_rolls_back);
      if (v.connection_broken) broken_ = link_lost_ = true;
      ended_ = v.transaction_ended;
      throw classify(e, what, in_commit, timeout_rolls_back);
    }
  }

 private:
  pool* pool_;
  std::unique_ptr<connection> conn_;
  bool broken_ = false;
  /// The link itself failed (not just a session in an unknown state): the
  /// node may be gone.
  bool link_lost_ = false;
  bool others_suspect_ = false;  // broken otherwise than with the link up: see mark_broken()
  bool ended_ = false;
  int last_code_ = 0;
};

}  // namespace orpheus::mysql_detail
