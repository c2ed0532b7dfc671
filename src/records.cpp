// The record state machine's SQL, once for every backend (docs/state-machine.md).
// Each statement is built from the backend's dialect when the store opens;
// states are written from record_state, never as bare numbers.
#include "orpheus/detail/records.hpp"
#include "orpheus/detail/ascii.hpp"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "orpheus/detail/record_row.hpp"

namespace orpheus::detail {
namespace {

std::string number(record_state s) { return std::to_string(static_cast<int>(s)); }

// Every write of an attempt is fenced: it changes the row only while this
// attempt's owner token holds the lease of an in-progress record.
std::string fence() {
  return " WHERE scope = ? AND idem_key = ? AND lease_owner = ? AND state = " +
         number(record_state::in_progress);
}

std::string select_full(const sql_dialect& d) {
  return std::string("SELECT ")
      .append(record_columns_fast)
      .append(", ")
      .append(d.now_us)
      .append(", ")
      .append(record_columns_rest)
      .append(" FROM orpheus_records WHERE scope = ? AND idem_key = ?");
}

// The replay fast path's SELECT. On MySQL the connector's cost per result
// column dominates a replay: each column costs a name-map entry (upper-cased),
// a bound buffer and a getter call, about 3,000 instructions (callgrind,
// bench/process_bench.cpp), against about 1,000 for everything Orpheus adds
// around the read. So the six numbers, the fingerprint and the lease owner
// come back as ONE text column, and only headers and body (any bytes) keep
// their own: 3 columns instead of 10. expires_us is there for the replay
// cache, which keeps a record no longer than its row can be. The concatenation has no NULL part
// (hence the COALESCEs, which give what record_from_row() gives a NULL: 0 or
// ""). Every part is digits or hex (the fingerprint and the owner token are
// written validated), so a space separates them unambiguously. Every column
// has a one-letter alias: the connector upper-cases each column's name for
// every result set.
std::string select_fast(const sql_dialect& d) {
  const std::vector<std::string> parts = {"state",
                                          "attempts",
                                          "COALESCE(lease_expires_us, 0)",
                                          "COALESCE(status, 0)",
                                          d.now_us,
                                          "COALESCE(expires_us, 0)",
                                          "fingerprint",
                                          "COALESCE(lease_owner, '')"};
  std::string sql = "SELECT " + d.concat_open;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) sql += d.concat_separator;
    sql += parts[i];
  }
  return sql + d.concat_close +
         " AS r, headers AS h, body AS b FROM orpheus_records WHERE scope = ? AND idem_key = ?";
}

// Error texts and operators' notes go to BLOB columns: 64 KiB on MySQL,
// whose strict mode (MariaDB's default) refuses a longer value. Found in
// review: a final failure carrying a whole downstream error page was never
// recorded (the failed write came out of the commit, in doubt), so its key
// was retried until it parked. They are cut here, at a UTF-8 boundary, and
// say so.
constexpr std::size_t stored_text_max = std::size_t{16} * 1024;

std::string stored_text(std::string_view s) {
  if (s.size() <= stored_text_max) return std::string(s);
  const std::string cut = " [cut: " + std::to_string(s.size()) + " bytes in all]";
  std::size_t n = stored_text_max - cut.size();
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0U) == 0x80U) --n;
  return std::string(s.substr(0, n)) + cut;
}

storage_error pre_state_fence_failed() {
  return storage_error::permanent("lease row vanished inside its own transaction");
}

storage_error finish_fence_failed() {
  return storage_error::lease_lost(
      "the fenced finish found another owner's lease; nothing committed");
}

}  // namespace

