// Kills a real payment process with SIGKILL at each point of a request, then
// retries from a new process, on SQLite and on MariaDB: the payment is
// recorded once and the bank charged once, whatever the crash point.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "support/backends.hpp"
#include "support/process.hpp"

namespace orpheus {
namespace {

struct crash_case {
  std::string backend;
  std::string point;
  bool steps = false;     ///< the three-step request of crash_child
  bool declined = false;  ///< ... whose capture is declined: it turns back
};

std::string case_name(const testing::TestParamInfo<crash_case>& p) {
  return p.param.backend +
         (p.param.declined ? "_declined_"
          : p.param.steps  ? "_steps_"
                           : "_") +
         p.param.point;
}

class Crash : public testing::TestWithParam<crash_case> {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("orpheus-crash-" + test::random_hex());
    std::filesystem::create_directories(dir_);
    if (GetParam().backend == "sqlite") {
      store_arg_ = "sqlite:" + (dir_ / "orpheus.db").string();
    } else {
      const auto urls = test::mysql_urls();
      ASSERT_FALSE(urls.empty()) << "ORPHEUS_TEST_MYSQL is not set; run scripts/test";
      store_arg_ = urls[0];
    }
    ledger_ = (dir_ / "bank-ledger").string();
    scope_ = "crash-" + test::random_hex();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::vector<std::string> args(const std::string& crash_at) const {
    std::vector<std::string> out = {ORPHEUS_BINARY_DIR "/tests/orpheus_crash_child",
                                    store_arg_,
                                    scope_,
                                    "key-1",
                                    ledger_,
                                    crash_at};
    if (GetParam().steps) out.emplace_back(GetParam().declined ? "declined" : "steps");
    return out;
  }

  // Lines of `file` that start with `prefix`.
  static int lines_of(const std::string& file, const std::string& prefix = {}) {
    std::ifstream in(file);
    int n = 0;
    for (std::string line; std::getline(in, line);) {
      n += !line.empty() && line.rfind(prefix, 0) == 0 ? 1 : 0;
    }
    return n;
  }
  int charges() const { return lines_of(ledger_); }
  // What the application's row says, read by a child ("ROW charged"): the
  // Post-RPC SQL commits with the record, or neither does (found in review:
  // nothing read it, so a record committed without its Post-RPC passed).
  std::string app_row() const {
    test::child_process reader(args("row"));
    const auto line = reader.read_line(std::chrono::seconds(30)).value_or("<nothing>");
    EXPECT_EQ(reader.wait(), 0) << line;
    return line;
  }

