// Schema migrations shipped inside the library (generated from schema/<backend>
// at build time), and the statement splitter both backends use.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace orpheus::detail {

struct migration {
  int version;
  std::string_view name;
  std::string_view sql;
};

/// Splits a migration file into statements at `;` ending a line. Our schema
/// files keep semicolons out of literals and comments, so this is enough.
/// Lines starting with `--` are dropped.
std::vector<std::string> split_statements(std::string_view sql);

}  // namespace orpheus::detail
