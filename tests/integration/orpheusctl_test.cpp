// orpheusctl against a populated store (issue 11, item 6): the real program,
// its --json output parsed and checked, its exit codes, on a SQLite file and
// on two MariaDB shards.
#include <gtest/gtest.h>

#include <sqlite3.h>
#include <fstream>
#include <nlohmann/json.hpp>

#include "orpheus/manager.hpp"
#include "support/backends.hpp"
#include "support/process.hpp"

namespace orpheus {
namespace {

using namespace std::chrono_literals;
using json = nlohmann::json;

struct ran {
  int code = -1;
  std::string out;
  [[nodiscard]] json parsed() const { return json::parse(out); }
};

/// Runs orpheusctl; `out` is its stdout, and its stderr too with `with_stderr`.
ran run_ctl(const std::string& store_arg, const std::vector<std::string>& args,
            bool with_stderr = false) {
  std::vector<std::string> argv = {std::string(ORPHEUS_BINARY_DIR) + "/adapters/ctl/orpheusctl",
                                   "--store", store_arg};
  argv.insert(argv.end(), args.begin(), args.end());
  test::child_process p(argv, with_stderr);
  ran r;
  while (auto line = p.read_line(30s)) r.out += *line + "\n";
  r.code = p.wait();
  return r;
}

class Orpheusctl : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "sqlite") {
      store_ = test::make_store("sqlite");
      ASSERT_TRUE(store_);
      // make_store's file: the same path, opened by the program.
      store_arg_ = "sqlite:" + sqlite_path_of(*store_);
    } else {
      store_ = test::make_store("mysql", 2);
      ASSERT_TRUE(store_);
      const auto urls = test::mysql_map_urls(2);
      ASSERT_EQ(urls.size(), 2U);
      store_arg_ = urls[0] + "," + urls[1];
    }
    scope_ = "ctl-" + test::random_hex();
  }

  static std::string sqlite_path_of(store& s) {
    auto rows = s.backend().read(0, "PRAGMA database_list", {});
    return rows.at(0).get<std::string>(2);
  }

  ran ctl(const std::vector<std::string>& args) { return run_ctl(store_arg_, args); }

  request_id id(const std::string& key) const { return {scope_, key, fingerprint_of(key)}; }

  // One payment through the library: the RPC fails (retryable) when `fail`.
  response pay(manager& m, const std::string& key, bool fail, int& rpcs) {
    return m.process(
        id(key), [&](tx&) { return key; },
        [&](const attempt& a, const std::string& k) -> std::string {
          ++rpcs;
          if (fail) throw retryable_error("bank_unavailable", "503 from bank");
          return "ch_" + k + "_" + std::to_string(a.number());
        },
        [](tx&, const attempt&, const std::string& v) {
          return response{201, {}, v};
        });
  }

  std::unique_ptr<store> store_;
  std::string store_arg_;
  std::string scope_;
};