  // Kills a child at the crash point, then retries from new processes until
  // one gets an answer; returns that answer.
  std::string crash_then_retry(const std::string& point) {
    {
      test::child_process doomed(args(point));
      const auto line = doomed.read_line(std::chrono::seconds(30));
      EXPECT_EQ(line.value_or("<nothing>"), "AT " + point);
      doomed.kill_hard();
    }
    for (int i = 0; i < 40; ++i) {
      test::child_process retry(args("none"));
      const auto line = retry.read_line(std::chrono::seconds(30)).value_or("<nothing>");
      const int rc = retry.wait();
      if (rc == 0) return line;
      EXPECT_EQ(rc, 3) << line;
      EXPECT_NE(line.find("RETRYABLE 1"), std::string::npos) << line;
      if (rc != 3) return {};
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return {};
  }

  std::filesystem::path dir_;
  std::string store_arg_, ledger_, scope_;
};

TEST_P(Crash, KilledProcessIsRetriedToExactlyOneCharge) {
  const std::string point = GetParam().point;
  if (GetParam().declined) {
    // docs/steps.md: the way back is recorded before the compensations
    // start, so a crash during one resumes the compensations, never the
    // steps. The capture is declined once, the authorisation voided once,
    // and the decline recorded and replayed.
    const std::string final_line = crash_then_retry(point);
    ASSERT_FALSE(final_line.empty()) << "the retry never got an answer";
    EXPECT_EQ(final_line.rfind("STATUS 402 REPLAYED 0", 0), 0U) << final_line;
    const std::string calls = ledger_ + ".calls";
    EXPECT_EQ(lines_of(calls, "authorise "), 1) << "a step ran again on the way back";
    EXPECT_EQ(lines_of(calls, "capture "), 1) << "a step ran again on the way back";
    EXPECT_EQ(lines_of(calls, "notify "), 0);
    EXPECT_EQ(lines_of(calls, "void "), 2) << "the void was not resumed after the crash";
    EXPECT_EQ(lines_of(ledger_, "authorise "), 1);
    EXPECT_EQ(lines_of(ledger_, "void "), 1) << "voided " << lines_of(ledger_, "void ") << " times";
    EXPECT_EQ(charges(), 2);
    test::child_process again(args("none"));
    EXPECT_EQ(again.read_line(std::chrono::seconds(30)).value_or(""),
              "STATUS 402 REPLAYED 1 RETRY 0");
    EXPECT_EQ(again.wait(), 0);
    EXPECT_EQ(lines_of(calls, "void "), 2) << "a replay called the bank";
    return;
  }
  if (GetParam().steps) {
    // A crash between any two steps (or inside one) resumes at the right
    // step: every operation reaches the bank once, and no step that
    // committed is called again.
    const std::string final_line = crash_then_retry(point);
    ASSERT_FALSE(final_line.empty()) << "the retry never got an answer";
    EXPECT_EQ(final_line.rfind("STATUS 201 REPLAYED ", 0), 0U) << final_line;
    for (const char* op : {"authorise ", "capture ", "notify "}) {
      EXPECT_EQ(lines_of(ledger_, op), 1)
          << op << "reached the bank " << lines_of(ledger_, op) << " times";
    }
    const std::string calls = ledger_ + ".calls";
    // Committed before the crash point: never called again.
    const std::vector<std::pair<std::string, std::string>> committed_before = {
        {"before_capture", "authorise "}, {"after_capture", "authorise "},
        {"before_notify", "authorise "},  {"before_notify", "capture "},
        {"after_notify", "authorise "},   {"after_notify", "capture "},
        {"after_commit", "authorise "},   {"after_commit", "capture "},
        {"after_commit", "notify "}};
    for (const auto& [at, op] : committed_before) {
      if (at == point) {
        EXPECT_EQ(lines_of(calls, op), 1) << op << "ran again after " << at;
      }
    }
    test::child_process again(args("none"));
    EXPECT_EQ(again.read_line(std::chrono::seconds(30)).value_or(""),
              "STATUS 201 REPLAYED 1 RETRY 0");
    EXPECT_EQ(again.wait(), 0);
    EXPECT_EQ(charges(), 3);
    EXPECT_EQ(app_row(), "ROW notify") << "the last step's SQL did not commit with its record";
    return;
  }
  {
    test::child_process doomed(args(point));
    const auto line = doomed.read_line(std::chrono::seconds(30));
    ASSERT_EQ(line.value_or("<nothing>"), "AT " + point);
    doomed.kill_hard();
  }
  const int charged_before_retry = charges();

  // The client retries with the same key until it gets an answer: 409 while
  // the dead process's lease is live, then a take-over (or a replay).
  std::string final_line;
  for (int i = 0; i < 40; ++i) {
    test::child_process retry(args("none"));
    const auto line = retry.read_line(std::chrono::seconds(30)).value_or("<nothing>");
    const int rc = retry.wait();
    if (rc == 0) {
      final_line = line;
      break;
    }
    ASSERT_EQ(rc, 3) << line;
    ASSERT_NE(line.find("RETRYABLE 1"), std::string::npos) << line;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  ASSERT_FALSE(final_line.empty()) << "the retry never got an answer";
  EXPECT_EQ(charges(), 1) << "the bank was charged " << charges() << " times";

  if (point == "before_charge") {
    EXPECT_EQ(charged_before_retry, 0);
    EXPECT_EQ(final_line, "STATUS 201 REPLAYED 0 RETRY 1");
  } else if (point == "after_commit") {
    EXPECT_EQ(final_line, "STATUS 201 REPLAYED 1 RETRY 0");
  } else {  // charged, not recorded: the retry asks the bank and records once
    EXPECT_EQ(charged_before_retry, 1);
    EXPECT_EQ(final_line, "STATUS 201 REPLAYED 0 RETRY 1");
  }

  // And one more retry is a replay.
  test::child_process again(args("none"));
  EXPECT_EQ(again.read_line(std::chrono::seconds(30)).value_or(""),
            "STATUS 201 REPLAYED 1 RETRY 0");
  EXPECT_EQ(again.wait(), 0);
  EXPECT_EQ(charges(), 1);
  EXPECT_EQ(app_row(), "ROW charged");
}

std::vector<crash_case> all_cases() {
  std::vector<crash_case> out;
  for (const char* b : {"sqlite", "mysql"}) {
    for (const char* p : {"before_charge", "after_charge", "in_post", "after_commit"}) {
      out.push_back({b, p, false});
    }
    for (const char* p : {"before_authorise", "after_authorise", "before_capture", "after_capture",
                          "before_notify", "after_notify", "after_commit"}) {
      out.push_back({b, p, true});
    }
    for (const char* p : {"before_void", "after_void"}) out.push_back({b, p, true, true});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Points, Crash, testing::ValuesIn(all_cases()), case_name);

}  // namespace
}  // namespace orpheus
