// The SQLite error classifier (src/store/sqlite/errors.hpp), table-driven:
// {result code, in_commit} -> {retryable, in doubt}, over primary and
// extended result codes. throw_sqlite() must throw what judge() decided, and
// every code errors.hpp names has a row (checked against the source below).
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <fstream>
#include <ostream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "store/sqlite/connection.hpp"
#include "store/sqlite/errors.hpp"

namespace orpheus {
namespace {

struct row {
  int rc;
  const char* name;  ///< the SQLITE_ constant, without the prefix
  bool in_commit;
  bool retryable;
  bool in_doubt;
  const char* why;
};

constexpr bool T = true;
constexpr bool F = false;

#define RC(x) SQLITE_##x, #x

// clang-format off
constexpr row table[] = {
  // result code                  commit retry  doubt
  // "Not now": retry the call; outside COMMIT nothing committed.
  {RC(BUSY),                       F,    T,     F, "another connection holds the lock past busy_timeout"},
  {RC(BUSY_SNAPSHOT),              F,    T,     F, "a read transaction cannot be upgraded (WAL snapshot is stale)"},
  {RC(BUSY_RECOVERY),              F,    T,     F, "another process is recovering the WAL"},
  {RC(BUSY_TIMEOUT),               F,    T,     F, "a blocking lock timed out"},
  {RC(LOCKED),                     F,    T,     F, "a conflict inside this process"},
  {RC(LOCKED_SHAREDCACHE),         F,    T,     F, "a shared-cache lock"},
  {RC(IOERR),                      F,    T,     F, "an I/O error"},
  {RC(IOERR_FSYNC),                F,    T,     F, "fsync failed"},
  {RC(IOERR_WRITE),                F,    T,     F, "write failed"},
  {RC(IOERR_SHORT_READ),           F,    T,     F, "short read"},
  {RC(IOERR_NOMEM),                F,    T,     F, "out of memory during I/O"},
  {RC(IOERR_SHMMAP),               F,    T,     F, "the WAL index cannot be mapped"},
  {SQLITE_IOERR | (200 << 8), "IOERR_(future)", F, T, F, "an extended code newer than this SQLite"},
  {RC(FULL),                       F,    T,     F, "disk full"},
  {RC(CANTOPEN),                   F,    T,     F, "the file cannot be opened now"},
  {RC(CANTOPEN_ISDIR),             F,    T,     F, "an extended CANTOPEN"},
  {RC(PROTOCOL),                   F,    T,     F, "a WAL locking race between processes"},
  {RC(NOMEM),                      F,    T,     F, "out of memory"},
  // What an operator puts right: retry the call.
  {RC(PERM),                       F,    T,     F, "access permission denied (found in review: final)"},
  {RC(READONLY),                   F,    T,     F, "a read-only database (found in review: final)"},
  {RC(READONLY_RECOVERY),          F,    T,     F, "read-only: WAL recovery needed (primary code decides)"},
  {RC(READONLY_DBMOVED),           F,    T,     F, "the file was moved or deleted"},
  {RC(SCHEMA),                     F,    T,     F, "the schema changed (as MySQL's 1412/1615)"},
  // Anything else is permanent: the same statement would be refused again.
  {RC(ERROR),                      F,    F,     F, "SQL error or missing table"},
  {RC(INTERNAL),                   F,    F,     F, "an SQLite bug"},
  {RC(ABORT),                      F,    F,     F, "a callback asked to abort"},
  {RC(ABORT_ROLLBACK),             F,    F,     F, "a ROLLBACK aborted this statement"},
  {RC(INTERRUPT),                  F,    F,     F, "sqlite3_interrupt()"},
  {RC(CORRUPT),                    F,    F,     F, "a corrupt database"},
  {RC(CORRUPT_INDEX),              F,    F,     F, "a corrupt index"},
  {RC(NOTFOUND),                   F,    F,     F, "unknown file-control opcode"},
  {RC(TOOBIG),                     F,    F,     F, "string or blob too big"},
  {RC(CONSTRAINT),                 F,    F,     F, "a constraint"},
  {RC(CONSTRAINT_UNIQUE),          F,    F,     F, "a unique constraint"},
  {RC(CONSTRAINT_PRIMARYKEY),      F,    F,     F, "a primary key"},
  {RC(CONSTRAINT_FOREIGNKEY),      F,    F,     F, "a foreign key"},
  {RC(CONSTRAINT_NOTNULL),         F,    F,     F, "a NOT NULL column"},
  {RC(MISMATCH),                   F,    F,     F, "a datatype mismatch"},
  {RC(MISUSE),                     F,    F,     F, "the library used incorrectly"},
  {RC(NOLFS),                      F,    F,     F, "no large file support"},
  {RC(AUTH),                       F,    F,     F, "authorization denied"},
  {RC(RANGE),                      F,    F,     F, "a bind index out of range"},
  {RC(NOTADB),                     F,    F,     F, "not a database file"},
  {99,   "(unknown 99)",           F,    F,     F, "an unknown primary code"},
  {1000, "(unknown 1000)",         F,    F,     F, "an unknown extended code of an unknown primary"},
  // COMMIT: any failure is in doubt, whatever the code.
  {RC(BUSY),                       T,    T,     T, "BUSY at COMMIT (the transaction stays open; rolled back after)"},
  {RC(BUSY_SNAPSHOT),              T,    T,     T, "BUSY_SNAPSHOT at COMMIT"},
  {RC(LOCKED),                     T,    T,     T, "LOCKED at COMMIT"},
  {RC(IOERR),                      T,    T,     T, "an I/O error at COMMIT: the WAL frame may be on disk"},
  {RC(IOERR_FSYNC),                T,    T,     T, "fsync failed at COMMIT"},
  {RC(FULL),                       T,    T,     T, "disk full at COMMIT"},
  {RC(CANTOPEN),                   T,    T,     T, "CANTOPEN at COMMIT"},
  {RC(PROTOCOL),                   T,    T,     T, "PROTOCOL at COMMIT"},
  {RC(NOMEM),                      T,    T,     T, "out of memory at COMMIT"},
  {RC(ERROR),                      T,    T,     T, "a permanent code at COMMIT is still in doubt"},
  {RC(CONSTRAINT),                 T,    T,     T, "a deferred constraint at COMMIT"},
  {RC(CONSTRAINT_FOREIGNKEY),      T,    T,     T, "a deferred foreign key at COMMIT"},
  {RC(MISUSE),                     T,    T,     T, "MISUSE at COMMIT"},
  {RC(CORRUPT),                    T,    T,     T, "CORRUPT at COMMIT"},
  {RC(READONLY),                   T,    T,     T, "READONLY at COMMIT"},
  {RC(PERM),                       T,    T,     T, "PERM at COMMIT"},
  {RC(SCHEMA),                     T,    T,     T, "SCHEMA at COMMIT"},
  {RC(INTERRUPT),                  T,    T,     T, "INTERRUPT at COMMIT"},
  {99,   "(unknown 99)",           T,    T,     T, "an unknown code at COMMIT"},
};
// clang-format on

#undef RC

// gtest names a failing row by this, not by its bytes.
void PrintTo(const row& r, std::ostream* os) {
  *os << "SQLITE_" << r.name << (r.in_commit ? " at COMMIT" : "") << ": " << r.why;
}

class SqliteErrors : public testing::TestWithParam<row> {};

TEST_P(SqliteErrors, Classified) {
  const row& r = GetParam();
  const auto v = sqlite_detail::judge(r.rc, r.in_commit);
  EXPECT_EQ(v.retryable, r.retryable) << r.name << ": " << r.why;
  EXPECT_EQ(v.in_doubt, r.in_doubt) << r.name << ": " << r.why;

  // throw_sqlite() throws what judge() decided.
  try {
    sqlite_detail::throw_sqlite(nullptr, r.rc, "test", r.in_commit);
  } catch (const storage_error& s) {
    EXPECT_EQ(s.retryable(), v.retryable) << r.name << ": " << s.what();
    EXPECT_EQ(s.in_doubt(), v.in_doubt) << r.name << ": " << s.what();
    const std::string_view expected_code = v.in_doubt    ? codes::commit_in_doubt
                                           : v.retryable ? codes::storage_unavailable
                                                         : codes::storage_error;
    EXPECT_EQ(s.code(), expected_code) << r.name;
    EXPECT_EQ(std::string(s.what()).rfind("sqlite: test: ", 0), 0U) << s.what();
  } catch (...) {
    ADD_FAILURE() << r.name << ": throw_sqlite threw something else than storage_error";
  }
}

INSTANTIATE_TEST_SUITE_P(Table, SqliteErrors, testing::ValuesIn(table),
                         [](const testing::TestParamInfo<row>& p) {
                           return "rc" + std::to_string(p.param.rc) + "_" +
                                  (p.param.in_commit ? "commit" : "stmt") + "_" +
                                  std::to_string(p.index);
                         });

// A code added to errors.hpp without a row here fails this test.
TEST(SqliteErrorsTable, HasARowForEveryCodeErrorsHppNames) {
  std::ifstream in(ORPHEUS_SOURCE_DIR "/src/store/sqlite/errors.hpp");
  ASSERT_TRUE(in) << "cannot read errors.hpp";
  std::stringstream text;
  text << in.rdbuf();
  const std::string source = text.str();
  const std::regex named(R"(case SQLITE_(\w+):)");
  std::set<std::string> in_source;
  for (std::sregex_iterator it(source.begin(), source.end(), named), end; it != end; ++it) {
    in_source.insert((*it)[1]);
  }
  EXPECT_GE(in_source.size(), 7U);
  for (const auto& name : in_source) {
    bool stmt = false;
    bool commit = false;
    for (const row& r : table) {
      if (name != r.name) continue;
      stmt = stmt || !r.in_commit;
      commit = commit || r.in_commit;
    }
    EXPECT_TRUE(stmt && commit) << "errors.hpp names SQLITE_" << name
                                << ", the table lacks a row for it in or outside COMMIT";
  }
}

}  // namespace
}  // namespace orpheus