TEST_P(Orpheusctl, ShowsListsCountsRequeuesAndResolves) {
  config cfg;
  cfg.max_attempts = 1;
  manager m(*store_, cfg);
  int rpcs = 0;
  EXPECT_EQ(pay(m, "paid", false, rpcs).status, 201);
  EXPECT_THROW(pay(m, "stuck", true, rpcs), error);
  EXPECT_THROW(pay(m, "stuck", true, rpcs), error);    // parked
  EXPECT_THROW(pay(m, "waiting", true, rpcs), error);  // retryable
  ASSERT_EQ(store_->inspect(id("stuck"))->state, record_state::parked);

  // show
  auto r = ctl({"--json", "show", scope_, "stuck"});
  ASSERT_EQ(r.code, 0) << r.out;
  const json stuck = r.parsed();
  EXPECT_EQ(stuck["state"], "parked");
  EXPECT_EQ(stuck["scope"], scope_);
  EXPECT_EQ(stuck["shard"], store_->shard_of(id("stuck")));
  EXPECT_EQ(stuck["attempts"], 1);
  EXPECT_EQ(stuck["pre_state"], "\"stuck\"");
  EXPECT_TRUE(stuck["response"].is_null());
  ASSERT_EQ(stuck["history"].size(), 2U);
  EXPECT_EQ(stuck["history"][0]["outcome"], "retryable");
  EXPECT_NE(stuck["history"][0]["error"].get<std::string>().find("bank_unavailable"),
            std::string::npos);
  EXPECT_EQ(stuck["history"][1]["outcome"], "parked");
  EXPECT_EQ(stuck["history"][1]["runner"], "client");
  r = ctl({"show", scope_, "stuck"});  // the human form
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("parked"), std::string::npos) << r.out;
  r = ctl({"--json", "show", scope_, "paid"});
  ASSERT_EQ(r.code, 0);
  EXPECT_EQ(r.parsed()["response"]["status"], 201);
  EXPECT_EQ(r.parsed()["response"]["body"], "ch_paid_1");
  EXPECT_EQ(ctl({"show", scope_, "nobody"}).code, 1);

  // list and stats
  r = ctl({"--json", "list", "--state", "parked", "--limit", "100000"});
  ASSERT_EQ(r.code, 0) << r.out;
  int mine = 0;
  for (const auto& row : r.parsed()) {
    EXPECT_EQ(row["state"], "parked");
    if (row["scope"] == scope_) {
      ++mine;
      EXPECT_EQ(row["key"], "stuck");
      EXPECT_GE(row["unchanged_ms"].get<std::int64_t>(), 0);
    }
  }
  EXPECT_EQ(mine, 1);
  r = ctl({"--json", "list", "--state", "parked", "--older-than", "1h", "--limit", "100000"});
  ASSERT_EQ(r.code, 0);
  for (const auto& row : r.parsed()) EXPECT_NE(row["scope"], scope_);
  r = ctl({"--json", "stats"});
  ASSERT_EQ(r.code, 0) << r.out;
  ASSERT_EQ(r.parsed().size(), store_->shard_count());
  std::int64_t parked = 0;
  std::int64_t retryable = 0;
  for (const auto& s : r.parsed()) {
    parked += s["parked"].get<std::int64_t>();
    retryable += s["retryable"].get<std::int64_t>();
  }
  EXPECT_GE(parked, 1);
  EXPECT_GE(retryable, 1);

  // Bad usage changes nothing and says so with exit code 2.
  EXPECT_EQ(ctl({"requeue", scope_, "stuck"}).code, 2) << "--note is required";
  EXPECT_EQ(ctl({"resolve", scope_, "waiting", "--status", "42", "--note", "x"}).code, 2);
  EXPECT_EQ(ctl({"resolve", scope_, "waiting", "--status", "102", "--note", "x"}).code, 2)
      << "an interim status is no answer to record";
  EXPECT_EQ(ctl({"resolve", scope_, "waiting", "--status", "4294967497", "--note", "x"}).code, 2)
      << "2^32 + 201 is not 201";
  EXPECT_EQ(ctl({"show", scope_, " bad key"}).code, 2);
  EXPECT_EQ(ctl({"list", "--state", "lost"}).code, 2);
  EXPECT_EQ(ctl({"frobnicate"}).code, 2);
  // Found in review: a flag the command does not take was ignored (purge
  // --limit 10 purged everything), a second one replaced the first, a bare
  // "10" was 10 milliseconds, and a Content-Type with a line break was
  // recorded and replayed as a header of its own.
  EXPECT_EQ(ctl({"requeue", scope_, "stuck", "--note", "a", "--status", "201"}).code, 2);
  EXPECT_EQ(ctl({"requeue", scope_, "stuck", "--note", "a", "--note", "b"}).code, 2);
  EXPECT_EQ(ctl({"list", "--state", "parked", "--older-than", "10"}).code, 2);
  EXPECT_EQ(ctl({"--retention-ms", "604800000", "stats"}).code, 0) << "the servers' settings";
  EXPECT_EQ(ctl({"list", "--state", "parked", "--older-than", "0"}).code, 0);
  EXPECT_EQ(ctl({"resolve", scope_, "waiting", "--status", "201", "--content-type",
                 "text/plain\r\nSet-Cookie: a=1", "--note", "x"})
                .code,
            2);
  // Found in review: a body that its Content-Type says is JSON, and is not,
  // was recorded and replayed for good.
  for (const char* type : {"application/json", "Application/Problem+JSON; charset=utf-8"}) {
    EXPECT_EQ(ctl({"resolve", scope_, "waiting", "--status", "201", "--body", R"({"charge":)",
                   "--content-type", type, "--note", "x"})
                  .code,
              2)
        << type;
  }
  EXPECT_EQ(store_->inspect(id("stuck"))->state, record_state::parked);
  EXPECT_EQ(store_->inspect(id("waiting"))->state, record_state::retryable);

  // requeue: the parked payment resumes at its next retry.
  EXPECT_EQ(ctl({"requeue", scope_, "paid", "--note", "x"}).code, 3) << "refused: not parked";
  EXPECT_EQ(ctl({"requeue", scope_, "nobody", "--note", "x"}).code, 1);
  r = ctl({"--json", "requeue", scope_, "stuck", "--note", "bank back, ticket 7"});
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.parsed()["result"], "done");
  EXPECT_EQ(pay(m, "stuck", false, rpcs).body, "ch_stuck_2");
  r = ctl({"--json", "show", scope_, "stuck"});
  EXPECT_EQ(r.parsed()["state"], "succeeded");
  EXPECT_EQ(r.parsed()["history"].back()["outcome"], "requeued");
  EXPECT_EQ(r.parsed()["history"].back()["runner"], "operator");

  // resolve: an operator's outcome, replayed from then on.
  const int before = rpcs;
  r = ctl({"--json", "resolve", scope_, "waiting", "--status", "201", "--body",
           R"({"charge":"by_hand"})", "--content-type", "application/json", "--note",
           "bank says charged"});
  ASSERT_EQ(r.code, 0) << r.out;
  const auto replay = pay(m, "waiting", false, rpcs);
  EXPECT_TRUE(replay.replayed);
  EXPECT_EQ(replay.body, R"({"charge":"by_hand"})");
  EXPECT_EQ(rpcs, before);
  r = ctl({"--json", "resolve", scope_, "waiting", "--status", "201", "--note", "again"});
  EXPECT_EQ(r.code, 3);
  EXPECT_EQ(r.parsed()["result"], "refused");

  // purge and migrate run and report.
  r = ctl({"--json", "purge", "--batch", "500"});
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_GE(r.parsed()["deleted_rows"].get<std::int64_t>(), 0);
  EXPECT_EQ(store_->inspect(id("paid"))->state, record_state::succeeded) << "within retention";
  r = ctl({"--json", "migrate"});
  ASSERT_EQ(r.code, 0) << r.out;
  const json migrated = r.parsed();  // named: a member of a temporary would dangle in the loop
  for (const auto& v : migrated["schema_version"]) EXPECT_EQ(v, store_->schema_version(0));
}

