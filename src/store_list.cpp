#include "orpheus/detail/ascii.hpp"
#include "orpheus/store/list.hpp"

#include <algorithm>
#include <string_view>

#include "orpheus/error.hpp"

namespace orpheus {
namespace {

constexpr std::string_view mysql_scheme = "mysql://";
constexpr std::string_view sqlite_scheme = "sqlite:";

// `part` for a message: a URL's user and password left out (found in
// review: the whole value, password too, went to stderr).
std::string shown(std::string_view part) {
  const auto scheme = part.find("://");
  const auto at = part.rfind('@');
  if (scheme == std::string_view::npos || at == std::string_view::npos || at < scheme) {
    return std::string(part);
  }
  return std::string(part.substr(0, scheme + 3)) + "...@" + std::string(part.substr(at + 1));
}

// A mysql:// URL whose password or host list a comma may still continue:
// no '@' yet, or no '/' (the database) after the last one.
bool still_listing(std::string_view url) {
  if (!url.starts_with(mysql_scheme)) return false;
  const auto at = url.rfind('@');
  return at == std::string_view::npos || url.find('/', at) == std::string_view::npos;
}

}  // namespace

std::vector<std::string> split_store_list(const std::vector<std::string>& values) {
  std::vector<std::string> parts;
  for (const std::string& value : values) {
    const auto bad = [&](std::string_view part, const char* why) {
      std::string what = "--store '";
      what.append(shown(part))
          .append("': ")
          .append(why)
          .append(
              "; want one sqlite:PATH, or mysql://user:password@host[:port]/database URLs "
              "separated "
              "by commas (one per shard)");
      return config_error(what);
    };
    if (value.empty()) throw bad(value, "empty");
    if (std::any_of(value.begin(), value.end(),
                    [](unsigned char c) { return c < ' ' || c == 0x7f; })) {
      throw bad(value, "a control character");
    }
    std::string_view rest = value;
    for (;;) {
      const auto comma = rest.find(',');
      const std::string_view piece = rest.substr(0, comma);
      if (piece.empty()) throw bad(value, "an empty part");
      // Found in review: "mysql://u:p@h1/d, mysql://u:p@h2/d" (a space after
      // the comma) was one shard whose password was most of the text.
      if (detail::is_ascii_space(piece.front()) || detail::is_ascii_space(piece.back())) {
        throw bad(piece, "white space around a part");
      }
      if (piece.starts_with(mysql_scheme) || piece.starts_with(sqlite_scheme)) {
        parts.emplace_back(piece);
      } else if (!parts.empty() && still_listing(parts.back()) &&
                 piece.find("://") == std::string_view::npos) {
        // A comma inside a mysql:// URL: between the nodes of one shard
        // ("mysql://u:p@h1,h2:3307/db"), or in its password before the '@'.
        // After its database, text is a mistake ("mysql:/u:p@h2/db" would
        // read as a password), never glued on.
        parts.back().append(",").append(piece);
      } else {
        throw bad(piece, "neither sqlite:PATH, a mysql:// URL nor a part of the URL before it");
      }
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
  }
  return parts;
}

}  // namespace orpheus
