// The production store: MySQL / MariaDB through mysql-connector-c++ 1.1,
// sharded over N masters.
//
//   orpheus::mysql_options o;
//   o.shards = {orpheus::parse_mysql_url("mysql://u:p@10.0.0.1:3306/payments"),
//               orpheus::parse_mysql_url("mysql://u:p@10.0.0.2:3306/payments")};
//   orpheus::mysql_store store(o);
//   store.migrate();
//
// A key lives on shard_for(scope, key, N) (see shard_map.hpp); all its reads
// and writes go to that shard's master, never a replica or a cache. Each
// shard has a bounded connection pool with connect/read/write timeouts; a
// connection that reports a lost link is discarded (never reconnected in
// place: OPT_RECONNECT would silently continue outside the transaction), and
// idle connections are pinged before reuse after a failure or a long idle,
// and dropped when the server has closed them for idleness. Sessions run READ
// COMMITTED with time_zone '+00:00', a short lock wait and an idle timeout
// (mysql_options::lock_wait_timeout, session_idle_timeout).
//
// Errors (one file maps them, src/store/mysql/errors.cpp): deadlock, lock wait
// timeout, statement timeout, lost connection (any client-side 2xxx code),
// too many connections, server shutdown or read-only are retryable; any
// failure of COMMIT is in doubt unless the server announced a rollback; SQL
// errors (syntax, unknown table or column, constraint violations) and server
// codes the table does not know are not retryable. After an error that ended
// the server-side transaction (deadlock, lost connection) the transaction refuses
// every further statement and commit() with a retryable error, even if the
// caller swallowed the first one.
//
// Thread safety: the store is shared by all threads.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "orpheus/store.hpp"

namespace orpheus {

/// One server of a shard.
struct mysql_host {
  std::string host;
  int port = 3306;
};

/// The master of one shard, and optionally the other nodes of the same
/// shard (a MariaDB Galera cluster: every node takes writes).
struct mysql_shard {
  std::string host = "127.0.0.1";
  int port = 3306;
  std::string user;
  std::string password;
  std::string database;
  /// The shard's other nodes, for fail-over (docs/sharding.md). New
  /// connections of the shard go to one node, the one that answered last;
  /// when it cannot be reached, is not ready (Galera: wsrep_ready OFF, or
  /// error 1047) or a connection to it breaks, the next connection tries the
  /// next node, in order, around the list. Reads wait for the cluster's
  /// latest commit (wsrep_sync_wait = 7 on a Galera node). Every node must
  /// be a node of one Galera cluster: one that is not (wsrep_on not ON, an
  /// asynchronous replica) is never used; it is passed over and logged, and
  /// when no node can be used its refusal is the (retryable) answer.
  /// Empty: one server.
  std::vector<mysql_host> failover{};
};

/// Parses "mysql://user:password@host:port/database" (port optional, default
/// 3306), or with several nodes of one shard, "mysql://user:password@
/// host1:port1,host2:port2,host3:port3/database" (the first is `host`, the
/// others `failover`). The user and password are taken as written (no
/// percent-decoding: '@', ':' and '/' may appear in the password, which ends
/// at the last '@'); a host is a name, an IPv4 address or a bracketed IPv6
/// one ("[::1]", "[fe80::1%eth0]"; a name or IPv4 address in brackets is
/// taken too). Throws config_error on anything else: a control character, a query
/// ("?ssl-mode=..."; no parameters are read), a fragment, or a database
/// name with '/', ',', '@' or a space.
[[nodiscard]] mysql_shard parse_mysql_url(std::string_view url);

struct mysql_options {
  std::vector<mysql_shard> shards;
  std::chrono::seconds connect_timeout{5};
  std::chrono::seconds read_timeout{30};
  std::chrono::seconds write_timeout{30};
  /// Per shard, for transactions; as many again for fast-path reads.
  std::size_t max_connections_per_shard = 16;
  /// How long a caller waits for a free connection before a retryable error.
  std::chrono::milliseconds pool_wait{5000};
  /// Ping an idle connection before reuse when it sat idle this long (or
  /// half of session_idle_timeout, whichever is shorter).
  std::chrono::seconds ping_after_idle{30};
  /// The session's innodb_lock_wait_timeout: how long a statement waits for a
  /// row another transaction holds before a retryable error (1205). Well
  /// below the lease (config::lease, 30 s by default), so a request stuck
  /// behind a dead host's lock answers 503 quickly; shorter than read_timeout.
  std::chrono::seconds lock_wait_timeout{5};
  /// The session's wait_timeout, net_read_timeout and net_write_timeout: the
  /// server closes a session whose client has been silent this long and rolls
  /// its transaction back, so a host that dies mid-transaction releases its
  /// rows within about this time. About the lease (30 s by default). Pooled
  /// connections idle for most of it are dropped, not reused.
  std::chrono::seconds session_idle_timeout{30};
};

/// What the connection pools of one shard (transactions and fast-path
/// reads together) have done since the store was made. For operators (a
/// rising failed_pings is a node that stops answering) and for tests that
/// count what a frozen server cost instead of timing it.
struct mysql_pool_stats {
  std::uint64_t pings = 0;         ///< idle connections pinged before they were lent
  std::uint64_t failed_pings = 0;  ///< of those, the ones that failed (connection dropped)
  std::uint64_t connects = 0;      ///< new connections tried, each node tried counting once
  /// Idle connections dropped without a ping: older than a failed ping or a
  /// lost link, idle past the server's timeout, or to a node no longer used.
  std::uint64_t dropped_unpinged = 0;
};

class mysql_store final : public store {
 public:
  /// Throws config_error when `options` are refused: no shard, a shard
  /// without host, user or database, a bad port, a non-positive or over-a-year
  /// timeout, a pool of 0, lock_wait_timeout not shorter than read_timeout.
  /// Connects lazily: an unreachable shard fails its first request, not this.
  explicit mysql_store(mysql_options options);
  mysql_store(const mysql_store&) = delete;
  mysql_store& operator=(const mysql_store&) = delete;
  ~mysql_store() override;

  /// The counters of shard `shard`'s pools; throws std::out_of_range for a
  /// shard the store does not have.
  [[nodiscard]] mysql_pool_stats pool_stats(std::size_t shard) const;
};

}  // namespace orpheus