record_sql::record_sql(const sql_dialect& d) {
  const std::string& now = d.now_us;
  const std::string in_progress = number(record_state::in_progress);
  read_fast = select_fast(d);
  inspect = select_full(d);
  lock = select_full(d) + d.lock_suffix;
  // An unfinished record expires too, at the end of its retry window plus the
  // retention, so an abandoned one is purged in the end (finish() moves
  // expires_us to its own retention); but never before its last attempt's
  // call can no longer land: each attempt's lease end plus the in-doubt
  // window (found in review: an attempt that crashed and was never taken
  // over left no in_doubt_until_us, and with a retention shorter than that
  // window its record was purged while its call could still land; a
  // client's retry then ran as a new request). insert() sets both bounds
  // (insert_expiry()); take_lease() and save_progress(), which start or
  // renew a lease, only move it later, to the lease end plus the window
  // (landing_ends()).
  // next_attempt_us: when the completer may look at a record with a
  // handler (docs/operations.md). Under a lease, when the lease ends (held in
  // doubt: after a backoff beyond it); retryable, after the backoff;
  // finished, parked, or without a handler, never (NULL: a record only its
  // client can finish is not in the completer's way). retention_us: the
  // request's own retention, for a completer that finishes it.
  const std::string if_handler = "CASE WHEN handler IS NULL THEN NULL ELSE " + now;
  insert =
      "INSERT INTO orpheus_records(scope, idem_key, fingerprint, state, attempts, lease_owner, "
      "lease_expires_us, created_us, updated_us, retry_until_us, expires_us, handler, "
      "handler_version, next_attempt_us, retention_us) VALUES (?, ?, ?, " +
      in_progress + ", 1, ?, " + now + " + ?, " + now + ", " + now + ", " + now + " + ?, " + now +
      " + ? + ?, ?, ?, " + now + " + ?, ?)" + d.insert_if_absent_suffix;
  save_pre_state =
      "UPDATE orpheus_records SET pre_state = ?, steps = ?, updated_us = " + now + fence();
  // `column` = the later of the time already there and `than` (each figure
  // given twice): a NULL compares as unknown, so the ELSE sets it.
  const auto later = [](const std::string& column, const std::string& than) {
    return column + " = CASE WHEN " + column + " > " + than + " THEN " + column + " ELSE " + than +
           " END";
  };
  // A step of a multi-step request finished (or a compensation did): its
  // recovery point, and the lease renewed for the next step.
  save_progress = "UPDATE orpheus_records SET steps = ?, lease_expires_us = " + now +
                  " + ?, next_attempt_us = " + if_handler + " + ? END, " +
                  later("expires_us", now + " + ?") + ", updated_us = " + now + fence();
  take_lease = "UPDATE orpheus_records SET state = " + in_progress +
               ", lease_owner = ?, lease_expires_us = " + now +
               " + ?, next_attempt_us = " + if_handler + " + ? END, attempts = ?, " +
               later("expires_us", now + " + ?") + ", updated_us = " + now +
               " WHERE scope = ? AND idem_key = ?";
  raise_handler_version =
      "UPDATE orpheus_records SET handler_version = ? WHERE scope = ? AND idem_key = ? AND "
      "handler_version < ?";
  mark_in_doubt = "UPDATE orpheus_records SET " +
                  later("in_doubt_until_us", "lease_expires_us + ?") +
                  ", next_attempt_us = CASE WHEN next_attempt_us IS NULL THEN NULL WHEN "
                  "next_attempt_us > lease_expires_us + ? THEN next_attempt_us ELSE "
                  "lease_expires_us + ? END, updated_us = " +
                  now + fence();
  // The same from now, for an attempt that lost its lease before it could
  // say its call was in doubt (another attempt took over meanwhile): it only
  // ever moves the time later, on any unfinished record.
  mark_in_doubt_unfenced =
      "UPDATE orpheus_records SET " + later("in_doubt_until_us", now + " + ?") +
      ", updated_us = " + now + " WHERE scope = ? AND idem_key = ? AND state <> " +
      number(record_state::succeeded) + " AND state <> " + number(record_state::failed);
  finish =
      "UPDATE orpheus_records SET state = ?, status = ?, headers = ?, body = ?, last_error = ?, "
      "lease_owner = NULL, lease_expires_us = NULL, next_attempt_us = NULL, expires_us = " +
      now + " + ?, updated_us = " + now + fence();
  release = "UPDATE orpheus_records SET state = " + number(record_state::retryable) +
            ", lease_owner = NULL, lease_expires_us = NULL, next_attempt_us = " + if_handler +
            " + ? END, last_error = ?, updated_us = " + now + fence();
  const std::string parked = number(record_state::parked);
  // in_doubt_until_us first: MySQL reads the columns a SET list assigned
  // earlier at their new values (state, lease_expires_us), SQLite at their
  // old ones. A record parked in progress: its last attempt did not finish,
  // and its call may still land (found in review: a mark that could not be
  // written, or a crash, left none).
  park = "UPDATE orpheus_records SET in_doubt_until_us = CASE WHEN state = " + in_progress +
         " AND lease_expires_us IS NOT NULL AND (in_doubt_until_us IS NULL OR in_doubt_until_us < "
         "lease_expires_us + ?) THEN lease_expires_us + ? ELSE in_doubt_until_us END, state = " +
         parked +
         ", lease_owner = NULL, lease_expires_us = NULL, next_attempt_us = NULL, last_error = ?, "
         "updated_us = " +
         now + " WHERE scope = ? AND idem_key = ?";
  // The attempt number comes from the record itself, in the same statement.
  add_history =
      "INSERT INTO orpheus_attempts(scope, idem_key, attempt, at_us, outcome, runner, step, "
      "error) SELECT scope, idem_key, attempts, " +
      now + ", ?, ?, ?, ? FROM orpheus_records WHERE scope = ? AND idem_key = ?";
  // The same, only while `owner` holds the lease of the record in progress.
  add_history_fenced = add_history + " AND lease_owner = ? AND state = " + in_progress;
  // An attempt found in progress under an expired lease left no row of its
  // own unless it was held in doubt (hold_until): add one only then.
  add_abandoned =
      "INSERT INTO orpheus_attempts(scope, idem_key, attempt, at_us, outcome, runner, error) "
      "SELECT scope, idem_key, attempts, " +
      now +
      ", 'abandoned', 'client', 'the lease expired before the attempt finished' FROM "
      "orpheus_records r WHERE scope = ? AND idem_key = ? AND NOT EXISTS (SELECT 1 FROM "
      "orpheus_attempts a WHERE a.scope = r.scope AND a.idem_key = r.idem_key AND a.attempt = "
      "r.attempts AND a.at_us >= r.created_us)";
  // Rows older than the record are another record's (none should be left:
  // the purge deletes a record and its history together; a safety net).
  history =
      "SELECT attempt, at_us, outcome, runner, COALESCE(step, ''), COALESCE(error, '') FROM "
      "orpheus_attempts WHERE scope = ? AND idem_key = ? AND at_us >= ? ORDER BY id";
  requeue = "UPDATE orpheus_records SET state = " + number(record_state::retryable) +
            ", attempts_before_requeue = attempts, next_attempt_us = " + if_handler +
            " END, retry_until_us = " + now + " + ?, expires_us = " + now +
            " + ? + ?, last_error = ?, updated_us = " + now +
            " WHERE scope = ? AND idem_key = ? AND state = " + parked;
  // A cancel by a person: like a requeue, with the recovery point that
  // sends the next attempt backwards (orpheus/steps.hpp).
  cancel = "UPDATE orpheus_records SET state = " + number(record_state::retryable) +
           ", steps = ?, attempts_before_requeue = attempts, next_attempt_us = " + if_handler +
           " END, retry_until_us = " + now + " + ?, expires_us = " + now +
           " + ? + ?, last_error = ?, updated_us = " + now +
           " WHERE scope = ? AND idem_key = ? AND (state = " + parked +
           " OR state = " + number(record_state::retryable) + ")";
  // Only a record no attempt can be running for: a lease that merely
  // expired may belong to a call still going on downstream (in doubt).
  resolve =
      "UPDATE orpheus_records SET state = ?, status = ?, headers = ?, body = ?, last_error = ?, "
      "lease_owner = NULL, lease_expires_us = NULL, next_attempt_us = NULL, expires_us = " +
      now + " + ?, updated_us = " + now +
      " WHERE scope = ? AND idem_key = ? AND (state = " + parked +
      " OR state = " + number(record_state::retryable) + ")";
  list =
      "SELECT scope, idem_key, state, attempts, created_us, updated_us, COALESCE(last_error, "
      "''), " +
      now + " FROM orpheus_records WHERE state = ? AND updated_us <= " + now +
      " - ? ORDER BY updated_us LIMIT ?";
  count_by_state = "SELECT state, COUNT(*) FROM orpheus_records GROUP BY state";
  // The completer's claim: the most overdue record that is due, retryable
  // or in progress under an expired lease, and names one of the completer's
  // handlers (claim_head + "(handler = ? AND handler_version <= ?) OR ..." +
  // claim_tail); locked (others pass over it) until claim_hold has pushed it
  // out.
  claim_head =
      "SELECT scope, idem_key, fingerprint, handler, COALESCE(handler_version, 0) FROM "
      "orpheus_records WHERE next_attempt_us <= " +
      now + " AND (state = " + number(record_state::retryable) + " OR (state = " + in_progress +
      " AND lease_expires_us < " + now + ")) AND (";
  claim_tail = ") ORDER BY next_attempt_us LIMIT 1" + d.skip_locked_suffix;
  claim_hold = "UPDATE orpheus_records SET next_attempt_us = " + now +
               " + ? WHERE scope = ? AND idem_key = ?";
  // Any state but parked goes once its expiry has passed, except a record
  // under a live lease (someone is working on it right now) and one whose
  // downstream call may still land (in_doubt_until_us): its client is told
  // to retry meanwhile, and a retry that found no record would run as a new
  // request (found in review: with a retention shorter than the in-doubt
  // window, an unfinished record was purged inside it). A parked record
  // waits for a person, however old. A pass picks the records by the expiry
  // index and locks them, then deletes their history and them by key, in
  // one transaction: nothing can write history for, or park, a record
  // between the two deletes, and no statement scans the history table.
  // Nor an unfinished record made through a registered handler: a completer
  // finishes it or parks it, and until then it is a request the service owes
  // (found in review: with a retention of 0, as the middleware gives an
  // unkeyed request, it expired as its retry window ended, and a completer
  // running behind found nothing to park: an authorisation left open, or a
  // capture never notified, without an alert).
  const std::string purgeable =
      "expires_us < " + now + " AND state <> " + parked + " AND (state <> " + in_progress +
      " OR lease_expires_us IS NULL OR lease_expires_us < " + now +
      ") AND COALESCE(in_doubt_until_us, 0) < " + now + " AND (handler IS NULL OR state NOT IN (" +
      in_progress + ", " + number(record_state::retryable) + "))";
  purge_select =
      "SELECT scope, idem_key, CASE WHEN EXISTS (SELECT 1 FROM orpheus_attempts a WHERE a.scope "
      "= orpheus_records.scope AND a.idem_key = orpheus_records.idem_key) THEN 1 ELSE 0 END "
      "FROM orpheus_records WHERE " +
      purgeable + " ORDER BY expires_us LIMIT ?" + d.skip_locked_suffix;
  std::string keys;  // purge_chunk (scope, key) pairs
  for (std::size_t i = 0; i < purge_chunk; ++i) {
    keys += (i == 0 ? "(" : " OR (");
    keys += "scope = ? AND idem_key = ?)";
  }
  purge_history_of = "DELETE FROM orpheus_attempts WHERE " + keys;
  purge_records_of = "DELETE FROM orpheus_records WHERE (" + keys + ") AND " + purgeable;
  create_version_table = d.create_version_table;
  count_tables = d.count_tables;
  max_version = "SELECT COALESCE(MAX(version), 0) FROM orpheus_schema_version";
  add_version =
      "INSERT INTO orpheus_schema_version(version, name, applied_us) VALUES (?, ?, " + now + ")";
  read_shard_map = "SELECT shard_index, shard_count FROM orpheus_shard_map WHERE id = 1";
  record_shard_map =
      "INSERT INTO orpheus_shard_map(id, shard_index, shard_count, set_us) VALUES (1, ?, ?, " +
      now + ")";
  replace_shard_map =
      "UPDATE orpheus_shard_map SET shard_index = ?, shard_count = ?, set_us = " + now +
      " WHERE id = 1";
}

