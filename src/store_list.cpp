#include "orpheus/store/list.hpp"

#include <algorithm>
#include <string_view>

#include "orpheus/error.hpp"

namespace orpheus {
namespace {

constexpr std::string_view mysql_scheme = "mysql://";
constexpr std::string_view sqlite_scheme = "sqlite:";

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

// A mysql:// URL whose password or host list a comma may still continue:
// no '@' yet, or no '/' (the database) after the last one.
bool still_listing(std::string_view url) {
  if (!starts_with(url, mysql_scheme)) return false;
  const auto at = url.rfind('@');
  return at == std::string_view::npos || url.find('/', at) == std::string_view::npos;
}

}  // namespace

std::vector<std::string> split_store_list(const std::vector<std::string>& values) {
  std::vector<std::string> parts;
  for (const std::string& value : values) {
    const auto bad = [&](const std::string& why) {
      std::string what = "--store '";
      what.append(value).append("': ").append(why).append(
          "; want one sqlite:PATH, or mysql://user:password@host[:port]/database URLs separated "
          "by commas (one per shard)");
      return config_error(what);
    };
    if (value.empty()) throw bad("empty");
    if (std::any_of(value.begin(), value.end(),
                    [](unsigned char c) { return c <= ' ' || c == 0x7f; })) {
      throw bad("white space or a control character");
    }
    std::string_view rest = value;
    for (;;) {
      const auto comma = rest.find(',');
      const std::string_view piece = rest.substr(0, comma);
      if (piece.empty()) throw bad("an empty part");
      if (starts_with(piece, mysql_scheme) || starts_with(piece, sqlite_scheme)) {
        parts.emplace_back(piece);
      } else if (!parts.empty() && still_listing(parts.back()) &&
                 piece.find("://") == std::string_view::npos) {
        parts.back().append(",").append(piece);
      } else {
        throw bad("'" + std::string(piece) +
                  "' is neither sqlite:PATH, a mysql:// URL nor a host of the URL before it");
      }
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
  }
  return parts;
}

}  // namespace orpheus
