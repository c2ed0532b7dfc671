// Reading a stored idempotency record: detail::record_from_row(), which both
// backends use to turn a SELECT of orpheus_records into a record, and
// detail::record_from_fast_row(), the replay fast path's reader of the packed
// SELECT (one text column of numbers, fingerprint and owner; headers; body).
//
// Input: "fast\n" or "full\n", then one line per column in the order of
// record_columns_fast, "now" and record_columns_rest: "n" (NULL), "i<int>",
// "d<double>" or "s<text>". Missing columns are NULL. Or "packed\n", then
// the fast path's three columns, the same way.
//
// Properties of the packed reader: only a non-retryable storage_error
// escapes; a record read, packed again as the SELECT packs it, reads back the
// same; body and headers as for record_from_row().
//
// Properties:
//  - a row it cannot read (the headers column is not the JSON finish()
//    writes, or a state this version does not know) is a storage_error,
//    never another exception: the store's
//    contract (store.hpp) and process()'s (manager.hpp) promise orpheus
//    errors only;
//  - text columns are taken as they are, integers as they are (DECIMAL text
//    as its number), NULL as 0 or "", and the rest of the record is left
//    empty for a fast read;
//  - the headers read are the ones stored: written again as the backends
//    write them, they read back the same.
#include <charconv>
#include <nlohmann/json.hpp>

#include "fuzz_support.hpp"
#include "orpheus/detail/record_row.hpp"
#include "orpheus/error.hpp"