record_tx::record_tx(std::unique_ptr<backend_tx> t, const record_sql& sql)
    : owned_(std::move(t)), t_(owned_.get()), sql_(sql) {}

record_tx::record_tx(backend_tx& t, const record_sql& sql) : t_(&t), sql_(sql) {}

namespace {
// a + b, or the largest value instead of overflowing (a guard: the manager
// takes at most 100 years for each figure, whose sums fit).
std::int64_t saturating_sum(std::int64_t a, std::int64_t b) {
  constexpr std::int64_t most = std::numeric_limits<std::int64_t>::max();
  return b > 0 && a > most - b ? most : a + b;
}
// From now: when this attempt's call can no longer land.
std::int64_t landing_ends(const lease_terms& t) {
  return saturating_sum(t.lease_us, t.in_doubt_window_us);
}
// From now, for a new record: the end of the retry window plus the
// retention, but not before its first attempt's call can no longer land.
std::int64_t insert_expiry(const lease_terms& t) {
  return std::max(saturating_sum(t.retry_window_us, t.retention_us), landing_ends(t));
}
}  // namespace

bool record_tx::insert(const request_id& id, std::string_view owner, const lease_terms& t,
                       std::string_view handler, int handler_version) {
  const sql_value no_handler = nullptr;
  const sql_value p[] = {id.scope,
                         id.key,
                         id.fingerprint,
                         std::string(owner),
                         t.lease_us,
                         t.retry_window_us,
                         insert_expiry(t),
                         std::int64_t{0},
                         handler.empty() ? no_handler : sql_value(std::string(handler)),
                         handler.empty() ? no_handler : sql_value(std::int64_t{handler_version}),
                         handler.empty() ? no_handler : sql_value(t.lease_us),
                         t.retention_us};
  return t_->insert_if_absent(sql_.insert, p);
}

