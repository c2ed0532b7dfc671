#include "orpheus/detail/record_row.hpp"

#include <charconv>
#include <nlohmann/json.hpp>

#include "orpheus/error.hpp"

namespace orpheus::detail {
namespace {

[[noreturn]] void unreadable_row(std::string_view why) {
  throw storage_error::permanent("unreadable orpheus_records row (" + std::string(why) + ")");
}

record_state state_of(std::int64_t n) {
  if (n < static_cast<int>(record_state::in_progress) ||
      n > static_cast<int>(record_state::parked)) {
    unreadable_row("state " + std::to_string(n) + " is not one this version knows");
  }
  return static_cast<record_state>(n);
}

/// Parses the fast path's packed first column into `out`.
void parse_fast_meta(std::string_view meta, record& out) {
  const char* p = meta.data();
  const char* const end = meta.data() + meta.size();
  auto number = [&]() -> std::int64_t {
    std::int64_t v = 0;
    const auto [next, ec] = std::from_chars(p, end, v);
    if (ec != std::errc{} || next == end || *next != ' ') unreadable_row("numbers");
    p = next + 1;
    return v;
  };
  out.state = state_of(number());
  out.attempts = static_cast<int>(number());
  out.lease_expires_us = number();
  out.recorded.status = static_cast<int>(number());
  out.db_now_us = number();
  out.expires_us = number();
  const std::string_view rest(p, static_cast<std::size_t>(end - p));
  const auto space = rest.find(' ');
  if (space == 0 || rest.empty()) unreadable_row("fingerprint");
  out.fingerprint.assign(rest.substr(0, space));
  // No owner part at all is no owner: a MariaDB whose sql_mode has
  // EMPTY_STRING_IS_NULL reads the COALESCE's '' as NULL, which CONCAT_WS
  // leaves out, separator and all (found in review: every finished record
  // was "unreadable", and a retry of a paid request got a permanent error).
  if (space != std::string_view::npos) {
    out.lease_owner.assign(rest.substr(space + 1));
  } else {
    out.lease_owner.clear();
  }
}

/// The bytes latin1_as_utf8() made `utf8` from; an unreadable row for code
/// points above 0xFF (not what finish() writes).
std::string latin1_bytes(std::string_view utf8) {
  std::string out;
  out.reserve(utf8.size());
  for (std::size_t i = 0; i < utf8.size(); ++i) {
    const auto b = static_cast<unsigned char>(utf8[i]);
    if (b < 0x80) {
      out += utf8[i];
      continue;
    }
    const bool two_bytes = (b == 0xC2 || b == 0xC3) && i + 1 < utf8.size() &&
                           (static_cast<unsigned char>(utf8[i + 1]) & 0xC0U) == 0x80U;
    if (!two_bytes) unreadable_row("headers: a Latin-1 value beyond U+00FF");
    out +=
        static_cast<char>(((b & 0x1FU) << 6U) | (static_cast<unsigned char>(utf8[i + 1]) & 0x3FU));
    ++i;
  }
  return out;
}

/// Reads a quoted JSON string of printable ASCII without escapes at `p`;
/// false (leaving the rest to the general parser) on anything else.
bool plain_json_string(const char*& p, const char* end, std::string& out) {
  if (p == end || *p != '"') return false;
  const char* const begin = ++p;
  while (p != end && *p != '"') {
    const auto c = static_cast<unsigned char>(*p);
    if (c < 0x20 || c > 0x7e || c == '\\') return false;
    ++p;
  }
  if (p == end) return false;
  out.assign(begin, p);
  ++p;
  return true;
}

}  // namespace

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

// Parsing the common form (printable ASCII, no escapes) with nlohmann cost
// about 7,000 instructions per replay, as much as the rest of the read; it
// is read directly, and anything else (escapes, UTF-8, unexpected shape)
// goes to nlohmann, so both give the same headers for every stored value.
std::vector<std::pair<std::string, std::string>> parse_headers(const std::string& json) {
  std::vector<std::pair<std::string, std::string>> out;
  if (json.empty()) return out;
  const char* p = json.data();
  const char* const end = p + json.size();
  auto expect = [&](char c) {
    if (p == end || *p != c) return false;
    ++p;
    return true;
  };
  bool plain = expect('[');
  if (plain && !expect(']')) {
    do {
      auto& h = out.emplace_back();
      plain = expect('[') && plain_json_string(p, end, h.first) && expect(',') &&
              plain_json_string(p, end, h.second) && expect(']');
    } while (plain && expect(','));
    plain = plain && expect(']');
  }
  if (plain && p == end) return out;
  // A column that is not the JSON finish() writes (a corrupt or hand-edited
  // row) is an unreadable row, reported as the store's contract says.
  // Issue 9 (fuzzing): nlohmann's parse_error or type_error came out of
  // store::read() and manager::process(), which promise orpheus::error.
  out.clear();
  try {
    const auto all = nlohmann::json::parse(json);
    if (!all.is_array()) unreadable_row("headers: not an array");
    for (const auto& h : all) {
      if (!h.is_array() || h.size() < 2 || h.size() > 3) {
        unreadable_row("headers: not [name, value]");
      }
      auto& header = out.emplace_back(h.at(0).get<std::string>(), h.at(1).get<std::string>());
      if (h.size() == 3) {
        if (!h.at(2).is_string() || h.at(2).get<std::string>() != latin1_header) {
          unreadable_row("headers: an unknown form of value");
        }
        header.second = latin1_bytes(header.second);
      }
    }
    return out;
  } catch (const nlohmann::json::exception& e) {
    unreadable_row(std::string("headers: ") + e.what());
  }
}

// Header values are bytes (HTTP allows obs-text, 0x80-0xFF), JSON strings
// are UTF-8: nlohmann's dump replaced every byte that is not UTF-8 by
// U+FFFD, so the first answer and every replay differed (found in review).
// Such a value is stored with each byte as the code point of the same
// number (Latin-1) and a third element, "latin1"; parse_headers() turns it
// back into the same bytes. A reader older than this ignores the third
// element and reads the Latin-1 text. Everything else is stored as before.
std::string stored_headers_json(const std::vector<std::pair<std::string, std::string>>& headers) {
  try {
    return nlohmann::json(headers).dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
  } catch (const nlohmann::json::type_error&) {
    // 316: a value that is not UTF-8; names are tokens (sendable_field()).
  }
  const auto is_utf8 = [](const std::string& v) {
    try {
      (void)nlohmann::json(v).dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
      return true;
    } catch (const nlohmann::json::type_error&) {
      return false;
    }
  };
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [name, value] : headers) {
    if (is_utf8(value)) {
      out.push_back(nlohmann::json::array({name, value}));
    } else {
      out.push_back(nlohmann::json::array({name, latin1_as_utf8(value), latin1_header}));
    }
  }
  return out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string latin1_as_utf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char c : bytes) {
    const auto b = static_cast<unsigned char>(c);
    if (b < 0x80) {
      out += c;
    } else {
      out += static_cast<char>(0xC0U | (b >> 6U));
      out += static_cast<char>(0x80U | (b & 0x3FU));
    }
  }
  return out;
}