// Found in review: a key that starts with '-' could not be named. "-h" as
// a key printed the usage and exited 0 having done nothing (not JSON, with
// --json), and "--note" as a key was read as the flag. After "--" every
// argument is positional.
TEST_P(Orpheusctl, KeysThatStartWithADashAreNamedAfterTheEndOfOptions) {
  config cfg;
  cfg.max_attempts = 1;
  manager m(*store_, cfg);
  int rpcs = 0;
  for (const std::string key : {"-h", "--note"}) {
    EXPECT_THROW(pay(m, key, true, rpcs), error);
    EXPECT_THROW(pay(m, key, true, rpcs), error);  // parked
    ASSERT_EQ(store_->inspect(id(key))->state, record_state::parked) << key;
  }
  auto r = ctl({"--json", "show", "--", scope_, "-h"});
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.parsed()["key"], "-h");
  EXPECT_EQ(r.parsed()["state"], "parked");
  r = ctl({"--json", "requeue", "--note", "checked by hand", "--", scope_, "--note"});
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(store_->inspect(id("--note"))->state, record_state::retryable);
  EXPECT_EQ(store_->inspect(id("-h"))->state, record_state::parked) << "another key changed";
  // Found in review: "-h" or "--help" anywhere before "--" printed the
  // usage and exited 0, and a script took the command as done.
  for (const std::string help : {"-h", "--help"}) {
    r = ctl({"--json", "requeue", scope_, help, "--note", "x"});
    EXPECT_EQ(r.code, 2) << help << ": " << r.out;
    EXPECT_EQ(store_->inspect(id("-h"))->state, record_state::parked) << help;
  }
}

