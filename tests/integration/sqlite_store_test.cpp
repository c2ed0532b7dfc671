// What only the SQLite backend has: its connection pool, its own rollback of a
// transaction on errors, and WAL mode. The shared behaviour is in
// conformance_test.cpp.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <future>
#include <iostream>

#include "orpheus/manager.hpp"
#include "orpheus/store/sqlite.hpp"
#include "support/backends.hpp"

namespace orpheus {
namespace {

std::string fresh_path() {
  auto dir = std::filesystem::temp_directory_path() / ("orpheus-sqlite-" + test::random_hex());
  std::filesystem::create_directories(dir);
  return (dir / "orpheus.db").string();
}

// A hang is the bug some of these tests look for: wait with a guard, and
// end the process rather than let ctest sit until its own timeout.
template <class F>
auto within(std::chrono::seconds guard, F&& f) {
  auto done = std::async(std::launch::async, std::forward<F>(f));
  if (done.wait_for(guard) != std::future_status::ready) {
    std::cerr << "hung for " << guard.count() << " s\n";
    std::_Exit(1);
  }
  return done.get();
}

// Issue 7.3: with one connection, a throwing Post-RPC made the thread ask the
// pool for a second connection while it held the first: the process hung.
TEST(SqliteStore, AThrowingPostRpcDoesNotHangAPoolOfOne) {
  sqlite_store s({.path = fresh_path(),
                  .busy_timeout = std::chrono::milliseconds(2000),
                  .max_connections = 1});
  s.migrate();
  manager m(s);
  const request_id rid{"scope", "k1", fingerprint_of("x")};
  const std::string code = within(std::chrono::seconds(60), [&] {
    try {
      m.process(
          rid, [](tx&) { return 1; }, [](const attempt&, int) { return 2; },
          [](tx&, const attempt&, const outcome<int>&) -> response {
            throw std::runtime_error("post failed");
          });
    } catch (const error& e) {
      return e.code();
    }
    return std::string("no error");
  });
  EXPECT_EQ(code, codes::post_rpc_failed);
  const auto rec = s.inspect(rid);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->state, record_state::retryable) << "the lease was released, not left to expire";
}

TEST(SqliteStore, WaitingForAConnectionIsBounded) {
  sqlite_store s(
      {.path = fresh_path(), .busy_timeout = std::chrono::milliseconds(200), .max_connections = 1});
  s.migrate();
  auto held = s.begin_on_shard(0);
  within(std::chrono::seconds(60), [&] {
    try {
      auto second = s.begin_on_shard(0);
      ADD_FAILURE() << "got a second connection from a pool of one";
    } catch (const storage_error& e) {
      EXPECT_TRUE(e.retryable());
      EXPECT_EQ(e.code(), codes::storage_unavailable);
    }
    return 0;
  });
  held->rollback();
}

// Issue 7.4: after the database rolled the transaction back, a later
// statement ran in autocommit mode and committed on its own.
TEST(SqliteStore, ATransactionEndedUnderTheLibraryIsPoisoned) {
  sqlite_store s({.path = fresh_path()});
  s.migrate();
  const request_id rid{"scope", "k1", fingerprint_of("x")};
  auto t = s.begin(rid);
  ASSERT_TRUE(
      t->insert(rid, "0123456789abcdef0123456789abcdef", {1'000'000, 1'000'000, 1'000'000}));
  t->execute("ROLLBACK");  // what the database does on its own after some errors
  try {
    t->finish(rid, "0123456789abcdef0123456789abcdef", record_state::succeeded,
              response{200, {}, "x"}, {}, {1'000'000, 1'000'000, 1'000'000});
    ADD_FAILURE() << "a statement ran after the transaction was gone";
  } catch (const storage_error& e) {
    EXPECT_TRUE(e.retryable());
    EXPECT_FALSE(e.in_doubt()) << "nothing of it was committed";
  }
  EXPECT_THROW(t->insert(rid, "0123456789abcdef0123456789abcdef", {1, 1, 1}), storage_error);
  EXPECT_THROW(t->commit(), storage_error);
  t.reset();
  EXPECT_FALSE(s.inspect(rid)) << "nothing may have been committed in autocommit mode";
}

// Issue 7.14: the journal mode was set and never checked.
TEST(SqliteStore, AFileThatCannotUseWalIsRefusedAtStartUp) {
  EXPECT_THROW(sqlite_store({.path = ":memory:"}), config_error);
}

}  // namespace
}  // namespace orpheus
