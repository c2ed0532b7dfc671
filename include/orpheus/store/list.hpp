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
/// store; any other comma belongs to the mysql:// URL before it while that
/// URL is still in its password or its hosts (the nodes of one shard,
/// "mysql://u:p@h1,h2:3307/db"), and parse_mysql_url() then checks the
/// whole. A password with a comma after a '/' and before its last '@' is
/// refused: it cannot be told from a mistake. Throws config_error, naming
/// the part with any user and password left out, on an empty value or
/// part, a control character, white space at either end of a part, or a
/// part that is none of those: found in review, "mysql://u:p@h1/d,
/// mysql://u:p@h2/d" (a space after the comma) was read as one shard whose
/// password was most of the text. No values: an empty list.
[[nodiscard]] std::vector<std::string> split_store_list(const std::vector<std::string>& values);

}  // namespace orpheus
