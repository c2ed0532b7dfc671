#include "errors.hpp"

#include <string>

namespace orpheus::mysql_detail {

bool connection_broken(int code) noexcept {
  switch (code) {
    case 2002:  // cannot connect through socket
    case 2003:  // cannot connect to server
    case 2006:  // server has gone away
    case 2013:  // lost connection during query
    case 2014:  // commands out of sync: the session state is unknown
    case 2026:  // SSL connection error
    case 2055:  // lost connection at handshake/reading
    case 1053:  // server shutdown in progress
    case 1927:  // connection was killed (MariaDB)
    case 4031:  // disconnected by the server for inactivity (MySQL 8)
      return true;
    default:
      return false;
  }
}

namespace {
// Statements that can never succeed as written: programming or schema errors,
// or application constraint violations. Retrying them changes nothing.
bool permanent(int code) noexcept {
  switch (code) {
    case 1048:  // column cannot be null
    case 1054:  // unknown column
    case 1062:  // duplicate key
    case 1064:  // syntax error
    case 1146:  // table does not exist
    case 1264:  // out of range value
    case 1292:  // incorrect value
    case 1366:  // incorrect string value
    case 1406:  // data too long
    case 1451:  // foreign key: parent row in use
    case 1452:  // foreign key: no parent row
    case 1210:  // incorrect arguments to EXECUTE
      return true;
    default:
      return false;
  }
}
}  // namespace

storage_error classify(const sql::SQLException& e, std::string_view what, bool in_commit) {
  const int code = e.getErrorCode();
  std::string msg = "mysql: ";
  msg.append(what)
      .append(": [")
      .append(std::to_string(code))
      .append("/")
      .append(e.getSQLStateCStr())
      .append("] ")
      .append(e.what());
  // COMMIT that got no answer: it may or may not have landed.
  if (in_commit && (connection_broken(code) || code == 0)) {
    return storage_error::transient(std::move(msg), /*in_doubt=*/true);
  }
  if (permanent(code)) return storage_error::permanent(std::move(msg));
  // Deadlock (1213), lock wait timeout (1205), statement timeout (1969,
  // 3024), KILL QUERY (1317), too many connections (1040, 1203), lost or
  // refused connections, read-only server (1290, 1836): nothing happened in
  // this transaction, or the server rolled it back. Retrying is safe.
  return storage_error::transient(std::move(msg));
}

}  // namespace orpheus::mysql_detail