std::optional<record> record_tx::lock(const request_id& id) {
  const sql_value p[] = {id.scope, id.key};
  auto rows = t_->query_values(sql_.lock, p);
  if (rows.empty()) return std::nullopt;
  return record_from_row(rows.front(), true);
}

bool record_tx::save_pre_state(const request_id& id, std::string_view owner, std::string_view json,
                               std::string_view recovery_point) {
  const sql_value no_steps = nullptr;
  const sql_value p[] = {std::string(json),
                         recovery_point.empty() ? no_steps : sql_value(std::string(recovery_point)),
                         id.scope, id.key, std::string(owner)};
  return t_->execute_fenced(sql_.save_pre_state, p, &pre_state_fence_failed);
}

bool record_tx::save_progress(const request_id& id, std::string_view owner,
                              std::string_view recovery_point, const lease_terms& t) {
  const sql_value p[] = {std::string(recovery_point),
                         t.lease_us,
                         t.lease_us,
                         landing_ends(t),
                         landing_ends(t),
                         id.scope,
                         id.key,
                         std::string(owner)};
  return t_->execute_fenced(sql_.save_progress, p, &finish_fence_failed);
}

void record_tx::take_lease(const request_id& id, std::string_view owner, int attempts,
                           const lease_terms& t, std::optional<std::int64_t> next_attempt_in_us) {
  // landing_ends() given twice: later() names it twice.
  const sql_value p[] = {std::string(owner),
                         t.lease_us,
                         next_attempt_in_us.value_or(t.lease_us),
                         std::int64_t{attempts},
                         landing_ends(t),
                         landing_ends(t),
                         id.scope,
                         id.key};
  t_->execute_values(sql_.take_lease, p);
}