TEST_P(Orpheusctl, CancelsAMultiStepRequestBeforeItsPivotOnly) {
  config cfg;
  cfg.max_attempts = 1;
  manager m(*store_, cfg);
  std::vector<std::string> calls;
  bool capture_down = true;
  steps<std::string> flow;
  flow.step("authorise",
            [&](const attempt& a, const std::string&, const step_results&) {
              calls.push_back("authorise#" + std::to_string(a.number()));
              return std::string("au");
            })
      .compensate([&](const attempt& a, const std::string&, const std::string&) {
        calls.push_back("void#" + std::to_string(a.number()));
      })
      .step("reserve",
            [&](const attempt& a, const std::string&, const step_results&) -> std::string {
              calls.push_back("reserve#" + std::to_string(a.number()));
              if (capture_down) throw retryable_error("bank_unavailable", "503");
              return "res";
            })
      .step("capture",
            [&](const attempt& a, const std::string&, const step_results&) {
              calls.push_back("capture#" + std::to_string(a.number()));
              return std::string("cap");
            })
      .respond([](tx&, const attempt&, const std::string&, const step_results&) {
        return response{201, {}, "paid"};
      });
  const auto run = [&](const std::string& key) {
    return m.process(
        id(key), [&](tx&) { return key; }, flow);
  };
  EXPECT_THROW(run("order"), error);
  EXPECT_THROW(run("order"), error);  // parked
  ASSERT_EQ(store_->inspect(id("order"))->state, record_state::parked);

  auto r = ctl({"--json", "show", scope_, "order"});
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.parsed()["recovery_point"].get<std::string>().find("authorise"), std::string::npos);
  EXPECT_EQ(r.parsed()["history"][0]["step"], "reserve");
  r = ctl({"show", scope_, "order"});  // the human form names the step too
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find(", step reserve"), std::string::npos) << r.out;
  EXPECT_EQ(ctl({"cancel", scope_, "order"}).code, 2) << "--note is required";
  EXPECT_EQ(ctl({"cancel", scope_, "nobody", "--note", "x"}).code, 1);
  r = ctl({"--json", "cancel", scope_, "order", "--note", "customer asked"});
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.parsed()["result"], "done");
  EXPECT_EQ(ctl({"cancel", scope_, "order", "--note", "again"}).code, 3) << "going backwards";
  const auto cancelled = run("order");
  EXPECT_EQ(cancelled.status, 409);
  EXPECT_EQ(calls, (std::vector<std::string>{"authorise#1", "reserve#1", "void#2"}));
  EXPECT_EQ(ctl({"cancel", scope_, "order", "--note", "x"}).code, 3) << "finished";

  // Past the pivot (the last step here): nothing to cancel.
  capture_down = false;
  EXPECT_EQ(run("paid").status, 201);
  r = ctl({"--json", "cancel", scope_, "paid", "--note", "x"});
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_EQ(store_->inspect(id("paid"))->state, record_state::succeeded);
}

INSTANTIATE_TEST_SUITE_P(Backends, Orpheusctl, testing::Values("sqlite", "mysql"),
                         test::backend_name);

