// The MySQL error classifier (src/store/mysql/errors.cpp), table-driven:
// {code, sqlstate, in_commit} -> {retryable, in_doubt, connection broken,
// transaction ended}. No server: sql::SQLException is built by hand.
#include <cppconn/exception.h>
#include <gtest/gtest.h>

#include <string>

#include "errors.hpp"

namespace orpheus {
namespace {

struct row {
  int code;
  const char* sqlstate;
  bool in_commit;
  bool retryable;
  bool in_doubt;
  bool broken;
  bool ended;  ///< the server rolled the whole transaction back
  const char* why;
};

// clang-format off
constexpr row table[] = {
  // Known server errors outside COMMIT.
  {1213, "40001", false, true,  false, false, true,  "deadlock: the server rolled the transaction back"},
  {1205, "HY000", false, true,  false, false, false, "lock wait timeout: only the statement is rolled back"},
  {1969, "70100", false, true,  false, false, false, "max_statement_time"},
  {1317, "70100", false, true,  false, false, false, "KILL QUERY"},
  {1040, "08004", false, true,  false, true,  true,  "too many connections (at connect)"},
  {1290, "HY000", false, true,  false, false, false, "read-only server"},
  {1836, "HY000", false, true,  false, false, false, "read-only mode"},
  {1053, "08S01", false, true,  false, true,  true,  "server shutdown in progress"},
  {1927, "70100", false, true,  false, true,  true,  "connection killed"},
  {1062, "23000", false, false, false, false, false, "duplicate key"},
  {1064, "42000", false, false, false, false, false, "syntax error"},
  {1146, "42S02", false, false, false, false, false, "no such table"},
  {1045, "28000", false, false, false, false, false, "wrong password"},
  // Unknown server errors: permanent (bug 14: they used to be retried).
  {1234, "42000", false, false, false, false, false, "unknown server code"},
  {1999, "HY000", false, false, false, false, false, "unknown server code"},
  {3999, "HY000", false, false, false, false, false, "unknown MySQL 8 code"},
  {4999, "HY000", false, false, false, false, false, "unknown MariaDB code"},
  // ... unless the SQLSTATE says connection trouble or a rolled-back transaction.
  {1234, "08S01", false, true,  false, true,  true,  "SQLSTATE 08: connection exception"},
  {1234, "40001", false, true,  false, false, true,  "SQLSTATE 40: transaction rolled back"},
  // Client errors (2xxx): the link is in an unknown state; discard, retry.
  {2002, "HY000", false, true,  false, true,  true,  "cannot connect"},
  {2006, "HY000", false, true,  false, true,  true,  "server has gone away"},
  {2013, "HY000", false, true,  false, true,  true,  "lost connection during query"},
  {2014, "HY000", false, true,  false, true,  true,  "commands out of sync"},
  {2027, "HY000", false, true,  false, true,  true,  "malformed packet (unknown client code)"},
  {2099, "HY000", false, true,  false, true,  true,  "unknown client code"},
  {0,    "",      false, true,  false, true,  true,  "driver error without a code"},
  // COMMIT: any failure may have landed, except a known rollback.
  {2013, "HY000", true,  true,  true,  true,  true,  "lost connection during COMMIT"},
  {2006, "HY000", true,  true,  true,  true,  true,  "server gone at COMMIT"},
  {0,    "",      true,  true,  true,  true,  true,  "driver error at COMMIT"},
  {1234, "HY000", true,  true,  true,  false, false, "unknown server error at COMMIT"},
  {1180, "HY000", true,  true,  true,  false, false, "error during COMMIT"},
  {1213, "40001", true,  true,  false, false, true,  "deadlock at COMMIT (Galera certification)"},
};
// clang-format on

class MysqlErrors : public testing::TestWithParam<row> {};

TEST_P(MysqlErrors, Classified) {
  const row& r = GetParam();
  const sql::SQLException e("message from the driver", r.sqlstate, r.code);
  const storage_error s = mysql_detail::classify(e, "test", r.in_commit);
  EXPECT_EQ(s.retryable(), r.retryable) << r.why << ": " << s.what();
  EXPECT_EQ(s.in_doubt(), r.in_doubt) << r.why << ": " << s.what();
  const auto v = mysql_detail::judge(e, r.in_commit, /*rollback_on_timeout=*/false);
  EXPECT_EQ(v.retryable, r.retryable) << r.why;
  EXPECT_EQ(v.in_doubt, r.in_doubt) << r.why;
  EXPECT_EQ(v.connection_broken, r.broken) << r.why;
  EXPECT_EQ(v.transaction_ended, r.ended) << r.why;
  // The message names the code, for logs; it never goes to clients.
  EXPECT_NE(std::string(s.what()).find(std::to_string(r.code)), std::string::npos) << s.what();
}

INSTANTIATE_TEST_SUITE_P(Table, MysqlErrors, testing::ValuesIn(table),
                         [](const testing::TestParamInfo<row>& p) {
                           return "code" + std::to_string(p.param.code) + "_" +
                                  (p.param.in_commit ? "commit" : "stmt") + "_" +
                                  std::to_string(p.index);
                         });

// innodb_rollback_on_timeout=ON makes a lock wait timeout roll back the whole
// transaction; the default rolls back only the statement.
TEST(MysqlErrorsTimeout, LockWaitTimeoutEndsTheTransactionOnlyWithRollbackOnTimeout) {
  const sql::SQLException e("Lock wait timeout exceeded", "HY000", 1205);
  EXPECT_FALSE(mysql_detail::judge(e, false, false).transaction_ended);
  EXPECT_TRUE(mysql_detail::judge(e, false, true).transaction_ended);
  EXPECT_TRUE(mysql_detail::judge(e, false, true).retryable);
}

}  // namespace
}  // namespace orpheus
