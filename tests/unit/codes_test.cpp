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

namespace orpheus {
namespace {

std::string read(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The rows of the table under "## Codes the library produces": each code
// named in a row's first cell, with the row's "retryable" cell.
std::map<std::string, std::string> documented_codes() {
  const std::string doc = read(std::filesystem::path(ORPHEUS_SOURCE_DIR) / "docs/errors.md");
  const auto at = doc.find("## Codes the library produces");
  EXPECT_NE(at, std::string::npos);
  std::map<std::string, std::string> out;
  std::istringstream lines(doc.substr(at));
  std::string line;
  const std::regex code_in_cell("`([a-z_]+)`");
  while (std::getline(lines, line)) {
    if (!line.starts_with("| `")) continue;
    const auto first_bar = line.find('|', 1);
    const auto last_bar = line.rfind('|');
    const auto retry_bar = line.rfind('|', last_bar - 1);
    const std::string first = line.substr(1, first_bar - 1);
    std::string retry = line.substr(retry_bar + 1, last_bar - retry_bar - 1);
    retry.erase(0, retry.find_first_not_of(' '));
    for (std::sregex_iterator it(first.begin(), first.end(), code_in_cell), end; it != end; ++it) {
      EXPECT_TRUE(out.emplace((*it)[1], retry).second) << "listed twice: " << (*it)[1];
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
    const std::string& retry = it->second;
    if (retry.starts_with("per ")) continue;  // unclassified_error: configurable
    EXPECT_EQ(retry.starts_with("yes"), retryable(c.usual)) << c.code << ": " << retry;
    EXPECT_EQ(retry.starts_with("yes, in doubt"), c.usual == error_class::in_doubt)
        << c.code << ": " << retry;
  }
  for (const auto& [code, retry] : docs) {
    EXPECT_NE(find_code(code), nullptr) << code << " is in docs/errors.md, not in the registry";
  }
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
  EXPECT_TRUE(doubt.retryable);
  EXPECT_TRUE(doubt.in_doubt);
  EXPECT_EQ(doubt.code, "gateway_timeout");
  const auto busy = error_info::of(error_class::conflict, codes::in_progress, "m");
  EXPECT_TRUE(busy.retryable);
  EXPECT_FALSE(busy.in_doubt);
  EXPECT_EQ(busy.http_status, 409);
  for (auto c : {error_class::invalid_input, error_class::rejected, error_class::internal}) {
    const auto e = error_info::of(c, codes::invalid_key, "m");
    EXPECT_FALSE(e.retryable) << to_string(c);
    EXPECT_FALSE(e.in_doubt) << to_string(c);
    EXPECT_EQ(e.retry_after, std::nullopt) << to_string(c);
  }
  const auto e = error_info::of(error_class::unavailable, codes::overloaded, "m")
                     .with_status(502)
                     .with_retry_after(std::nullopt)
                     .with_internal("detail");
  EXPECT_EQ(e.http_status, 502);
  EXPECT_EQ(e.retry_after, std::nullopt);
  EXPECT_EQ(e.internal, "detail");
  EXPECT_EQ(error(e).what(), std::string("detail"));
}

}  // namespace
}  // namespace orpheus
