// The handler SQL guard (src/sql_guard.hpp), statement by statement: what it
// refuses because it would end, escape or outlive the library's transaction,
// and what it lets through. Whether a refused statement really commits on
// MariaDB and SQLite is shown by the Conformance and MysqlStore suites.
#include "../../src/sql_guard.hpp"

#include <gtest/gtest.h>

#include <clocale>
#include <string>
#include <vector>

#include "orpheus/error.hpp"
#include "support/locale.hpp"

namespace orpheus {
namespace {

bool refused(const std::string& sql) {
  try {
    detail::refuse_transaction_control(sql);
    return false;
  } catch (const storage_error& e) {
    EXPECT_FALSE(e.retryable()) << sql;  // a programming error: never retried
    return true;
  }
}

// Found in review: the guard upper-cased with std::toupper, which follows
// LC_CTYPE: under tr_TR.UTF-8 toupper('i') is 'i', so "commit" was read as
// COMMiT and sent (the lease row and Pre-RPC's writes committed apart from
// the rest of transaction 1; on SQLite, the writer's shared batch with them).
TEST(SqlGuard, RefusesTheSameUnderATurkishLocale) {
  const char* const statements[] = {
      "commit",
      "begin",
      "if ? then commit; end if",
      "start transaction",
      "set autocommit=1",
      "set session transaction isolation level read uncommitted",
      "optimize table t",
      "install plugin p soname 'x'",
      "release savepoint orpheus_member",
      "--c\nrollback to orpheus_member",
      "set statement max_statement_time=1 for commit",
  };
  for (const char* charmap : {"UTF-8", "ISO-8859-9"}) {
    SCOPED_TRACE(charmap);
    bool set = false;
    std::vector<std::string> let_through;
    orpheus::test::under_locale(LC_CTYPE, "tr_TR", charmap, [&] {
      set = true;
      for (const char* sql : statements) {
        if (!refused(sql)) let_through.emplace_back(sql);
      }
    });
    ASSERT_TRUE(set) << "no tr_TR: install the package locales (scripts/test does)";
    EXPECT_TRUE(let_through.empty())
        << let_through.size()
        << " let through, the first: " << (let_through.empty() ? "" : let_through.front());
  }
  for (const char* sql : statements) EXPECT_TRUE(refused(sql)) << sql;  // and in "C"
}

TEST(SqlGuard, RefusesWhatEndsEscapesOrOutlivesTheTransaction) {
  for (const char* sql : {
           // Ends or opens a transaction, in any case, after comments or
           // empty statements (found in review: "; COMMIT", "# c\nCOMMIT").
           "COMMIT",
           " commit",
           "ROLLBACK",
           "rollback work",
           "BEGIN",
           "/* x */ BEGIN",
           "start transaction",
           "-- c\nEND",
           "; COMMIT",
           " ;; -- x\n ;END",
           "# c\nCOMMIT",
           // SQLite reads "--x" as a comment too (found in review: no first
           // word as MySQL reads it, and SQLite ran the COMMIT).
           "--c\nCOMMIT",
           "--c\nPRAGMA query_only=1",
           "--c\nRELEASE orpheus_member",
           "--1\nrollback",
           "XA START 'x'",
           "LOCK TABLES t WRITE",
           "UNLOCK TABLES",
           // Compound statements, which MariaDB runs outside a stored
           // program and which may COMMIT inside (found in review).
           "IF 1 THEN INSERT INTO t VALUES (1); COMMIT; END IF",
           "if ? then commit; end if",
           "CASE WHEN 1 THEN COMMIT; END CASE",
           "LOOP COMMIT; LEAVE; END LOOP",
           "WHILE 1 DO COMMIT; END WHILE",
           "REPEAT COMMIT; UNTIL 1 END REPEAT",
           "FOR i IN 1..2 DO COMMIT; END FOR",
           "x: BEGIN COMMIT; END",
           "lbl : LOOP COMMIT; LEAVE lbl; END LOOP",
           "/* c */ IF 1 THEN COMMIT; END IF",
           "SET STATEMENT max_statement_time=1 FOR IF 1 THEN COMMIT; END IF",
           // Executable comments run as SQL on MySQL and MariaDB.
           "/*!COMMIT*/",
           "SELECT 1 /*!; COMMIT */",
           "/*M! COMMIT */",
           // Commit implicitly: DDL, maintenance, administration.
           "CREATE TABLE t (a INT)",
           "CREATE TEMPORARY TABLE t (a INT)",
           "ALTER TABLE t ADD b INT",
           "DROP TABLE t",
           "TRUNCATE t",
           "RENAME TABLE a TO b",
           "GRANT ALL ON *.* TO u",
           "FLUSH TABLES",
           "ANALYZE TABLE t",
           "OPTIMIZE TABLE t",
           "REPAIR TABLE t",
           "CHECK TABLE t",
           "CACHE INDEX t IN c",
           "LOAD INDEX INTO CACHE t",
           "BACKUP STAGE START",
           "BACKUP LOCK t",
           "SHUTDOWN",
           "RESET MASTER",
           "STOP SLAVE",
           "INSTALL PLUGIN p SONAME 'x'",
           // Runs SQL the guard cannot see.
           "CALL ledger_entry(1)",
           "call x()",
           "PREPARE s FROM 'COMMIT'",
           "EXECUTE s",
           "EXECUTE IMMEDIATE 'COMMIT'",
           "DEALLOCATE PREPARE s",
           // The SQLite writer's own savepoint.
           "RELEASE SAVEPOINT orpheus_member",
           "ROLLBACK TO orpheus_member",
           // Session settings stay on the pooled connection; some commit or
           // change what the library's statements see (found in review: a
           // literal before the setting hid it).
           "SET autocommit=1",
           "SET SESSION autocommit = 1",
           "SET @@autocommit=1",
           "SET @a = 'x', autocommit = 1",
           "SET @a = 'it''s', @@session.autocommit = 1",
           "SET TRANSACTION ISOLATION LEVEL READ UNCOMMITTED",
           "SET SESSION TRANSACTION ISOLATION LEVEL READ UNCOMMITTED",
           "SET GLOBAL TRANSACTION READ ONLY",
           "SET @@session.transaction_isolation = 'x'",
           "SET tx_isolation = 'SERIALIZABLE'",
           "SET completion_type = RELEASE",
           "SET @a = 'x', completion_type = 1",
           "SET PASSWORD = PASSWORD('x')",
           "SET ROLE r",
           "SET DEFAULT ROLE NONE",
           "SET NAMES latin1",
           "SET time_zone = '+01:00'",
           "SET `autocommit` = 1",
           "USE other_db",
           // Found in review: "--" before a non-space is not a comment on
           // MySQL, and a quoted identifier may hold anything.
           "SET @a = 1 --1, autocommit = 1",
           "SET @`(` = 1, autocommit = 1",
           "SET @`#` = 1, autocommit = 1",
           "SET @`'` = 1, autocommit = 1, @`'` = 2",
           "SET STATEMENT max_statement_time=1 --1 FOR CREATE TABLE z(x int)",
           "RELEASE 'orpheus_member'",
           R"(ROLLBACK TO "orpheus_member")",
           // SQLite settings stay on the writer's connection.
           "PRAGMA query_only = 1",
           "pragma recursive_triggers(1)",
           "PRAGMA table_info(t)",
           // Under NO_BACKSLASH_ESCAPES the literal ends at the backslash.
           R"(SET @a = 'x\', autocommit = 1)",
           R"(SET @a = 'x\'y')",
           // SET STATEMENT ... FOR runs its statement: checked as any other.
           "SET STATEMENT max_statement_time=100 FOR CALL p()",
           "SET STATEMENT max_statement_time=100 FOR COMMIT",
           "set statement sql_mode='' for create table t (a int)",
           "SET STATEMENT sql_mode='' FOR SET autocommit=1",
       }) {
    EXPECT_TRUE(refused(sql)) << sql;
  }
}

TEST(SqlGuard, LetsTheApplicationsOwnStatementsThrough) {
  for (const char* sql : {
           "SELECT 1",
           "select * from payments where id = ?",
           "INSERT INTO payments (id, note) VALUES (?, 'commit; rollback')",
           "UPDATE payments SET transaction = 1, autocommit = 2 WHERE id = ?",
           "UPDATE t SET state = 'done' -- COMMIT",
           "DELETE FROM payments WHERE id = ?",
           "REPLACE INTO t VALUES (1)",
           "WITH x AS (SELECT 1) SELECT * FROM x",
           "SELECT * FROM t FOR UPDATE",
           "SELECT IF(a, 1, 2), CASE WHEN b THEN 1 END FROM t",
           // SQLite's named parameters after the first word are no label
           // (found in review of the compound-statement rule).
           "SELECT :amount <= balance FROM accounts WHERE id = :id",
           "SELECT :x",
           "UPDATE t SET a = 1 WHERE id = :id",
           "CHECKSUM TABLE t",
           "LOAD DATA INFILE 'x' INTO TABLE t",
           // The handler's own savepoints.
           "SAVEPOINT mine",
           "ROLLBACK TO SAVEPOINT mine",
           "ROLLBACK TO mine",
           "RELEASE SAVEPOINT mine",
           "ROLLBACK WORK TO SAVEPOINT mine",
           "ROLLBACK TRANSACTION TO mine",
           "SELECT * FROM pragma_table_info('t')",
           "SELECT a --1\nFROM t",
           "UPDATE `t` SET `transaction` = 1",
           // User variables are the handler's own (found in review: a name or
           // a value that only mentions a setting was refused).
           "SET @a = 1",
           "SET @a := 1, @b = 2",
           "SET @last_transaction = ?",
           "SET @note = 'transaction autocommit completion_type'",
           "SET @n = (SELECT COUNT(*) FROM transactions WHERE a IN (1, 2))",
           "SET STATEMENT max_statement_time=100 FOR UPDATE t SET transaction_count = 1",
           "SET STATEMENT max_statement_time=100 FOR SELECT 1",
       }) {
    EXPECT_FALSE(refused(sql)) << sql;
  }
}

// The application's own transaction (store::begin_on_shard): its DDL and
// procedures are its own business; ending it by a statement or leaving state
// on the pooled connection is not.
TEST(SqlGuard, AnOwnTransactionMayNotEndItselfOrChangeTheSession) {
  const auto own_refused = [](const std::string& sql) {
    try {
      detail::refuse_session_escape(sql);
      return false;
    } catch (const storage_error& e) {
      EXPECT_FALSE(e.retryable()) << sql;
      return true;
    }
  };
  for (const char* sql : {"COMMIT",
                          "; commit",
                          "ROLLBACK",
                          "BEGIN",
                          "START TRANSACTION",
                          "END",
                          "XA START 'x'",
                          "LOCK TABLES t WRITE",
                          "UNLOCK TABLES",
                          "USE other",
                          "SET autocommit = 1",
                          "SET @a = 'x', autocommit = 1",
                          "SET SESSION TRANSACTION ISOLATION LEVEL SERIALIZABLE",
                          "SET completion_type = 1",
                          "SET time_zone = '+01:00'",
                          "/*!COMMIT*/",
                          "SET STATEMENT sql_mode='' FOR COMMIT",
                          "RELEASE SAVEPOINT orpheus_member",
                          "PRAGMA query_only = 1",
                          "SET @`#` = 1, autocommit = 1"}) {
    EXPECT_TRUE(own_refused(sql)) << sql;
  }
  for (const char* sql :
       {"CREATE TABLE IF NOT EXISTS payments (id TEXT PRIMARY KEY)", "DROP TABLE t",
        "ALTER TABLE t ADD b INT", "CALL monthly_report()", "ANALYZE TABLE t", "SELECT 1",
        "INSERT INTO t VALUES (1)", "SET @a = 1", "SAVEPOINT mine", "ROLLBACK TO SAVEPOINT mine"}) {
    EXPECT_FALSE(own_refused(sql)) << sql;
  }
}

TEST(SqlGuard, TheMessageNamesTheStatementNeverItsValues) {
  try {
    detail::refuse_transaction_control("SET @secret = 'sk_live_123', autocommit = 1");
    FAIL() << "not refused";
  } catch (const storage_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("SET"), std::string::npos) << what;
    EXPECT_EQ(what.find("sk_live_123"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace orpheus