namespace {

using orpheus::sql_value;
using orpheus::fuzz::shown;

constexpr std::size_t fast_columns = 9;  // record_columns_fast + now
constexpr std::size_t all_columns = 22;  // ... + record_columns_rest

sql_value column_of(std::string_view line) {
  if (line.empty() || line[0] == 'n') return nullptr;
  const std::string_view v = line.substr(1);
  if (line[0] == 'i') {
    std::int64_t n = 0;
    std::from_chars(v.data(), v.data() + v.size(), n);
    return n;
  }
  if (line[0] == 'd') {
    double d = 0;
    std::from_chars(v.data(), v.data() + v.size(), d);
    return d;
  }
  return std::string(v);
}

std::string text_of(const sql_value& v) {
  const auto* s = std::get_if<std::string>(&v);
  return s ? *s : std::string{};
}

// What an integer column must read as; nullopt: not specified (text that is
// not a plain decimal number).
std::optional<std::int64_t> number_of(const sql_value& v) {
  if (const auto* n = std::get_if<std::int64_t>(&v)) return *n;
  const auto* s = std::get_if<std::string>(&v);
  if (s == nullptr) return 0;  // NULL, or a REAL no backend writes
  std::int64_t n = 0;
  const auto [end, ec] = std::from_chars(s->data(), s->data() + s->size(), n);
  if (ec != std::errc{} || end != s->data() + s->size()) return std::nullopt;
  return n;
}

// Whether the state column holds one of the states this version knows.
bool known_state(const sql_value& v) {
  const auto n = number_of(v);
  return n && *n >= 1 && *n <= 5;
}

// `narrow`: the field is an int (state, attempts, status), which keeps the
// low 32 bits of a larger stored value.
void check_number(const sql_value& v, std::int64_t got, const char* what, bool narrow = false) {
  auto expected = number_of(v);
  if (expected && narrow) expected = static_cast<int>(*expected);
  FUZZ_CHECK(!expected || *expected == got, std::string(what) + ": " + std::to_string(got));
}

// The headers a backend's finish() writes for `headers`.
std::string stored_headers(const std::vector<std::pair<std::string, std::string>>& headers) {
  return orpheus::detail::stored_headers_json(headers);
}

// What the fast path's SELECT packs into its first column for `r`.
std::string packed(const orpheus::record& r) {
  return std::to_string(static_cast<int>(r.state)) + " " + std::to_string(r.attempts) + " " +
         std::to_string(r.lease_expires_us) + " " + std::to_string(r.recorded.status) + " " +
         std::to_string(r.db_now_us) + " " + std::to_string(r.expires_us) + " " + r.fingerprint +
         " " + r.lease_owner;
}

void fuzz_packed(orpheus::sql_row row) {
  row.values.resize(3, nullptr);
  orpheus::record r;
  try {
    r = orpheus::detail::record_from_fast_row(row);
  } catch (const orpheus::storage_error& e) {
    FUZZ_CHECK(!e.retryable(), e.what());
    return;
  }
  FUZZ_CHECK(r.recorded.body == text_of(row.values[2]), shown(r.recorded.body));
  FUZZ_CHECK(r.fingerprint.find(' ') == std::string::npos, shown(r.fingerprint));
  orpheus::sql_row again_row;
  again_row.values = {packed(r), stored_headers(r.recorded.headers), row.values[2]};
  const auto again = orpheus::detail::record_from_fast_row(again_row);
  FUZZ_CHECK(again.state == r.state && again.attempts == r.attempts &&
                 again.lease_expires_us == r.lease_expires_us &&
                 again.recorded.status == r.recorded.status && again.db_now_us == r.db_now_us &&
                 again.expires_us == r.expires_us && again.fingerprint == r.fingerprint &&
                 again.lease_owner == r.lease_owner,
             "packed again, " + shown(packed(r)) + " reads as " + shown(packed(again)));
  FUZZ_CHECK(again.recorded.headers == r.recorded.headers,
             "headers " + shown(text_of(row.values[1])) + " do not read back as written");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto lines = orpheus::fuzz::split(orpheus::fuzz::text_of(data, size), "\n", all_columns + 1);
  if (lines[0] == "packed") {
    orpheus::sql_row row;
    for (std::size_t i = 1; i < lines.size() && i <= 3; ++i) {
      row.values.push_back(column_of(lines[i]));
    }
    fuzz_packed(std::move(row));
    return 0;
  }
  const bool full = lines[0] == "full";
  orpheus::sql_row row;
  for (std::size_t i = 1; i < lines.size(); ++i) row.values.push_back(column_of(lines[i]));
  row.values.resize(full ? all_columns : fast_columns, nullptr);
  const auto& v = row.values;

  orpheus::record r;
  try {
    r = orpheus::detail::record_from_row(row, full);
  } catch (const orpheus::storage_error& e) {
    FUZZ_CHECK(!e.retryable() && (!text_of(v[6]).empty() || !known_state(v[0])), e.what());
    return 0;
  }
  if (number_of(v[0])) {  // text that is not a plain number reads as its leading digits
    FUZZ_CHECK(known_state(v[0]), "an unknown state was read: " + shown(text_of(v[0])));
  }
  check_number(v[0], static_cast<int>(r.state), "state", true);
  FUZZ_CHECK(r.fingerprint == text_of(v[1]), shown(r.fingerprint));
  check_number(v[2], r.attempts, "attempts", true);
  FUZZ_CHECK(r.lease_owner == text_of(v[3]), shown(r.lease_owner));
  check_number(v[4], r.lease_expires_us, "lease_expires_us");
  check_number(v[5], r.recorded.status, "status", true);
  FUZZ_CHECK(r.recorded.body == text_of(v[7]), shown(r.recorded.body));
  check_number(v[8], r.db_now_us, "now");
  if (full) {
    FUZZ_CHECK(r.pre_state == text_of(v[9]), shown(r.pre_state));
    FUZZ_CHECK(r.recovery_point == text_of(v[10]), shown(r.recovery_point));
    FUZZ_CHECK(r.last_error == text_of(v[11]), shown(r.last_error));
    check_number(v[12], r.created_us, "created_us");
    check_number(v[13], r.updated_us, "updated_us");
    check_number(v[14], r.retry_until_us, "retry_until_us");
    check_number(v[15], r.expires_us, "expires_us");
    check_number(v[16], r.attempts_before_requeue, "attempts_before_requeue", true);
    FUZZ_CHECK(r.handler == text_of(v[17]), shown(r.handler));
    check_number(v[18], r.handler_version, "handler_version", true);
    check_number(v[19], r.next_attempt_us, "next_attempt_us");
    check_number(v[20], r.retention_us, "retention_us");
    check_number(v[21], r.in_doubt_until_us, "in_doubt_until_us");
  } else {
    FUZZ_CHECK(r.pre_state.empty() && r.recovery_point.empty() && r.last_error.empty() &&
                   r.created_us == 0 && r.updated_us == 0 && r.retry_until_us == 0 &&
                   r.expires_us == 0,
               "a fast read filled the rest of the record");
  }
  if (text_of(v[6]).empty()) {
    FUZZ_CHECK(r.recorded.headers.empty(), "headers out of nothing");
    return 0;
  }
  // The headers read, written again as finish() writes them, read the same.
  row.values[6] = stored_headers(r.recorded.headers);
  const auto again = orpheus::detail::record_from_row(row, full);
  FUZZ_CHECK(again.recorded.headers == r.recorded.headers,
             "headers " + shown(text_of(v[6])) + " do not read back as written");
  return 0;
}
