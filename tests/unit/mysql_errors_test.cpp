// The MySQL error classifier (src/store/mysql/errors.cpp), table-driven:
// {code, SQLSTATE, in_commit, innodb_rollback_on_timeout} -> {retryable,
// in doubt, connection broken, transaction ended}. No server:
// sql::SQLException is built by hand. Every code errors.cpp names has a row
// (checked against the source below), and classify() must agree with judge().
#include <cppconn/exception.h>
#include <gtest/gtest.h>

#include <fstream>
#include <ostream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "store/mysql/errors.hpp"

namespace orpheus {
namespace {

struct row {
  int code;
  const char* sqlstate;
  bool in_commit;
  bool rollback_on_timeout;  ///< the server's innodb_rollback_on_timeout
  bool retryable;
  bool in_doubt;
  bool broken;  ///< discard the connection
  bool ended;   ///< the server rolled the whole transaction back
  const char* why;
};

constexpr bool T = true;
constexpr bool F = false;

// clang-format off
constexpr row table[] = {
  // code  SQLSTATE  commit  r_o_t   retry  doubt  broken ended
  // Transient server errors outside COMMIT: nothing committed, retry the call.
  {1213, "40001", F, F,   T, F, F, T, "deadlock: the server rolled the transaction back"},
  {1213, "40001", F, T,   T, F, F, T, "deadlock, innodb_rollback_on_timeout changes nothing"},
  {1205, "HY000", F, F,   T, F, F, F, "lock wait timeout: only the statement is rolled back"},
  {1205, "HY000", F, T,   T, F, F, T, "lock wait timeout under innodb_rollback_on_timeout"},
  {3572, "HY000", F, F,   T, F, F, F, "MySQL 8 NOWAIT found the row locked (found in review: final)"},
  {3572, "HY000", F, T,   T, F, F, F, "NOWAIT: innodb_rollback_on_timeout is about waits"},
  {1206, "HY000", F, F,   T, F, F, T, "lock table full: the transaction is rolled back"},
  {1969, "70100", F, F,   T, F, F, F, "max_statement_time (MariaDB)"},
  {3024, "HY000", F, F,   T, F, F, F, "max_execution_time (MySQL)"},
  {1317, "70100", F, F,   T, F, F, F, "KILL QUERY"},
  {1317, "70100", F, T,   T, F, F, F, "KILL QUERY, innodb_rollback_on_timeout changes nothing"},
  {1040, "08004", F, F,   T, F, T, T, "too many connections (at connect: SQLSTATE 08)"},
  {1040, "HY000", F, F,   T, F, F, F, "too many connections, SQLSTATE not 08"},
  {1203, "42000", F, F,   T, F, F, F, "max_user_connections"},
  {1226, "42000", F, F,   T, F, F, F, "a user resource limit"},
  {1290, "HY000", F, F,   T, F, F, F, "--read-only server"},
  {1836, "HY000", F, F,   T, F, F, F, "read-only mode"},
  {1053, "08S01", F, F,   T, F, T, T, "server shutdown in progress"},
  {1053, "HY000", F, F,   T, F, T, T, "server shutdown, by its code alone"},
  {1927, "70100", F, F,   T, F, T, T, "connection killed (MariaDB)"},
  {4031, "HY000", F, F,   T, F, T, T, "disconnected for inactivity (MySQL 8)"},
  {1047, "08S01", F, F,   T, F, T, T, "Galera: WSREP not ready"},
  {1047, "HY000", F, F,   T, F, T, T, "Galera node out of the primary component: another node"},
  {1047, "08S01", F, T,   T, F, T, T, "Galera: WSREP not ready, under rollback_on_timeout"},
  {1047, "08S01", T, F,   T, T, T, T, "Galera: not ready at COMMIT: in doubt"},
  {1021, "HY000", F, F,   T, F, F, F, "disk full"},
  {1037, "HY001", F, F,   T, F, F, F, "out of memory"},
  {1038, "HY001", F, F,   T, F, F, F, "out of sort memory"},
  {1041, "HY000", F, F,   T, F, F, F, "out of memory (server)"},
  {1461, "42000", F, F,   T, F, F, F, "max_prepared_stmt_count reached (server-wide)"},
  {1615, "HY000", F, F,   T, F, F, F, "statement needs re-preparing (concurrent ALTER)"},
  {1412, "HY000", F, F,   T, F, F, F, "table definition changed, retry the transaction"},
  {1689, "HY000", F, F,   T, F, F, F, "lock wait aborted by a pending metadata lock"},
  {1637, "HY000", F, F,   T, F, F, F, "too many active concurrent transactions"},
  // What an operator puts right (found in review: they told clients to give up).
  {1114, "HY000", F, F,   T, F, F, F, "the table is full (InnoDB on a full disk)"},
  {1030, "HY000", F, F,   T, F, F, F, "the storage engine's error (28: no space)"},
  {1044, "42000", F, F,   T, F, F, F, "access denied to the database"},
  {1045, "28000", F, F,   T, F, F, F, "wrong password (rotated)"},
  {1049, "42000", F, F,   T, F, F, F, "unknown database"},
  {1142, "42000", F, F,   T, F, F, F, "INSERT denied on a table (a revoked grant)"},
  {1143, "42000", F, F,   T, F, F, F, "a command denied on a column"},
  {1129, "HY000", F, F,   T, F, F, F, "host blocked after max_connect_errors"},
  {1130, "HY000", F, F,   T, F, F, F, "host not allowed to connect"},
  {4151, "HY000", F, F,   T, F, F, F, "account locked"},
  {3118, "HY000", F, F,   T, F, F, F, "account locked (MySQL)"},
  {3955, "HY000", F, F,   T, F, F, F, "account blocked after failed logins (MySQL)"},
  {4150, "HY000", F, F,   T, F, F, F, "user blocked after max_password_errors"},
  {1698, "28000", F, F,   T, F, F, F, "access denied through an auth plugin"},
  {1135, "HY000", F, F,   T, F, F, F, "cannot create a thread"},
  {1026, "HY000", F, F,   T, F, F, F, "error writing a file (tmpdir full)"},
  {1862, "HY000", F, F,   T, F, F, F, "password expired, refused at login"},
  {1820, "HY000", F, F,   T, F, F, F, "password expired, sandbox mode"},
  {1152, "08S01", F, F,   T, F, T, T, "aborted connection"},
  {1158, "08S01", F, F,   T, F, T, T, "network read error"},
  {1159, "08S01", F, F,   T, F, T, T, "network read timeout"},
  {1160, "08S01", F, F,   T, F, T, T, "network write error"},
  {1161, "08S01", F, F,   T, F, T, T, "network write timeout"},
  // Known permanent server errors: the same statement would be refused again.
  {1062, "23000", F, F,   F, F, F, F, "duplicate key"},
  {1064, "42000", F, F,   F, F, F, F, "syntax error"},
  {1146, "42S02", F, F,   F, F, F, F, "no such table"},
  {1180, "HY000", F, F,   F, F, F, F, "error during COMMIT, outside COMMIT"},
  // Unknown server errors: permanent (bug 14: they used to be retried) ...
  {1234, "42000", F, F,   F, F, F, F, "unknown server code"},
  {1234, "",      F, F,   F, F, F, F, "unknown server code, no SQLSTATE"},
  {1999, "HY000", F, F,   F, F, F, F, "unknown server code below the client range"},
  {3000, "HY000", F, F,   F, F, F, F, "unknown server code just above the client range"},
  {3999, "HY000", F, F,   F, F, F, F, "unknown MySQL 8 code"},
  {4999, "HY000", F, F,   F, F, F, F, "unknown MariaDB code"},
  {9999, "HY000", F, F,   F, F, F, F, "unknown code"},
  // ... unless the SQLSTATE says connection trouble or a rolled-back transaction.
  {1234, "08S01", F, F,   T, F, T, T, "SQLSTATE 08: connection exception"},
  {1234, "40001", F, F,   T, F, F, T, "SQLSTATE 40: transaction rolled back"},
  // Client errors (2xxx, or no code): the link is in an unknown state.
  {0,    "",      F, F,   T, F, T, T, "driver error without a code"},
  {2000, "HY000", F, F,   T, F, T, T, "first client code"},
  {2002, "HY000", F, F,   T, F, T, T, "cannot connect"},
  {2006, "HY000", F, F,   T, F, T, T, "server has gone away"},
  {2013, "HY000", F, F,   T, F, T, T, "lost connection during query"},
  {2014, "HY000", F, F,   T, F, T, T, "commands out of sync"},
  {2026, "HY000", F, F,   T, F, T, T, "SSL connection error"},
  {2027, "HY000", F, F,   T, F, T, T, "malformed packet"},
  {2055, "HY000", F, F,   T, F, T, T, "lost connection, system error"},
  {2999, "HY000", F, F,   T, F, T, T, "last client code"},
  // COMMIT: any failure may have landed, except a rollback the server announces.
  {2013, "HY000", T, F,   T, T, T, T, "lost connection during COMMIT"},
  {2006, "HY000", T, F,   T, T, T, T, "server gone at COMMIT"},
  {0,    "",      T, F,   T, T, T, T, "driver error at COMMIT"},
  {1927, "70100", T, F,   T, T, T, T, "connection killed at COMMIT"},
  {1053, "08S01", T, F,   T, T, T, T, "server shutdown at COMMIT"},
  {1234, "08S01", T, F,   T, T, T, T, "unknown code, SQLSTATE 08, at COMMIT"},
  {1234, "HY000", T, F,   T, T, F, F, "unknown server error at COMMIT"},
  {1180, "HY000", T, F,   T, T, F, F, "error during COMMIT"},
  {1062, "23000", T, F,   T, T, F, F, "a permanent code at COMMIT is still in doubt"},
  {1290, "HY000", T, F,   T, T, F, F, "read-only at COMMIT"},
  {1969, "70100", T, F,   T, T, F, F, "statement timeout at COMMIT"},
  {1461, "42000", T, F,   T, T, F, F, "the prepared statement limit at COMMIT: still in doubt"},
  {1205, "HY000", T, F,   T, T, F, F, "lock wait timeout at COMMIT: no rollback announced"},
  {1205, "HY000", T, T,   T, F, F, T, "lock wait timeout at COMMIT under innodb_rollback_on_timeout"},
  {1213, "40001", T, F,   T, F, F, T, "deadlock at COMMIT (Galera certification)"},
  {1206, "HY000", T, F,   T, F, F, T, "lock table full at COMMIT"},
  {1234, "40001", T, F,   T, F, F, T, "SQLSTATE 40 at COMMIT"},
};
// clang-format on

// gtest names a failing row by this, not by its bytes.
void PrintTo(const row& r, std::ostream* os) {
  *os << r.code << "/" << r.sqlstate << (r.in_commit ? " at COMMIT" : "")
      << (r.rollback_on_timeout ? " rollback_on_timeout" : "") << ": " << r.why;
}

class MysqlErrors : public testing::TestWithParam<row> {};

TEST_P(MysqlErrors, Classified) {
  const row& r = GetParam();
  const sql::SQLException e("message from the driver", r.sqlstate, r.code);
  const auto v = mysql_detail::judge(e, r.in_commit, r.rollback_on_timeout);
  EXPECT_EQ(v.retryable, r.retryable) << r.why;
  EXPECT_EQ(v.in_doubt, r.in_doubt) << r.why;
  EXPECT_EQ(v.connection_broken, r.broken) << r.why;
  EXPECT_EQ(v.transaction_ended, r.ended) << r.why;

  // classify() throws what judge() decided.
  const storage_error s = mysql_detail::classify(e, "test", r.in_commit, r.rollback_on_timeout);
  EXPECT_EQ(s.retryable(), v.retryable) << r.why << ": " << s.what();
  EXPECT_EQ(s.in_doubt(), v.in_doubt) << r.why << ": " << s.what();
  const std::string_view expected_code = v.in_doubt    ? codes::commit_in_doubt
                                         : v.retryable ? codes::storage_unavailable
                                                       : codes::storage_error;
  EXPECT_EQ(s.code(), expected_code) << r.why;
  // The message names the code, for logs; it never goes to clients.
  EXPECT_NE(std::string(s.what()).find(std::to_string(r.code)), std::string::npos) << s.what();
  EXPECT_EQ(s.info().message.find(std::to_string(r.code)), std::string::npos) << s.info().message;
}

INSTANTIATE_TEST_SUITE_P(Table, MysqlErrors, testing::ValuesIn(table),
                         [](const testing::TestParamInfo<row>& p) {
                           return "code" + std::to_string(p.param.code) + "_" +
                                  (p.param.in_commit ? "commit" : "stmt") + "_" +
                                  std::to_string(p.index);
                         });

// A code added to errors.cpp without a row here fails this test.
TEST(MysqlErrorsTable, HasARowForEveryCodeErrorsCppNames) {
  std::ifstream in(ORPHEUS_SOURCE_DIR "/src/store/mysql/errors.cpp");
  ASSERT_TRUE(in) << "cannot read errors.cpp";
  std::stringstream text;
  text << in.rdbuf();
  const std::string source = text.str();
  const std::regex named(R"((?:case |code == )(\d+))");
  std::set<int> in_source;
  for (std::sregex_iterator it(source.begin(), source.end(), named), end; it != end; ++it) {
    in_source.insert(std::stoi((*it)[1]));
  }
  EXPECT_GT(in_source.size(), 20U);
  for (const int code : in_source) {
    bool outside_commit = false;
    for (const row& r : table) outside_commit = outside_commit || (r.code == code && !r.in_commit);
    EXPECT_TRUE(outside_commit) << "errors.cpp names " << code << ", the table has no row for it";
  }
}

}  // namespace
}  // namespace orpheus
