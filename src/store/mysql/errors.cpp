// The one place where MySQL / MariaDB error codes are classified.
//
// Policy (bug 14 of issue 7: unknown codes used to be retried):
//
//  - Retry just the call: a statement or transaction that the server refused
//    or rolled back for a passing reason (deadlock, lock wait timeout,
//    statement timeout, KILL QUERY, too many connections, shutdown, read-only
//    during a fail-over, a Galera node not ready) is retryable: nothing of it
//    committed.
//  - Client-side codes (2000-2999, and driver errors without a code): the
//    link is in an unknown state. Retryable, and the connection is discarded,
//    never reused: the next statement on it could run outside the
//    transaction. Same for SQLSTATE class 08 (connection exception).
//  - The same for what an operator puts right: a full disk, a missing grant
//    or database, a rotated password. Nothing committed.
//  - Any other server-side code, known or not, is permanent: a statement that
//    the server rejects for a reason we do not know will most likely be
//    rejected again, and retrying it forever hides a bug (a schema drift, a
//    syntax error). Nothing committed, so refusing is safe.
//  - COMMIT is the exception: any failure of COMMIT (known, unknown, server
//    or client side) is in doubt, since the COMMIT may have landed; only a
//    rollback the server announces (deadlock, SQLSTATE class 40) is not.
//  - A transaction that the server has ended (deadlock, SQLSTATE 40, a lost
//    connection, and a lock wait timeout only under innodb_rollback_on_timeout)
//    must not run another statement: it would run in a new transaction and
//    could commit the library's bookkeeping without the application's writes
//    (bug 4). mysql_store poisons the transaction on `transaction_ended`.
#include "errors.hpp"

#include <string>

namespace orpheus::mysql_detail {

namespace {

bool is_client_code(int code) noexcept { return code == 0 || (code >= 2000 && code < 3000); }

bool sqlstate_class(const sql::SQLException& e, const char* cls) noexcept {
  const char* s = e.getSQLStateCStr();
  return s != nullptr && s[0] == cls[0] && s[0] != '\0' && s[1] == cls[1];
}

// Server errors that say "not now" rather than "never": nothing of the
// statement committed, and the same request can succeed later. A lost
// connection (shutdown, killed, network) is retryable too: connection_broken()
// below lists those codes, once.
bool transient_server_code(int code) noexcept {
  switch (code) {
    case 1205:  // lock wait timeout (and FOR UPDATE NOWAIT on MariaDB)
    case 3572:  // FOR UPDATE NOWAIT found the row locked (MySQL 8; found in review)
    case 1213:  // deadlock: the transaction was rolled back
    case 1206:  // lock table full: the transaction was rolled back
    case 1969:  // max_statement_time exceeded (MariaDB)
    case 3024:  // max_execution_time exceeded (MySQL)
    case 1317:  // query interrupted (KILL QUERY)
    case 1040:  // too many connections
    case 1203:  // max_user_connections
    case 1226:  // a user resource limit (max_queries_per_hour, ...)
    case 1290:  // --read-only: a replica, or a master during a fail-over
    case 1836:  // read-only mode
    case 1021:  // disk full: the operator frees space
    case 1037:  // out of memory
    case 1038:  // out of sort memory
    case 1041:  // out of memory (server)
    // Server-wide limits and metadata races, not the request (found in
    // review: they failed a request for good although nothing happened).
    case 1461:  // max_prepared_stmt_count reached: every pooled connection
                // keeps its prepared statements, so a fleet can fill it
    case 1615:  // prepared statement needs re-preparing (a concurrent ALTER)
    case 1412:  // table definition changed, "please retry transaction"
    case 1689:  // lock wait aborted by a pending exclusive (metadata) lock
    case 1637:  // too many active concurrent transactions
    // What an operator puts right, not the request (found in review: a full
    // disk or a revoked grant before the RPC told clients to give up on a
    // payment that goes through once it is fixed, against "a database
    // failure in transaction 1 is retryable: nothing happened").
    case 1114:  // the table is full: InnoDB's tablespace cannot grow (disk)
    case 1030:  // the storage engine's error (28: no space left on device)
    case 1044:  // access denied to the database (a grant)
    case 1045:  // access denied for the user (a password rotated, a grant)
    case 1049:  // unknown database (a shard not yet created, a typo fixed)
    case 1142:  // a command denied on a table (a revoked grant)
    case 1143:  // a command denied on a column
    // Refused at login or at the session's set-up, until an operator acts
    // (found in review: classified permanent, a request that never started
    // was told not to retry).
    case 1129:  // host blocked after max_connect_errors (FLUSH HOSTS)
    case 1130:  // host not allowed to connect (a grant)
    case 4151:  // account locked (ALTER USER ... ACCOUNT UNLOCK)
    // The same, found in review under their other numbers: MySQL's, or a
    // sibling of a code above (classified permanent, they told a request
    // that never started not to retry).
    case 3118:  // account locked (MySQL)
    case 3955:  // account blocked after failed logins, for PASSWORD_LOCK_TIME (MySQL 8.0.19)
    case 4150:  // user blocked after max_password_errors (MariaDB; FLUSH PRIVILEGES)
    case 1698:  // access denied through an authentication plugin (unix_socket over TCP)
    case 1135:  // the server cannot create a thread for the connection
    case 1026:  // error writing a file (28: the tmpdir is full)
    case 1862:  // password expired, refused at login
    case 1820:  // password expired, sandbox mode: SET PASSWORD first
      return true;
    default:
      return false;
  }
}

}  // namespace

bool connection_broken(int code) noexcept {
  if (is_client_code(code)) return true;  // 2002, 2006, 2013, 2014, 2026, 2055, ...
  switch (code) {
    case 1053:  // server shutdown in progress
    case 1927:  // connection was killed (MariaDB)
    case 4031:  // disconnected by the server for inactivity (MySQL 8)
    case 1152:  // aborted connection
    case 1158:  // network read error
    case 1159:  // network read timeout
    case 1160:  // network write error
    case 1161:  // network write timeout
    case 1047:  // Galera: the node left the primary component (WSREP has not
                // yet prepared node for application use): try another node
      return true;
    default:
      return false;
  }
}

verdict judge(const sql::SQLException& e, bool in_commit, bool rollback_on_timeout) noexcept {
  const int code = e.getErrorCode();
  verdict v;
  v.connection_broken = connection_broken(code) || sqlstate_class(e, "08");
  const bool rolled_back = code == 1213 || code == 1206 || sqlstate_class(e, "40") ||
                           (code == 1205 && rollback_on_timeout);
  v.transaction_ended = v.connection_broken || rolled_back;
  if (in_commit) {
    // Only an announced rollback is certain; anything else may have landed.
    v.retryable = true;
    v.in_doubt = !rolled_back;
    return v;
  }
  v.retryable = v.connection_broken || rolled_back || transient_server_code(code);
  return v;
}

storage_error classify(const sql::SQLException& e, std::string_view what, bool in_commit,
                       bool rollback_on_timeout) {
  const verdict v = judge(e, in_commit, rollback_on_timeout);
  std::string msg = "mysql: ";
  msg.append(what)
      .append(": [")
      .append(std::to_string(e.getErrorCode()))
      .append("/")
      .append(e.getSQLStateCStr())
      .append("] ")
      .append(e.what());
  if (v.retryable) return storage_error::transient(std::move(msg), v.in_doubt);
  return storage_error::permanent(std::move(msg));
}

}  // namespace orpheus::mysql_detail