void record_tx::raise_handler_version(const request_id& id, int version) {
  const sql_value p[] = {std::int64_t{version}, id.scope, id.key, std::int64_t{version}};
  t_->execute_values(sql_.raise_handler_version, p);
}

bool record_tx::mark_in_doubt(const request_id& id, std::string_view owner, std::int64_t window_us,
                              std::int64_t backoff_us) {
  if (owner.empty()) {
    const sql_value p[] = {window_us, window_us, id.scope, id.key};
    return t_->execute_values(sql_.mark_in_doubt_unfenced, p) == 1;
  }
  const sql_value p[] = {window_us, window_us, backoff_us,        backoff_us,
                         id.scope,  id.key,    std::string(owner)};
  return t_->execute_values(sql_.mark_in_doubt, p) == 1;
}

bool sendable_field(std::string_view name, std::string_view value, std::size_t max_value) noexcept {
  const bool name_ok = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return detail::is_ascii_alnum(c) ||
           std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
  });
  return name_ok && value.size() <= max_value &&
         std::none_of(value.begin(), value.end(),
                      [](unsigned char c) { return header_control(c); });
}

std::optional<std::string> unsendable_header(const response& r, std::size_t max_value) {
  for (const auto& [name, value] : r.headers) {
    if (!sendable_field(name, value, max_value)) {
      return "header '" + name.substr(0, 64) + "' is not one line of at most " +
             std::to_string(max_value) + " bytes with a token for a name";
    }
  }
  return std::nullopt;
}

bool record_tx::finish(const request_id& id, std::string_view owner, record_state s,
                       const response& r, std::string_view last_error, const lease_terms& t) {
  // Found in review: an answer with a header of 64 KB was recorded as
  // succeeded, and the HTTP front end answered it (the first time and every
  // replay) with a final 500, "do not retry", over a payment made; one with
  // a line break was sent on every replay with the rest as a header of its
  // own. Refused as a 1xx is, below: only what cannot go out as it is (a
  // long but valid header is recorded, as before).
  if (auto why = unsendable_header(r, max_header_value)) {
    throw std::logic_error("the handler's answer cannot be recorded: its " + *why);
  }
  if (!is_final_status(r.status)) {
    // A handler's mistake, caught before it becomes every replay's answer
    // (a 1xx is never an answer to a request: a replay of it went out as a
    // bare 500 that no client reads as final). Thrown from inside Post-RPC's
    // transaction, it undoes it like any Post-RPC that throws: the key stays
    // retryable, and the reason is the record's last error.
    throw std::logic_error("the handler answered status " + std::to_string(r.status) +
                           ", which cannot be recorded as a request's answer (200 to 599)");
  }
  const sql_value p[] = {std::int64_t{static_cast<int>(s)},
                         std::int64_t{r.status},
                         stored_headers_json(r.headers),
                         r.body,
                         stored_text(last_error),
                         t.retention_us,
                         id.scope,
                         id.key,
                         std::string(owner)};
  return t_->execute_fenced(sql_.finish, p, &finish_fence_failed);
}

