#include "orpheus/detail/record_row.hpp"

#include <charconv>
#include <nlohmann/json.hpp>

#include "orpheus/error.hpp"

namespace orpheus::detail {
namespace {

std::string text_or_empty(const sql_value& v) {
  const auto* s = std::get_if<std::string>(&v);
  return s ? *s : std::string{};
}

std::int64_t int_or_zero(const sql_value& v) {
  if (const auto* n = std::get_if<std::int64_t>(&v)) return *n;
  if (const auto* s = std::get_if<std::string>(&v)) {  // DECIMAL arrives as text
    std::int64_t out = 0;
    std::from_chars(s->data(), s->data() + s->size(), out);
    return out;
  }
  return 0;
}

}  // namespace

record record_from_row(const sql_row& row, bool full) {
  const auto& v = row.values;
  record out;
  out.state = static_cast<record_state>(int_or_zero(v.at(0)));
  out.fingerprint = text_or_empty(v[1]);
  out.attempts = static_cast<int>(int_or_zero(v[2]));
  out.lease_owner = text_or_empty(v[3]);
  out.lease_expires_us = int_or_zero(v[4]);
  out.recorded.status = static_cast<int>(int_or_zero(v[5]));
  const std::string headers = text_or_empty(v[6]);
  if (!headers.empty()) {
    // A column that is not the JSON finish() writes (a corrupt or hand-edited
    // row) is an unreadable row, reported as the store's contract says.
    // Issue 9 (fuzzing): nlohmann's parse_error or type_error came out of
    // store::read() and manager::process(), which promise orpheus::error.
    try {
      out.recorded.headers =
          nlohmann::json::parse(headers).get<std::vector<std::pair<std::string, std::string>>>();
    } catch (const nlohmann::json::exception& e) {
      throw storage_error::permanent(std::string("unreadable orpheus_records row (headers: ") +
                                     e.what() + ")");
    }
  }
  out.recorded.body = text_or_empty(v[7]);
  out.db_now_us = int_or_zero(v.at(8));
  if (full) {
    out.pre_state = text_or_empty(v.at(9));
    out.recovery_point = text_or_empty(v[10]);
    out.last_error = text_or_empty(v[11]);
    out.created_us = int_or_zero(v[12]);
    out.updated_us = int_or_zero(v[13]);
    out.retry_until_us = int_or_zero(v[14]);
    out.expires_us = int_or_zero(v.at(15));
  }
  return out;
}

}  // namespace orpheus::detail
