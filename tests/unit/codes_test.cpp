// The registry of error codes (orpheus/codes.hpp) against docs/errors.md and
// against the sources: one list of what clients may see, kept true.
#include "orpheus/codes.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "orpheus/error.hpp"
#include "orpheus/problem.hpp"

namespace orpheus {
namespace {

std::string read(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// One row of the table under "## Codes the library produces".
struct documented {
  std::string status;  ///< the "status" cell
  std::string retry;   ///< the "retryable" cell
};

std::string trimmed(std::string s) {
  s.erase(0, s.find_first_not_of(' '));
  s.erase(s.find_last_not_of(' ') + 1);
  return s;
}

// Each code named in a row's first cell, with the row's other two cells.
std::map<std::string, documented> documented_codes() {
  const std::string doc = read(std::filesystem::path(ORPHEUS_SOURCE_DIR) / "docs/errors.md");
  const auto at = doc.find("## Codes the library produces");
  EXPECT_NE(at, std::string::npos);
  std::map<std::string, documented> out;
  std::istringstream lines(doc.substr(at));
  std::string line;
  const std::regex code_in_cell("`([a-z_]+)`");
  while (std::getline(lines, line)) {
    if (!line.starts_with("| `")) continue;
    const auto first_bar = line.find('|', 1);
    const auto last_bar = line.rfind('|');
    const auto retry_bar = line.rfind('|', last_bar - 1);
    const std::string first = line.substr(1, first_bar - 1);
    const documented row{trimmed(line.substr(first_bar + 1, retry_bar - first_bar - 1)),
                         trimmed(line.substr(retry_bar + 1, last_bar - retry_bar - 1))};
    for (std::sregex_iterator it(first.begin(), first.end(), code_in_cell), end; it != end; ++it) {
      EXPECT_TRUE(out.emplace((*it)[1], row).second) << "listed twice: " << (*it)[1];
    }
  }
  return out;
}

TEST(Codes, EachCodeIsRegisteredOnce) {
  std::set<std::string_view> seen;
  for (const auto& c : known_codes()) {
    EXPECT_TRUE(seen.insert(c.code).second) << c.code;
    ASSERT_NE(find_code(c.code), nullptr);
    EXPECT_EQ(find_code(c.code)->code, c.code);
  }
  EXPECT_EQ(find_code("no_such_code"), nullptr);
  EXPECT_GE(seen.size(), 30U);
}

// Every name in orpheus::codes is in the registry (the header is read: C++
// cannot list a namespace's constants).
TEST(Codes, EveryNamedCodeIsInTheRegistry) {
  const std::string header =
      read(std::filesystem::path(ORPHEUS_SOURCE_DIR) / "include/orpheus/codes.hpp");
  const std::regex named(R"re(inline constexpr std::string_view [a-z_]+ = "([a-z_]+)";)re");
  int n = 0;
  for (std::sregex_iterator it(header.begin(), header.end(), named), end; it != end; ++it, ++n) {
    EXPECT_NE(find_code((*it)[1].str()), nullptr) << (*it)[1];
  }
  EXPECT_EQ(n, static_cast<int>(known_codes().size()));
}

TEST(Codes, DocsErrorsMdListsExactlyTheRegistryWithItsRetryClass) {
  const auto docs = documented_codes();
  for (const auto& c : known_codes()) {
    const auto it = docs.find(std::string(c.code));
    if (it == docs.end()) {
      ADD_FAILURE() << c.code << " is not in docs/errors.md";
      continue;
    }
    const std::string& retry = it->second.retry;
    if (retry.starts_with("per ")) continue;  // unclassified_error: configurable
    EXPECT_EQ(retry.starts_with("yes"), retryable(c.usual)) << c.code << ": " << retry;
    EXPECT_EQ(retry.starts_with("yes, in doubt"), c.usual == error_class::in_doubt)
        << c.code << ": " << retry;
  }
  for (const auto& [code, row] : docs) {
    EXPECT_NE(find_code(code), nullptr) << code << " is in docs/errors.md, not in the registry";
  }
}

// The status column of docs/errors.md is what http_status_of() answers for
// each code as the library emits it (its usual class, no status of its own).
// Rows whose status is "the handler's ..." pass on a status the library did
// not choose.
TEST(Codes, DocsErrorsMdStatusIsHttpStatusOf) {
  const auto docs = documented_codes();
  int checked = 0;
  for (const auto& c : known_codes()) {
    const auto it = docs.find(std::string(c.code));
    if (it == docs.end() || it->second.status.starts_with("the handler's")) continue;
    const int documented_status = std::stoi(it->second.status);
    EXPECT_EQ(http_status_of(error_info::of(c.usual, c.code, "m")), documented_status)
        << c.code << ": " << it->second.status;
    ++checked;
  }
  EXPECT_GE(checked, 30);
}

// The one HTTP mapping: a status a handler chose wins, except that a
// retryable failure never gets a 4xx a client would not retry.
TEST(Codes, HttpStatusOfHonoursTheHandlersStatus) {
  EXPECT_EQ(http_status_of(error_info::of(error_class::rejected, "card_refused", "m")), 422);
  EXPECT_EQ(http_status_of(non_retryable_error("card_refused", "m", 402).info()), 402);
  EXPECT_EQ(http_status_of(retryable_error("busy", "m", 429).info()), 429);
  EXPECT_EQ(http_status_of(retryable_error("busy", "m", 409).info()), 409);
  EXPECT_EQ(http_status_of(retryable_error("odd", "m", 404).info()), 503);
  EXPECT_EQ(http_status_of(retryable_error("bad_gateway", "m", 502).info()), 502);
  // Found in review: clients do not retry 501, and take 429 for "not acted
  // on": a retryable 501, or an in-doubt 429, goes out as 503.
  EXPECT_EQ(http_status_of(retryable_error("odd", "m", 501).info()), 503);
  EXPECT_EQ(
      http_status_of(error_info::of(error_class::in_doubt, "bank_busy", "m").with_http_status(501)),
      503);
  EXPECT_EQ(
      http_status_of(error_info::of(error_class::in_doubt, "bank_busy", "m").with_http_status(429)),
      503);
  EXPECT_EQ(http_status_of(non_retryable_error("odd", "m", 501).info()), 501);
  // A library code's own status goes with the class the library gives it: a
  // handler's final failure named gateway_error is not a 502 (found in review).
  EXPECT_EQ(http_status_of(non_retryable_error(codes::gateway_error, "m").info()), 422);
  EXPECT_EQ(http_status_of(error_info::of(error_class::in_doubt, codes::gateway_error, "m")), 502);
  EXPECT_EQ(http_status_of(error_info::of(error_class::internal, codes::unauthenticated, "m")),
            500);
  // A failure is never answered as a success, nor with a status HTTP has not.
  EXPECT_EQ(http_status_of(non_retryable_error("odd", "m", 200).info()), 422);
  EXPECT_EQ(http_status_of(non_retryable_error("odd", "m", 0).info()), 422);
  EXPECT_EQ(http_status_of(non_retryable_error("odd", "m", 1000).info()), 422);
  const response r =
      problem_response(error_info::of(error_class::in_doubt, codes::gateway_timeout, "no answer"));
  EXPECT_EQ(r.status, 504);
  EXPECT_EQ(
      r.body,
      R"({"code":"gateway_timeout","detail":"no answer","in_doubt":true,"retryable":true,)"
      R"("status":504,"title":"gateway_timeout","type":"urn:orpheus:error:gateway_timeout"})");
}

// Library code names its codes (codes::x): a string literal where a code
// goes is a code the registry and the docs do not know. And it makes errors
// with error_info::of(), never as error_info{status, code, message, bool,
// bool, ...}, whose two flags compile when swapped.
TEST(Codes, LibraryCodeNamesItsCodes) {
  const std::regex literal_code(
      R"((retryable_error|bad_input_error|bad_request|unknown_outcome|refused|not_yet)\s*\(\s*(\d+\s*,\s*)?")"
      R"(|error_info::of\s*\([^,]*,\s*")"
      // and errors are made by error_info::of(), never field by field
      R"(|(\(|=|return|,)\s*error_info\s*\{\s*[^}\s])");
  const std::filesystem::path root(ORPHEUS_SOURCE_DIR);
  int files = 0;
  for (const char* dir : {"src", "adapters", "include"}) {
    for (const auto& f : std::filesystem::recursive_directory_iterator(root / dir)) {
      const auto ext = f.path().extension();
      if (ext != ".cpp" && ext != ".hpp") continue;
      ++files;
      const std::string text = read(f.path());
      std::smatch m;
      if (std::regex_search(text, m, literal_code)) {
        ADD_FAILURE() << f.path() << ": a code as a string literal: " << m.str();
      }
    }
  }
  EXPECT_GT(files, 40);
}

// The factory sets the two flags from the class: they cannot be swapped.
TEST(Codes, ErrorInfoOfDerivesTheFlagsFromTheClass) {
  const auto doubt = error_info::of(error_class::in_doubt, codes::gateway_timeout, "m");
  EXPECT_TRUE(doubt.retryable());
  EXPECT_TRUE(doubt.in_doubt());
  EXPECT_EQ(doubt.code, "gateway_timeout");
  const auto busy = error_info::of(error_class::conflict, codes::in_progress, "m");
  EXPECT_TRUE(busy.retryable());
  EXPECT_FALSE(busy.in_doubt());
  EXPECT_EQ(busy.kind, error_class::conflict);
  EXPECT_EQ(busy.http_status, std::nullopt) << "the core chooses no HTTP status";
  for (auto c : {error_class::invalid_input, error_class::rejected, error_class::internal}) {
    const auto e = error_info::of(c, codes::invalid_key, "m");
    EXPECT_FALSE(e.retryable()) << to_string(c);
    EXPECT_FALSE(e.in_doubt()) << to_string(c);
    EXPECT_EQ(e.retry_after, std::nullopt) << to_string(c);
  }
  const auto e = error_info::of(error_class::unavailable, codes::overloaded, "m")
                     .with_http_status(502)
                     .with_retry_after(std::nullopt)
                     .with_internal("detail");
  EXPECT_EQ(e.http_status, std::optional<int>(502));
  EXPECT_EQ(e.retry_after, std::nullopt);
  EXPECT_EQ(e.internal, "detail");
  EXPECT_EQ(error(e).what(), std::string("detail"));
}

}  // namespace
}  // namespace orpheus