record record_from_row(const sql_row& row, bool full) {
  const auto& v = row.values;
  record out;
  out.state = state_of(int_or_zero(v.at(0)));
  out.fingerprint = text_or_empty(v[1]);
  out.attempts = static_cast<int>(int_or_zero(v[2]));
  out.lease_owner = text_or_empty(v[3]);
  out.lease_expires_us = int_or_zero(v[4]);
  out.recorded.status = static_cast<int>(int_or_zero(v[5]));
  out.recorded.headers = parse_headers(text_or_empty(v[6]));
  out.recorded.body = text_or_empty(v[7]);
  out.db_now_us = int_or_zero(v.at(8));
  if (full) {
    out.in_doubt_until_us = int_or_zero(v.at(21));
    out.pre_state = text_or_empty(v[9]);
    out.recovery_point = text_or_empty(v[10]);
    out.last_error = text_or_empty(v[11]);
    out.created_us = int_or_zero(v[12]);
    out.updated_us = int_or_zero(v[13]);
    out.retry_until_us = int_or_zero(v[14]);
    out.expires_us = int_or_zero(v[15]);
    out.attempts_before_requeue = static_cast<int>(int_or_zero(v[16]));
    out.handler = text_or_empty(v[17]);
    out.handler_version = static_cast<int>(int_or_zero(v[18]));
    out.next_attempt_us = int_or_zero(v[19]);
    out.retention_us = int_or_zero(v[20]);
  }
  return out;
}

record record_from_fast_row(const sql_row& row) {
  const auto& v = row.values;
  if (v.size() != 3) unreadable_row("the fast read has " + std::to_string(v.size()) + " columns");
  record out;
  const auto* meta = std::get_if<std::string>(&v[0]);
  if (meta == nullptr) unreadable_row("numbers");
  parse_fast_meta(*meta, out);
  out.recorded.headers = parse_headers(text_or_empty(v[1]));
  out.recorded.body = text_or_empty(v[2]);
  return out;
}

}  // namespace orpheus::detail
