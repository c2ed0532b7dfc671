// One MySQL connection with its prepared-statement cache, and the
// conversions between orpheus::sql_value and the connector's types.
#pragma once

#include <cppconn/connection.h>
#include <cppconn/prepared_statement.h>
#include <cppconn/resultset.h>
#include <cppconn/statement.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "../statement_cache.hpp"
#include "orpheus/store/mysql.hpp"
#include "orpheus/tx.hpp"

namespace sql {
class Driver;
}

namespace orpheus::mysql_detail {

/// The connector's driver, created once (get_driver_instance() is not
/// thread-safe).
sql::Driver* driver();

using steady = std::chrono::steady_clock;

/// One connection with its prepared-statement cache. A statement is prepared
/// once per connection, so each execution is a single round trip.
class connection {
 public:
  /// Connects to `node` (number `index` of the shard `s`: 0 is s.host, then
  /// s.failover) and sets the session up (time zone, isolation, timeouts; on
  /// a Galera node, reads that wait for the cluster's latest commit). Throws
  /// sql::SQLException, also for a Galera node that is not ready, and a
  /// transient storage_error for a node of a multi-node shard that is not a
  /// Galera node.
  connection(const mysql_host& node, std::size_t index, const mysql_shard& s,
             const mysql_options& o, bool autocommit, std::uint64_t generation);

  sql::Connection& raw() { return *conn_; }
  std::uint64_t generation() const { return generation_; }
  void set_generation(std::uint64_t g) { generation_ = g; }
  steady::time_point last_used() const { return last_used_; }
  void touch() { last_used_ = steady::now(); }
  bool rollback_on_timeout() const { return rollback_on_timeout_; }
  /// Which node of the shard this connection went to (see the constructor).
  std::size_t node() const { return node_; }
  /// The server runs BEGIN NOT ATOMIC ... END (MariaDB 10.1 and later).
  bool compound_statements() const { return mariadb_; }
  /// The server's max_allowed_packet, read when the connection opened: the
  /// largest statement it takes (see check_packet()).
  std::uint64_t max_packet() const { return max_packet_; }
  /// The node's Galera cluster (wsrep_cluster_state_uuid); empty for a
  /// shard of one server.
  const std::string& galera_cluster() const { return cluster_; }

  /// Runs a statement without parameters or results (COMMIT, ROLLBACK).
  /// Never use sql::Connection::commit()/rollback(): connector 1.1.12 returns
  /// from commit() without an error when the connection is already dead, so
  /// a COMMIT that never ran would look like success. A plain statement
  /// reports the lost connection (2013), which makes the commit in doubt.
  void exec(const char* sql) {
    if (!plain_) plain_.reset(conn_->createStatement());
    plain_->execute(sql);
  }

  /// The statement prepared on this connection (see statement_cache.hpp).
  sql::PreparedStatement& prepare(std::string_view sql);

 private:
  std::unique_ptr<sql::Connection> conn_;
  // Declared after conn_: statements are closed before their connection.
  detail::statement_cache<std::unique_ptr<sql::PreparedStatement>> cache_;
  std::unique_ptr<sql::Statement> plain_;
  std::uint64_t generation_;
  steady::time_point last_used_;
  bool rollback_on_timeout_ = false;
  bool mariadb_ = false;
  std::uint64_t max_packet_ = 0;  // 0: unknown, nothing is checked
  std::size_t node_ = 0;
  std::string cluster_;
};

/// Throws a permanent storage_error, before anything is sent, when one of
/// `params` is longer than `max_packet` bytes (the server's
/// max_allowed_packet; 0 checks nothing). The server would refuse it
/// (1105) only when the statement runs: on MariaDB, where the fenced write
/// rides with the COMMIT, that failure discarded the connection (found in
/// review), and its message did not say how long the value was.
void check_packet(std::uint64_t max_packet, std::span<const sql_value> params);
/// Binds `params` to `ps`'s placeholders, in order, after check_packet().
void bind(sql::PreparedStatement& ps, std::span<const sql_value> params, std::uint64_t max_packet);
/// Reads every row of `rs` as sql_values (integers, doubles, text/bytes).
sql_rows read_rows(sql::ResultSet& rs);
/// Runs a prepared statement that returns rows.
sql_rows run_query(connection& c, std::string_view sql, std::span<const sql_value> p);
/// Runs a prepared statement that returns none; returns the affected rows
/// (matched rows: CLIENT_FOUND_ROWS).
std::uint64_t run_update(connection& c, std::string_view sql, std::span<const sql_value> p);

}  // namespace orpheus::mysql_detail
