// Lists of stores as the command-line programs take them (--store): one
// "sqlite:PATH", or one mysql:// URL per shard, separated by commas in one
// value or given as several values. One parser, so that orpheusctl and the
// servers read a list the same way.
#pragma once

#include <string>
#include <vector>

namespace orpheus {

/// Splits --store values into one entry per store: "sqlite:PATH" or a
/// mysql:// URL. A comma before "sqlite:" or "mysql://" starts the next
/// store; any other comma belongs to the mysql:// URL before it, while that
/// URL is still in its password or its hosts (the nodes of one shard:
/// "mysql://u:p@h1,h2:3307/db"). Throws config_error, naming the part, on an
/// empty value or part, white space or a control character, or a part that
/// is neither: found in review, "mysql://u:p@h1/d, mysql://u:p@h2/d" (a
/// space after the comma) was read as one shard whose password was most of
/// the text. No values: an empty list. What each entry says is checked by
/// the store that opens it (parse_mysql_url()).
[[nodiscard]] std::vector<std::string> split_store_list(const std::vector<std::string>& values);

}  // namespace orpheus
