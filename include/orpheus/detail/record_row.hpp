// How a backend's SELECT of orpheus_records maps to a record. Both backends
// build their SELECT from these column lists, so the order lives here once.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "orpheus/store.hpp"
#include "orpheus/tx.hpp"

namespace orpheus::detail {

/// What the fast path needs to decide and to replay; followed in the SELECT
/// by the database's "now" (microseconds since the epoch).
inline constexpr std::string_view record_columns_fast =
    "state, fingerprint, attempts, lease_owner, lease_expires_us, status, headers, body";
/// The rest of the record, for take-overs (pre_state) and for inspection.
inline constexpr std::string_view record_columns_rest =
    "pre_state, steps, last_error, created_us, updated_us, retry_until_us, expires_us, "
    "attempts_before_requeue, handler, handler_version, next_attempt_us, retention_us, "
    "in_doubt_until_us";

/// Builds a record from a row of `fast, now[, rest]`; `full` says whether the
/// rest is there. Throws storage_error::permanent (not retryable) when the
/// headers column is not the JSON the backends write, or the state is not one
/// this version knows (a newer version's record is never guessed at).
record record_from_row(const sql_row& row, bool full);

/// Builds a record from a row of the replay fast path (record_sql::read_fast):
/// the packed text "state attempts lease_expires status now expires
/// fingerprint owner", the headers and the body. Throws storage_error::permanent when
/// the row is not what the record layer writes.
record record_from_fast_row(const sql_row& row);

/// The recorded headers as finish() stores them (JSON [[name, value], ...],
/// where a value that is not UTF-8 is [name, latin1_as_utf8(value),
/// latin1_header]); throws storage_error::permanent on anything else.
std::vector<std::pair<std::string, std::string>> parse_headers(const std::string& json);

/// `headers` as finish() stores them, which parse_headers() reads back as
/// the same bytes.
std::string stored_headers_json(const std::vector<std::pair<std::string, std::string>>& headers);

/// The third element of a stored header whose value is not UTF-8.
inline constexpr std::string_view latin1_header = "latin1";

/// `bytes` with each byte as the code point of the same number, in UTF-8.
std::string latin1_as_utf8(std::string_view bytes);

/// An integer column (DECIMAL arrives as text); 0 for NULL.
std::int64_t int_or_zero(const sql_value& v);

/// A text column; "" for NULL.
std::string text_or_empty(const sql_value& v);

}  // namespace orpheus::detail