// The schema check is the same code for both backends; shown on SQLite.
TEST(OrpheusctlStore, RefusesAStoreThatIsNotMigratedAndCreatesNoFile) {
  const auto dir = std::filesystem::temp_directory_path() / ("orpheusctl-" + test::random_hex());
  std::filesystem::create_directories(dir);
  { sqlite_store fresh(sqlite_options{(dir / "old.db").string()}); }  // schema version 0
  const auto old = run_ctl("sqlite:" + (dir / "old.db").string(), {"stats"});
  EXPECT_EQ(old.code, 4);
  EXPECT_EQ(run_ctl("sqlite:" + (dir / "missing.db").string(), {"stats"}).code, 2);
  EXPECT_FALSE(std::filesystem::exists(dir / "missing.db")) << "only migrate creates a file";
  const auto migrated = run_ctl("sqlite:" + (dir / "old.db").string(), {"--json", "migrate"});
  ASSERT_EQ(migrated.code, 0);
  EXPECT_EQ(migrated.parsed()["schema_version"][0], 6);
  EXPECT_EQ(run_ctl("sqlite:" + (dir / "old.db").string(), {"stats"}).code, 0);
  // Found in review: another application's database (rollback journal) was
  // switched to WAL for good by a read-only command, before it was refused.
  const auto other = (dir / "other.db").string();
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(other.c_str(), &db), SQLITE_OK);
    ASSERT_EQ(
        sqlite3_exec(db, "CREATE TABLE orders (id INTEGER PRIMARY KEY)", nullptr, nullptr, nullptr),
        SQLITE_OK);
    sqlite3_close(db);
  }
  const auto journal_mode_byte = [&] {  // the file header's read version: 1 rollback, 2 WAL
    std::ifstream f(other, std::ios::binary);
    f.seekg(18);
    return f.get();
  };
  ASSERT_EQ(journal_mode_byte(), 1);
  for (const char* command : {"stats", "purge"}) {
    const auto refused = run_ctl("sqlite:" + other, {command}, /*with_stderr=*/true);
    EXPECT_EQ(refused.code, 4) << command;
    EXPECT_NE(refused.out.find("not an Orpheus database"), std::string::npos) << refused.out;
    EXPECT_EQ(journal_mode_byte(), 1) << command << " changed the file's journal mode";
  }
  // A bad key is bad usage (2), even when the database cannot be reached
  // (found in review: it was checked after opening the store).
  EXPECT_EQ(run_ctl("mysql://u:p@127.0.0.1:1/d", {"show", "s", " bad key"}).code, 2);
  // So is a resolve without --status (found in review: exit 4, "retryable",
  // after the connection failed).
  const auto no_status =
      run_ctl("mysql://u:p@127.0.0.1:1/d", {"resolve", "s", "k", "--note", "x"}, true);
  EXPECT_EQ(no_status.code, 2) << no_status.out;
  EXPECT_NE(no_status.out.find("--status is required"), std::string::npos) << no_status.out;
}

// The shard map: migrate refuses another order (bad input, 2: nothing
// changed), every command of that order is refused (4, retryable), and
// adopt-shard-map makes it the recorded one. Two scratch databases of their
// own: the test servers' databases are shared with other tests.
TEST(OrpheusctlStore, RefusesAnotherShardMapAndAdoptsOneOnlyWhenAsked) {
  const auto dir = std::filesystem::temp_directory_path() / ("orpheusctl-" + test::random_hex());
  std::filesystem::create_directories(dir);
  const test::scratch_store a("mysql", dir, "ctl_map_");
  const test::scratch_store b("mysql", dir, "ctl_map_");
  const std::string ab = a.url() + "," + b.url();
  const std::string ba = b.url() + "," + a.url();
  EXPECT_EQ(run_ctl(ab, {"migrate"}).code, 0);
  EXPECT_EQ(run_ctl(ab, {"stats"}).code, 0);
  EXPECT_EQ(run_ctl(ba, {"migrate"}).code, 2);
  // Running it again as such does not help (found in a session's notes: the
  // advice said "run it again", as for a database that did not answer).
  const auto refused = run_ctl(ba, {"stats"}, true);
  EXPECT_EQ(refused.code, 4);
  EXPECT_NE(refused.out.find("records itself as shard"), std::string::npos) << refused.out;
  EXPECT_NE(refused.out.find("once the cause above is put right"), std::string::npos)
      << refused.out;
  EXPECT_EQ(run_ctl(ab, {"stats"}).code, 0) << "a refused migrate changed the recorded map";
  const auto adopted = run_ctl(ba, {"--json", "adopt-shard-map"});
  ASSERT_EQ(adopted.code, 0) << adopted.out;
  EXPECT_EQ(adopted.parsed()["shard_count"], 2);
  EXPECT_EQ(run_ctl(ba, {"stats"}).code, 0);
  EXPECT_EQ(run_ctl(ab, {"stats"}).code, 4);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace orpheus
