#include "orpheus/detail/migration.hpp"

namespace orpheus::detail {

std::vector<std::string> split_statements(std::string_view sql) {
  std::vector<std::string> out;
  std::string current;
  while (!sql.empty()) {
    const auto eol = sql.find('\n');
    std::string_view line = sql.substr(0, eol);
    sql = eol == std::string_view::npos ? std::string_view{} : sql.substr(eol + 1);
    const auto first = line.find_first_not_of(" \t\r");
    if (first == std::string_view::npos || line.substr(first, 2) == "--") continue;
    const auto last = line.find_last_not_of(" \t\r");
    line = line.substr(0, last + 1);
    current.append(line).push_back('\n');
    if (line.back() == ';') {
      current.erase(current.size() - 2);  // drop ";\n"
      out.push_back(std::move(current));
      current.clear();
    }
  }
  if (current.find_first_not_of(" \t\r\n") != std::string::npos) {
    out.push_back(std::move(current));
  }
  return out;
}

}  // namespace orpheus::detail