bool record_tx::release(const request_id& id, std::string_view owner, std::string_view why,
                        std::int64_t retry_in_us, std::string_view runner, std::string_view step) {
  const sql_value p[] = {retry_in_us, stored_text(why), id.scope, id.key, std::string(owner)};
  if (t_->execute_values(sql_.release, p) != 1) return false;
  add_history(id, "retryable", why, runner, step);
  return true;
}

void record_tx::park(const request_id& id, std::string_view why, std::string_view runner,
                     std::string_view step, std::int64_t window_us) {
  const sql_value p[] = {window_us, window_us, stored_text(why), id.scope, id.key};
  t_->execute_values(sql_.park, p);
  add_history(id, "parked", why, runner, step);
}

namespace {
sql_value step_or_null(std::string_view step) {
  if (step.empty()) return nullptr;
  return std::string(step);
}
}  // namespace

void record_tx::add_history(const request_id& id, std::string_view outcome, std::string_view error,
                            std::string_view runner, std::string_view step) {
  const sql_value p[] = {std::string(outcome),
                         std::string(runner),
                         step_or_null(step),
                         stored_text(error),
                         id.scope,
                         id.key};
  t_->execute_values(sql_.add_history, p);
}

bool record_tx::add_history_fenced(const request_id& id, std::string_view owner,
                                   std::string_view outcome, std::string_view error,
                                   std::string_view runner, std::string_view step) {
  // add_history's parameters, then the owner of its fence.
  const sql_value p[] = {std::string(outcome),
                         std::string(runner),
                         step_or_null(step),
                         stored_text(error),
                         id.scope,
                         id.key,
                         std::string(owner)};
  return t_->execute_values(sql_.add_history_fenced, p) == 1;
}

void record_tx::add_abandoned(const request_id& id) {
  const sql_value p[] = {id.scope, id.key};
  t_->execute_values(sql_.add_abandoned, p);
}

bool record_tx::requeue(const request_id& id, std::string_view note, const lease_terms& t) {
  const sql_value p[] = {t.retry_window_us, t.retry_window_us, t.retention_us,
                         stored_text(note), id.scope,          id.key};
  if (t_->execute_values(sql_.requeue, p) != 1) return false;
  add_history(id, "requeued", note, "operator");
  return true;
}

bool record_tx::cancel(const request_id& id, std::string_view recovery_point, std::string_view note,
                       const lease_terms& t) {
  const sql_value p[] = {std::string(recovery_point),
                         t.retry_window_us,
                         t.retry_window_us,
                         t.retention_us,
                         stored_text(note),
                         id.scope,
                         id.key};
  if (t_->execute_values(sql_.cancel, p) != 1) return false;
  add_history(id, "cancelled", note, "operator");
  return true;
}

bool record_tx::resolve(const request_id& id, record_state s, const response& r,
                        std::string_view note, const lease_terms& t) {
  if (!is_final_status(r.status)) {  // admin::resolve() refuses it first
    throw std::logic_error("a resolved answer needs a final status, not " +
                           std::to_string(r.status));
  }
  const sql_value p[] = {std::int64_t{static_cast<int>(s)},
                         std::int64_t{r.status},
                         stored_headers_json(r.headers),
                         r.body,
                         stored_text(note),
                         t.retention_us,
                         id.scope,
                         id.key};
  if (t_->execute_values(sql_.resolve, p) != 1) return false;
  add_history(id, "resolved", note, "operator");
  return true;
}

std::unique_ptr<record_tx> begin_record_tx(store& s, const request_id& id) {
  const std::size_t shard = s.shard_of(id);
  return std::make_unique<record_tx>(s.backend_for_records(shard).begin(shard), s.statements());
}

void transact(store& s, const request_id& id, const std::function<void(record_tx&)>& body) {
  const std::size_t shard = s.shard_of(id);
  s.backend_for_records(shard).transact(shard, [&](backend_tx& t) {
    record_tx r(t, s.statements());
    body(r);
  });
}

}  // namespace orpheus::detail
