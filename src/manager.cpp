// The algorithm of docs/state-machine.md. Read this file top to bottom: run() is the
// whole story, the helpers below it are its steps.
#include "orpheus/manager.hpp"
#include "orpheus/detail/ascii.hpp"

#include <algorithm>
#include <array>
#include <exception>
#include <limits>
#include <random>
#include <thread>

#include "orpheus/detail/records.hpp"
#include "orpheus/log.hpp"
#include "pre_state.hpp"
#include "progress.hpp"
#include "replay_cache.hpp"
#include "sql_guard.hpp"

namespace orpheus {
namespace {

using clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

std::int64_t micros(std::chrono::milliseconds d) {
  return std::chrono::duration_cast<std::chrono::microseconds>(d).count();
}

constexpr std::string_view runner_completer = "completer";

[[noreturn]] void throw_mismatch() {
  throw error(error_info::of(error_class::invalid_input, codes::fingerprint_mismatch,
                             "this idempotency key was used with another request payload"));
}

[[noreturn]] void throw_in_progress(std::int64_t remaining_us) {
  // Round up, so a client that honours Retry-After never comes back early.
  const auto ms = std::max<std::int64_t>(1, (remaining_us + 999) / 1000);
  throw error(error_info::of(error_class::conflict, codes::in_progress,
                             "another request with this idempotency key is in progress")
                  .with_retry_after(std::chrono::milliseconds(ms)));
}

// A permanent database error while reading or taking up a key that is not
// new (found in review: it was answered 500 "do not retry", and a client
// told that could pay again under a new key while the completer finished the
// first payment, or a record that does not read hid one that did charge).
// The key is held by a request that is not finished, or its record could not
// be read at all: an operator's fix (a grant, a schema, a row) lets the
// retry go on, so it is retryable, and in doubt when an earlier attempt's
// call may still land. `unfinished` is the record read, when it read;
// `read_in_full` whether it has in_doubt_until_us (the fast read does not:
// then a record an attempt left retryable may have been marked in doubt,
// and is taken to be, found in review). Not this thread's own misuse on
// SQLite (codes::nested_transaction: a transaction it holds would wait for
// itself), final whatever the key: the same code path would only meet it
// again.
[[noreturn]] void throw_refused_on_held_key(const storage_error& e,
                                            const std::optional<record>& unfinished,
                                            bool read_in_full) {
  const bool may_land =
      unfinished && (unfinished->state == record_state::in_progress ||
                     (read_in_full ? unfinished->in_doubt_until_us > unfinished->db_now_us
                                   : unfinished->state == record_state::retryable));
  throw storage_error(
      error_info::of(may_land ? error_class::in_doubt : error_class::unavailable,
                     codes::storage_unavailable,
                     unfinished ? "the database refused to take up this key's unfinished "
                                  "request; retry later with the same key"
                                : "the database could not read this key's record; retry later "
                                  "with the same key")
          .with_internal(e.info().internal));
}

// An unfinished record begun through a handler that this manager cannot
// resume it with: another server (or its completer) can. Retryable: the
// request is the client's own (its payload matched), and a final answer
// could make a client give up on a payment that still goes through.
[[noreturn]] void throw_begun_elsewhere(std::string_view handler, int version) {
  throw error(error_info::of(error_class::conflict, codes::in_progress,
                             "this request is being finished elsewhere; retry later with the "
                             "same key")
                  .with_retry_after(std::chrono::seconds(1))
                  .with_internal("begun through handler '" + std::string(handler) + "' version " +
                                 std::to_string(version) +
                                 ", which this server does not have; a server that has it, or "
                                 "its completer, finishes it"));
}

// Thrown by run_unobserved() when the record was begun through another
// registered handler; run() resumes it with that handler's phases, within
// what is left of the caller's wait.
struct resume_with_handler {
  std::string name;
  std::chrono::milliseconds wait_left{0};
};

[[noreturn]] void throw_parked(std::chrono::milliseconds retry_after) {
  throw error(error_info::of(error_class::unavailable, codes::request_parked,
                             "this request is parked: it did not complete within its retry "
                             "budget and waits for an operator; retry later with the same key")
                  .with_retry_after(retry_after));
}

response replayed(response r) {
  r.replayed = true;
  return r;
}

response replay_of(const record& r) { return replayed(r.recorded); }

bool lease_is_live(const record& r) {
  return r.state == record_state::in_progress && r.lease_expires_us > r.db_now_us;
}

/// The shard config::observer is told about; 0 if it cannot be had (an
/// observer never fails a request).
std::size_t shard_for_observer(const store& s, const request_id& id) noexcept {
  try {
    return s.shard_of(id);
  } catch (...) {
    return 0;
  }
}

/// Tells config::observer, when there is one, that `e` happened to the key
/// on `shard`.
void note(const config& c, std::size_t shard, request_event e) noexcept {
  if (c.observer) c.observer->on_event(shard, e);
}

/// Times one phase for config::observer, to its end or its exception.
class phase_timer {
 public:
  phase_timer(const config& c, std::size_t shard, request_phase p) noexcept
      : observer_(c.observer.get()),
        shard_(shard),
        phase_(p),
        started_(observer_ != nullptr ? clock::now() : clock::time_point{}) {}
  phase_timer(const phase_timer&) = delete;
  phase_timer& operator=(const phase_timer&) = delete;
  ~phase_timer() {
    if (observer_ != nullptr) observer_->on_phase(shard_, phase_, clock::now() - started_);
  }

 private:
  observer* observer_;
  std::size_t shard_;
  request_phase phase_;
  clock::time_point started_;
};

}  // namespace

std::string_view to_string(record_state s) noexcept {
  switch (s) {
    case record_state::in_progress:
      return "in_progress";
    case record_state::retryable:
      return "retryable";
    case record_state::succeeded:
      return "succeeded";
    case record_state::failed:
      return "failed";
    case record_state::parked:
      return "parked";
  }
  return "unknown";
}

void validate(const config& c) {
  auto check = [&](std::chrono::milliseconds d, const char* name) {
    if (d <= 0ms) throw config_error(std::string(name) + " must be positive");
    if (d > detail::longest_duration)
      throw config_error(std::string(name) + " must be at most 100 years");
  };
  check(c.lease, "lease");
  check(c.rpc_timeout, "rpc_timeout");
  check(c.retry_window, "retry_window");
  check(c.retention, "retention");
  check(c.parked_retry_after, "parked_retry_after");
  check(c.retry_backoff_base, "retry_backoff_base");
  check(c.retry_backoff_max, "retry_backoff_max");
  check(c.in_doubt_window, "in_doubt_window");
  if (c.retry_backoff_max < c.retry_backoff_base) {
    throw config_error("retry_backoff_max must not be shorter than retry_backoff_base");
  }
  if (c.rpc_timeout >= c.lease) {
    throw config_error(
        "rpc_timeout must be shorter than the lease: Post-RPC has to run "
        "while this attempt still holds the key");
  }
  // A lease barely longer than the RPC leaves Post-RPC no time: the attempt
  // would charge, then lose the lease while recording, every time.
  if (c.lease - c.rpc_timeout < c.lease / 5) {
    throw config_error(
        "rpc_timeout must leave at least a fifth of the lease for recording the "
        "result (lease - rpc_timeout >= lease / 5)");
  }
  // A terminal record purged while its client may still retry would let the
  // retry run as a new request: a second charge.
  if (c.retention < c.retry_window) {
    throw config_error(
        "retention must not be shorter than retry_window: a retry that finds its "
        "record purged runs again as a new request");
  }
  if (c.retention <= c.lease) throw config_error("retention must be longer than the lease");
  if (c.max_attempts < 1) throw config_error("max_attempts must be >= 1");
  if (c.replay_cache_bytes > 0) {
    check(c.replay_cache_ttl, "replay_cache_ttl");
    // A record remembered past its retention keeps its key answered from
    // memory after the purge: bounded by the ttl, which the retention bounds.
    if (c.replay_cache_ttl > c.retention) {
      throw config_error("replay_cache_ttl must not be longer than retention");
    }
  }
}

lease_terms detail::terms_of(const config& c) {
  return {micros(c.lease), micros(c.retry_window), micros(c.retention), micros(c.in_doubt_window)};
}

std::chrono::milliseconds retry_backoff(int attempts, std::chrono::milliseconds base,
                                        std::chrono::milliseconds max, double random01) noexcept {
  // base * 2^(attempts - 1), capped; "equal jitter": half of it fixed, the
  // other half random, so the wait grows with every attempt and completers
  // retrying many keys at once do not all come back at the same instant.
  std::int64_t cap = base.count();
  for (int i = 1; i < attempts && cap < max.count(); ++i) cap *= 2;
  cap = std::min(cap, static_cast<std::int64_t>(max.count()));
  const double r = std::clamp(random01, 0.0, 1.0);
  const std::int64_t fixed = cap / 2;
  const std::int64_t spread = cap - fixed;
  return std::chrono::milliseconds(fixed +
                                   static_cast<std::int64_t>(static_cast<double>(spread) * r));
}

manager::manager(store& s, config c) : store_(s), config_(std::move(c)) {
  validate(config_);
  if (config_.replay_cache_bytes > 0) {
    replay_cache_ = std::make_shared<detail::replay_cache>(config_.replay_cache_bytes,
                                                           config_.replay_cache_ttl);
  }
}

namespace {

/// The wait before a completer retries a key released after `failure`: the
/// backoff, or longer when the failure asked for more than the
/// default_retry_after every retryable error carries, at most the
/// longer of retry_backoff_max and in_doubt_window. Found in review:
/// a gateway that did not deduplicate refused a charge until an earlier one
/// could no longer land (payment::charge_once()), and the completer,
/// back after its shorter backoff each time, spent the request's attempts
/// and parked it.
std::int64_t wait_after(std::int64_t backoff_us, const std::optional<error_info>& failure,
                        const config& c) {
  if (!failure || !failure->retry_after || *failure->retry_after <= default_retry_after) {
    return backoff_us;
  }
  // Capped before it is converted (found in review: milliseconds::max(),
  // "forever", overflowed in microseconds).
  const auto most = std::max(c.retry_backoff_max, c.in_doubt_window);
  return std::max(backoff_us, micros(std::min(*failure->retry_after, most)));
}

/// Best-effort, fenced: releases this attempt's lease so a retry need not wait
/// for it to expire. Harmless when the lease is gone or the record final.
/// Returns false only when it could not run (the database failed): then the
/// lease, if still this attempt's, runs to its end.
/// The caller must hold no transaction of this store: with a pool of one
/// connection a second begin() would wait for the first forever.
bool release_quietly(store& s, const request_id& id, std::string_view owner, std::string_view why,
                     const detail::run_context& ctx, std::int64_t retry_in_us,
                     std::string_view step = {}) noexcept {
  try {
    auto t = detail::begin_record_tx(s, id);
    if (t->release(id, owner, why, retry_in_us, ctx.runner, step)) {
      t->commit();
    } else {
      t->rollback();  // not this attempt's lease any more, or final: nothing to let go
    }
    return true;
  } catch (const std::exception& e) {  // the lease expiry covers it
    log(log_level::warning,
        std::string("could not release a lease early (it will expire): ") + e.what());
  } catch (...) {  // NOLINT(bugprone-empty-catch): the lease expiry covers it
  }
  return false;
}

/// Best-effort, fenced, in a transaction of its own: a history row saying
/// this attempt's outcome is in doubt, for an attempt that keeps its lease
/// but could not record (its Post-RPC or transaction 2 failed), and the
/// time until which its call may still land (mark_in_doubt). Without the
/// row, the next attempt would write it down as `abandoned`. Same caveat as
/// release_quietly: no transaction of this store may be held.
void note_in_doubt_quietly(store& s, const request_id& id, std::string_view owner,
                           std::string_view why, std::string_view runner, std::int64_t window_us,
                           std::int64_t backoff_us, std::string_view step = {}) noexcept {
  try {
    auto t = detail::begin_record_tx(s, id);
    // Under the record's lock (found in review: on MariaDB's READ COMMITTED
    // the fenced INSERT ... SELECT of the history row locks nothing, so a
    // take-over could commit between it and the fenced mark, and neither
    // the row nor the mark was left).
    const std::optional<record> r = t->lock(id);
    if (!r || is_terminal(r->state)) {
      t->rollback();
      return;
    }
    const bool ours = r->state == record_state::in_progress && r->lease_owner == owner;
    if (ours) t->add_history(id, "in_doubt", why, runner, step);
    // When the lease is another's now, the unfenced mark (from now).
    if (t->mark_in_doubt(id, ours ? owner : std::string_view(), window_us, backoff_us)) {
      t->commit();
    } else {
      t->rollback();
    }
  } catch (const std::exception& e) {
    log(log_level::warning, std::string("could not write an in-doubt history row: ") + e.what());
  } catch (...) {  // NOLINT(bugprone-empty-catch): history only
  }
}

/// Best-effort, in a transaction of its own: an attempt whose call is in
/// doubt lost its lease before it could record so; its call may still land
/// (record_tx::mark_in_doubt, unfenced). Same caveat as release_quietly.
/// Returns whether the mark committed.
bool mark_in_doubt_quietly(store& s, const request_id& id, std::int64_t window_us) noexcept {
  try {
    auto t = detail::begin_record_tx(s, id);
    if (t->mark_in_doubt(id, "", window_us, 0)) {
      t->commit();
      return true;
    }
    t->rollback();
  } catch (const std::exception& e) {
    log(log_level::warning, std::string("could not mark a call in doubt: ") + e.what());
  } catch (...) {  // NOLINT(bugprone-empty-catch): the lease expiry is all that is left
  }
  return false;
}

/// Under transaction 2: keeps this attempt's lease until `until` instead of
/// releasing it. Used when the RPC's outcome is unknown: the call may still be
/// running downstream, and a retry must not overlap it. Fenced like release().
bool hold_until(detail::record_tx& t, const request_id& id, std::string_view owner,
                std::chrono::steady_clock::time_point until, const lease_terms& terms,
                std::string_view why, std::string_view runner, std::int64_t backoff_us,
                std::string_view step = {}) {
  const std::optional<record> r = t.lock(id);
  if (!r || r->state != record_state::in_progress || r->lease_owner != owner) return false;
  t.add_history(id, "in_doubt", why, runner, step);
  lease_terms held = terms;
  // To the deadline, not beyond: a downstream service that deduplicates
  // answers an overlapping retry with the first call's outcome (or a 409,
  // in doubt), and the retry's attempt::earlier_may_land_until() tells one
  // that does not how long a "never received" is not to be believed (found
  // in review; holding to the lease's end instead cost the demo's payments
  // their clients' deadlines, and protected nothing more a call could not
  // outlast).
  held.lease_us = std::max<std::int64_t>(
      1000, std::chrono::duration_cast<std::chrono::microseconds>(until - clock::now()).count());
  // A completer waits a backoff beyond the hold: the call may still be
  // running downstream when our side of it timed out (found in review).
  t.take_lease(id, owner, r->attempts, held, held.lease_us + backoff_us);
  // And until its window ends a spent budget does not park it, nor does a
  // person resolve or cancel it, whatever happens to the record meanwhile
  // (found in review: a later attempt that failed safely, or a record
  // without a handler, had no such time).
  return t.mark_in_doubt(id, owner, terms.in_doubt_window_us, backoff_us);
}

/// Under transaction 1's lock: parks a record whose budget is spent, commits,
/// gives the transaction (and its pooled connection) back, and only then
/// tells config::on_parked, once the parking has committed (or, flagged,
/// when its commit is in doubt): a slow hook must not hold a connection. A
/// hook that throws is logged, not passed on.
/// Tells config::observer (the parked event, and attempts_exhausted when
/// that is why) and config::on_parked; what the hook throws is logged, not
/// passed on. Every parking goes through here, the ones whose commit is in
/// doubt too (found in review: a failed compensation's parking was not
/// counted, and the suggested alert on the parked event missed it).
void alert_parked(const store& s, const config& c, const parked_event& event) noexcept {
  if (c.observer) {
    std::size_t shard = 0;
    try {
      shard = shard_for_observer(s, request_id{event.scope, event.key, {}});
    } catch (...) {  // NOLINT(bugprone-empty-catch): out of memory; shard 0 it is
    }
    if (event.reason == codes::attempts_exhausted ||
        event.reason == codes::retry_window_exhausted) {
      c.observer->on_event(shard, request_event::attempts_exhausted);
    }
    c.observer->on_event(shard, request_event::parked);
  }
  if (!c.on_parked) return;
  try {
    c.on_parked(event);
  } catch (const std::exception& e) {
    log(log_level::error, std::string("config::on_parked threw: ") + e.what());
  } catch (...) {
    log(log_level::error, "config::on_parked threw");
  }
}

void park_and_alert(const store& s, std::unique_ptr<detail::record_tx>& t, const request_id& id,
                    const record& r, std::string_view reason, const config& c,
                    std::string_view runner) {
  // An attempt that never finished (it crashed, stalled, or was held in
  // doubt) left no last_error: say so, for the person who decides (found in
  // review: the reason ended "last error: " and nothing).
  const std::string last_error =
      !r.last_error.empty() || r.state != record_state::in_progress
          ? r.last_error
          : "the last attempt did not finish (it crashed, stalled, or its downstream call's "
            "outcome is unknown); ask the downstream service before resolving";
  const std::string why = std::string(reason) + " after " + std::to_string(r.attempts) +
                          " attempts; last error: " + last_error;
  t->park(id, why, runner, {}, micros(c.in_doubt_window));
  parked_event event{id.scope, id.key, r.attempts, std::string(reason), last_error, false};
  try {
    t->commit();
  } catch (const storage_error& e) {
    t.reset();
    if (e.in_doubt()) {
      event.in_doubt = true;
      alert_parked(s, c, event);
    }
    throw;
  }
  t.reset();
  log(log_level::warning, "scope " + id.scope + " key " + id.key + ": parked, " + why);
  alert_parked(s, c, event);
}

/// What Pre-RPC and Post-RPC get as their `tx`: the application's SQL on the
/// library's transaction, and nothing that could end that transaction or
/// outlive it (sql_guard.hpp).
class app_tx final : public tx {
 public:
  explicit app_tx(detail::record_tx& t) : t_(t.statements()) {}
  sql_rows query_values(std::string_view sql, std::span<const sql_value> params) override {
    detail::refuse_transaction_control(sql);
    return t_.query_values(sql, params);
  }
  std::uint64_t execute_values(std::string_view sql, std::span<const sql_value> params) override {
    detail::refuse_transaction_control(sql);
    return t_.execute_values(sql, params);
  }
  [[nodiscard]] std::size_t shard() const override { return t_.shard(); }

 private:
  backend_tx& t_;
};

/// Why the stored Pre-RPC result could not be handed to this attempt.
error_info unreadable_pre_state(std::string_view why) {
  return error_info::of(error_class::unavailable, codes::pre_state_unreadable,
                        "the stored request state cannot be read by this server version; "
                        "retry later")
      .with_internal(std::string(why));
}

std::string reason_of(const error_info& e) {
  return e.code + ": " + (e.internal.empty() ? e.message : e.internal);
}

/// Moves e's Retry-After to `held_until` when that is later.
void retry_no_sooner_than(error_info& e, clock::time_point held_until) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(held_until - clock::now());
  if (left > e.retry_after.value_or(std::chrono::milliseconds(0))) e.retry_after = left;
}

/// Throws a retryable RPC outcome to the caller. An in-doubt one keeps the
/// key to the attempt's deadline (hold_until), or to `held_until` when the
/// key is held longer: a client sent back sooner would only meet 409 and
/// spend attempts.
[[noreturn]] void throw_retryable(error_info e, const attempt& a,
                                  std::optional<clock::time_point> held_until = std::nullopt) {
  if (e.in_doubt()) retry_no_sooner_than(e, held_until.value_or(a.deadline()));
  throw error(e);
}

/// Transaction 1 or the last step's record may have used up the time of the
/// next RPC: one started now could outlive the lease and overlap a take-over.
/// Then the key is let go, or, if it cannot be, held to `lease_end` (the
/// lease's end), and the answer says so (found in review: it said a second,
/// and a client sent back met 409s).
void ensure_time_left(store& s, const request_id& id, std::string_view owner,
                      const detail::run_context& ctx, const attempt& a, std::int64_t backoff,
                      clock::time_point lease_end) {
  if (clock::now() < a.deadline()) return;
  error_info late = error_info::of(error_class::unavailable, codes::deadline_exceeded,
                                   "the request ran out of time before calling downstream; "
                                   "retry with the same key");
  if (!release_quietly(s, id, owner, "the RPC deadline passed before the RPC started", ctx, backoff,
                       a.step())) {
    retry_no_sooner_than(late, lease_end);
  }
  throw error(late);
}

/// What record_after_rpc() needs to know about the attempt.
struct after_rpc {
  store& s;
  const config& c;
  const request_id& id;
  std::string_view owner;
  const detail::run_context& ctx;
  const attempt& a;
  /// Read after the transaction that took or last renewed the lease
  /// committed: the lease ends no later than this plus config::lease.
  clock::time_point leased_by;
  using failure_type = std::optional<error_info>;
  const failure_type& failure;  ///< the RPC's outcome (nullopt: success)
  std::int64_t backoff_us;
  /// A call downstream ran just before (false: a parking or a final record
  /// written after the last call was recorded).
  bool after_a_call = true;
};

/// Transaction 2 of an attempt, or of one step of it: `write` runs the
/// application's Post-RPC SQL and the library's fenced write and says
/// whether the fence held; then it commits. The RPC has run, so a failure
/// here is never "nothing happened": the key is left retryable for the next
/// attempt (is_retry) to finish or, when the RPC's outcome is in doubt, kept
/// to its lease's end with an in_doubt history row; the caller gets
/// post_rpc_failed, lease_lost or the storage error.
void record_after_rpc(const after_rpc& w,
                      const std::function<bool(detail::record_tx&, tx&)>& write) {
  // An in-doubt RPC keeps its lease (to its end): releasing it would let a
  // retry overlap the call that may still run downstream.
  const bool rpc_in_doubt = w.failure && w.failure->in_doubt();
  const phase_timer timed(w.c, w.ctx.shard, request_phase::record);
  // Returns whether the key was let go; false: it is held to the lease's end.
  // A call that failed for a cause nobody classified (class internal: what
  // the RPC threw, under the default config::unclassified) may have failed
  // after its request went out: a reset after sending, an answer that did
  // not parse. Recorded, it is a final failure (stuck, never paid twice);
  // let go unrecorded, it must be marked like a success (found in review:
  // it was released unmarked, and the retry charged at once, with no
  // in-doubt window, at a gateway that does not deduplicate).
  const bool outcome_unknown = !w.failure || w.failure->kind == error_class::internal;
  const auto leave = [&](std::string_view why) {
    if (outcome_unknown && w.after_a_call) {
      // The call succeeded, and the record does not say so (found in
      // review: an operator's cancel, or resolve, was taken at once, and a
      // step that took money was neither recorded nor undone). The record
      // says so, and holds them off for the in-doubt window, while a retry
      // (is_retry: it asks downstream first) records what happened. Marked
      // while the lease is still this attempt's, before the release, and
      // released only once marked: an operator never finds it released and
      // unmarked (found in review). Unreleased, its lease runs out, and the
      // attempt that takes it over marks it in doubt.
      return mark_in_doubt_quietly(w.s, w.id, micros(w.c.in_doubt_window)) &&
             release_quietly(w.s, w.id, w.owner,
                             (w.failure ? "the call failed with an unknown outcome, and recording "
                                          "it failed: "
                                        : "the call succeeded, but recording its result failed: ") +
                                 std::string(why),
                             w.ctx, w.backoff_us, w.a.step());
    }
    if (!rpc_in_doubt)
      return release_quietly(w.s, w.id, w.owner, why, w.ctx, w.backoff_us, w.a.step());
    note_in_doubt_quietly(w.s, w.id, w.owner, reason_of(*w.failure), w.ctx.runner,
                          micros(w.c.in_doubt_window), w.backoff_us, w.a.step());
    return false;
  };
  const std::string where = "scope " + w.id.scope + " key " + w.id.key;
  // An in-doubt call's key is held to the lease's end (leave()): the lease
  // was set inside a transaction that had committed by `leased_by` (found
  // in review: taken as the attempt's deadline plus the rest of the lease,
  // which counts from before that transaction, the answer's Retry-After was
  // short by however long it waited, for a lock or the SQLite writer, and
  // a client retrying on time met a 409 that spent an attempt).
  const clock::time_point lease_end = w.leased_by + w.c.lease;
  // A key that leave() could not let go is held to the lease's end: a retry
  // before then meets 409s that spend its attempts (found in review: after a
  // lock wait on the record row, which kept the release waiting too, the
  // answer said to retry in a second). Hence retry_no_sooner_than(lease_end)
  // below.
  // What Post-RPC threw, carried out of the transaction (which it undoes).
  struct post_rpc_threw {
    std::exception_ptr what;
  };
  try {
    try {
      // The transaction every request makes: a job of the backend
      // (transact), which commits it; throwing undoes it.
      detail::transact(w.s, w.id, [&](detail::record_tx& t) {
        app_tx handler_tx(t);
        bool fenced = false;
        try {
          fenced = write(t, handler_tx);
        } catch (const storage_error&) {
          throw;
        } catch (...) {
          throw post_rpc_threw{std::current_exception()};
        }
        if (!fenced) {
          throw storage_error::lease_lost("the fenced write of attempt " +
                                          std::to_string(w.a.number()) + " matched no lease");
        }
      });  // the commit may throw lease_lost too: a backend that fences in its COMMIT
    } catch (const post_rpc_threw& threw) {
      // Undone, and the connection given back: leave() needs one.
      const error_info cause = classify(threw.what, w.c.unclassified);
      const bool let_go = leave(reason_of(cause));
      log(log_level::error, where + ": Post-RPC failed after the RPC ran: " + reason_of(cause));
      error_info failed =
          error_info::of(rpc_in_doubt ? error_class::in_doubt : error_class::unavailable,
                         codes::post_rpc_failed,
                         "recording the result failed; retry with the same key")
              .with_internal(reason_of(cause));
      if (!let_go) retry_no_sooner_than(failed, lease_end);
      throw_retryable(std::move(failed), w.a, lease_end);
    }
  } catch (const storage_error& e) {
    if (e.code() == codes::lease_lost) {
      // Nothing was recorded; the lease is another attempt's now. If this
      // attempt's call is in doubt it may still land: say so all the same
      // (found in review: a record slow to record its hold lost the mark,
      // and could be parked and resolved while the call could land).
      if (rpc_in_doubt) (void)mark_in_doubt_quietly(w.s, w.id, micros(w.c.in_doubt_window));
      log(log_level::warning, where + ": lease lost before recording; attempt " +
                                  std::to_string(w.a.number()) + " not recorded");
      throw;
    }
    const bool let_go = leave(e.what());
    // An in-doubt call keeps the key to the lease's end whatever the
    // database did, and the client is told so (found in review: a failed
    // recording after an in-doubt RPC answered storage_unavailable or
    // post_rpc_failed, not in doubt, with a Retry-After of a second, and the
    // client came back into 409s, spending its attempts).
    if (e.retryable() && !rpc_in_doubt) {
      // A storage_error, as callers read it, that says to keep the key
      // (found in review: "retry later" alone, after the RPC ran; a client
      // that makes a key per submission would charge again).
      error_info same_key = e.info();
      same_key.message =
          "the database is unavailable and the result was not recorded; retry "
          "later with the same key";
      // Not when the COMMIT is in doubt: if it landed, the key is finished
      // and a retry is answered at once (found in review: its client, told
      // to wait to the lease's end, could give up on a recorded payment).
      if (!let_go && !e.in_doubt()) retry_no_sooner_than(same_key, lease_end);
      throw storage_error(std::move(same_key));
    }
    // (From here the call is in doubt, or the error permanent.) The COMMIT's
    // own doubt: if it landed, hold_until() held the key to the attempt's
    // deadline only (a longer Retry-After could outlast the client's
    // deadline; an early one costs a 409 that says how long).
    if (e.in_doubt()) throw_retryable(e.info(), w.a);
    // Even a permanent database error here leaves the key retryable: the
    // RPC ran, so the client must come back and let a retry finish it.
    log(log_level::error, where + ": recording the result failed after the RPC ran: " + e.what());
    throw_retryable(error_info::of(rpc_in_doubt ? error_class::in_doubt : error_class::unavailable,
                                   codes::post_rpc_failed,
                                   "recording the result failed; retry with the same key")
                        .with_internal(e.what()),
                    w.a, lease_end);
  }
}

std::vector<std::string> step_names(const detail::flow_phases& f) {
  std::vector<std::string> out;
  out.reserve(f.steps.size());
  for (const auto& s : f.steps) out.emplace_back(s.name);
  return out;
}

}  // namespace

// A multi-step request after transaction 1 (orpheus/steps.hpp): what the
// attempt holds while it runs the steps.
struct manager::flow_run {
  const request_id& id;
  const detail::flow_phases& flow;
  const detail::run_context& ctx;
  lease_terms terms;
  std::string owner;
  int number = 0;
  /// When the transaction that took or last renewed the lease began: each
  /// step's RPC must end rpc_timeout after it, inside the lease.
  clock::time_point started;
  /// Read after that transaction committed: the lease ends no later than
  /// this plus config::lease (after_rpc::leased_by).
  clock::time_point leased_by;
  detail::progress progress;
  /// attempt::earlier_may_land_until() of every step's attempt.
  clock::time_point earlier_may_land_until{};
};

response manager::run(const request_id& id, const detail::phases& p, const process_options& options,
                      const detail::run_context& ctx) {
  try {
    return run_observed(id, p, options, ctx);
  } catch (const resume_with_handler& r) {
    // The same request, begun through another handler registered here: it
    // goes on with that handler's RPC and Post-RPC on its stored Pre-RPC
    // result, as its completer would, and is observed once, there. Its
    // record exists; if it is purged meanwhile, nothing new is started.
    const auto own = handlers_.find(r.name);  // registered: run_unobserved() found it
    const registered_handler& h = own->second;
    detail::run_context resumed{own->first, h.version, ctx.runner};
    resumed.resumed = true;
    process_options rest = options;
    rest.wait_for = r.wait_left;
    const pre_function none = [](tx&) -> nlohmann::json { throw_in_progress(0); };
    return h.run(*this, id, rest, resumed, none);
  }
}

response manager::run_observed(const request_id& id, const detail::phases& p,
                               const process_options& options, const detail::run_context& ctx) {
  observer* const o = config_.observer.get();
  if (o == nullptr) return run_unobserved(id, p, options, ctx);
  // The key's shard once per call (with several shards, a SHA-256), for
  // every report of it.
  detail::run_context observed = ctx;
  observed.shard = shard_for_observer(store_, id);
  request_outcome outcome = request_outcome::refused;
  try {
    response r = run_unobserved(id, p, options, observed);
    outcome = r.replayed ? request_outcome::replayed : request_outcome::recorded;
    o->on_request(observed.shard, outcome);
    return r;
  } catch (const resume_with_handler&) {
    throw;  // not an outcome: run() goes on, and that run is observed
  } catch (...) {
    try {
      outcome = outcome_of(classify(std::current_exception(), config_.unclassified));
    } catch (...) {  // NOLINT(bugprone-empty-catch): out of memory: refused it is
    }
    o->on_request(observed.shard, outcome);
    throw;
  }
}

void validate(const process_options& o) {
  // Found in review: milliseconds::max() ("until done") overflowed the
  // clock, and a negative wait was taken for none.
  if (o.wait_for < 0ms || o.wait_for > std::chrono::hours(24)) {
    throw config_error("process_options::wait_for must be 0 to 24 hours");
  }
  if (o.retention) {
    if (*o.retention < 0ms) throw config_error("process_options::retention is negative");
    // Found in review: "forever" (milliseconds::max()) overflowed in micros(),
    // and a record's retention is added to the clock by later writes too.
    if (*o.retention > detail::longest_duration) {
      throw config_error("process_options::retention must be at most 100 years");
    }
  }
}

response manager::run_unobserved(const request_id& id, const detail::phases& p,
                                 const process_options& options, const detail::run_context& ctx) {
  validate(id);  // bad input: before any database work
  validate(options);
  const auto wait_until = clock::now() + options.wait_for;
  lease_terms terms = detail::terms_of(config_);
  if (options.retention) terms.retention_us = micros(*options.retention);
  auto poll = 5ms;

  // 0. A terminal record this process read before (config::replay_cache_bytes).
  // On a miss, `read_at` keeps a record read after a purge here out of it.
  // Not for the completer, which claimed the record in the database: a
  // cached answer is of a record since purged and made again (found in
  // review: the completer counted it finished, and nothing ran).
  std::uint64_t read_at = 0;
  detail::replay_cache::clock::time_point read_started{};
  if (replay_cache_) {
    const auto known = replay_cache_->find(id);
    if (known.hit && ctx.runner != runner_completer) {
      if (known.hit->fingerprint != id.fingerprint) throw_mismatch();
      return replayed(known.hit->recorded);
    }
    read_at = known.generation;
    read_started = known.at;
  }

  // A few rounds at most: a round ends early only when another request
  // changed the record between our read and our write.
  for (int round = 0; round < 8; ++round) {
    // 1. Replay fast path: one read, no transaction, no lock.
    std::optional<record> seen;
    try {
      const phase_timer timed(config_, ctx.shard, request_phase::read);
      seen = store_.read(id);
    } catch (const storage_error& e) {
      if (e.retryable()) throw;
      throw_refused_on_held_key(e, std::nullopt, /*read_in_full=*/false);
    }
    if (seen) {
      if (replay_cache_) replay_cache_->put(id, *seen, read_at, read_started);  // terminal ones
      if (seen->fingerprint != id.fingerprint) throw_mismatch();
      if (is_terminal(seen->state)) return replay_of(*seen);
      if (seen->state == record_state::parked) throw_parked(config_.parked_retry_after);
      if (lease_is_live(*seen)) {
        if (clock::now() >= wait_until) {
          throw_in_progress(seen->lease_expires_us - seen->db_now_us);
        }
        std::this_thread::sleep_for(std::min<clock::duration>(poll, wait_until - clock::now()));
        poll = std::min(poll * 2, 200ms);
        --round;  // waiting is not a lost race
        continue;
      }
    }

    // The completer resumes records; it never starts one. A record gone
    // since its claim (finished and purged, or resolved and purged) is not
    // its business: running it as new would run the RPC of a request that
    // was already answered.
    if (!seen && ctx.runner == runner_completer) throw_in_progress(0);

    // 2. Acquire (transaction 1).
    const auto started = clock::now();
    // What transaction 1 leaves for the RPC: the attempt number, and the
    // Pre-RPC result loaded into the handler's type by p.load.
    int attempt_number = 0;
    // Until when an earlier attempt's call may still land downstream
    // (attempt::earlier_may_land_until()); the epoch when none can.
    clock::time_point earlier_may_land_until{};
    // The fencing token of this attempt: 128 random bits, so that no other
    // process can forge it and record over this attempt.
    std::string owner = random_token();
    std::optional<error_info> unreadable;      // a take-over that cannot go on
    std::optional<detail::progress> progress;  // a multi-step request's recovery point
    // What transaction 1 did to the key, told to config::observer once it
    // committed: a new record, or a take-over or retry of an old one.
    std::optional<request_event> acquired;
    // The record as read under the lock, when it was: the fast read has no
    // in_doubt_until_us.
    std::optional<record> held;
    try {
      const phase_timer timed(config_, ctx.shard, request_phase::acquire);
      if (!seen) {
        // A new request, in the transaction every new key makes: a job of
        // the backend (transact), which commits it. Throwing undoes it.
        struct inserted_first {};  // by another request: undo, read again
        try {
          detail::transact(store_, id, [&](detail::record_tx& t) {
            if (!t.insert(id, owner, terms, ctx.handler, ctx.handler_version)) {
              throw inserted_first{};
            }
            app_tx handler_tx(t);
            // Pre-RPC runs here, once per key, with the lease row.
            nlohmann::json pre;
            try {
              pre = p.pre(handler_tx);
            } catch (const storage_error&) {
              throw;
            } catch (...) {
              throw error(classify(std::current_exception(), config_.unclassified));
            }
            const std::string stored = detail::encode_pre_state(pre);
            // The RPC gets what a retry would get: the stored form, read back.
            // A result whose JSON does not read back as its type (a NaN, an
            // asymmetric to_json) is a handler bug: roll back, nothing happened.
            try {
              p.load(detail::decode_pre_state(stored).value());
            } catch (const std::exception& e) {
              const error_info why =
                  error_info::of(error_class::internal, codes::pre_state_unreadable,
                                 "the Pre-RPC result does not read back as its own type")
                      .with_internal(e.what());
              log(log_level::error, "scope " + id.scope + " key " + id.key + ": " + reason_of(why));
              throw error(why);
            }
            if (p.flow) progress = detail::progress{step_names(*p.flow), p.flow->pivot, {}, {}, {}};
            // A multi-step request's Pre-RPC result is stored with a prefix
            // that no single-RPC reader (of this or an older version) can
            // read: such a reader never resumes it as one RPC.
            if (!t.save_pre_state(
                    id, owner,
                    progress ? std::string(detail::steps_pre_state_prefix) + stored : stored,
                    progress ? detail::encode_progress(*progress) : "")) {
              throw storage_error::permanent("lease row vanished inside its own transaction");
            }
          });
        } catch (const inserted_first&) {
          continue;
        }
        attempt_number = 1;
        acquired = request_event::new_key;
      } else {
        auto t = detail::begin_record_tx(store_, id);
        held = t->lock(id);
        const std::optional<record>& locked = held;
        if (!locked) {  // purged between the read and the lock
          t->rollback();
          continue;
        }
        // A decision read under the lock is answered only once what it read
        // is durable: commit(), not rollback(), so that a failure of the
        // write it read (a SQLite batch it shares) reaches this answer too.
        if (locked->fingerprint != id.fingerprint) {
          t->commit();
          throw_mismatch();
        }
        if (is_terminal(locked->state)) {
          t->commit();
          return replay_of(*locked);
        }
        // Expired lease or retryable: a retry, unless the budget is spent.
        const bool no_attempts =
            locked->attempts - locked->attempts_before_requeue >= config_.max_attempts;
        const bool no_window = locked->db_now_us >= locked->retry_until_us;
        // A record made through a registered handler is resumed only with
        // that handler's phases: another RPC on its stored Pre-RPC result
        // would be another operation under the same key (found in review).
        // Its payload matched, so this is its client's retry, through
        // another handler (a server that changed flows, or an older one)
        // or plain process(): it goes on with the record's own handler when
        // this manager has it (which refuses an older version of itself,
        // below), as a replay of a finished record answers the record's own
        // response. Never a 422 (found in review: a client told its payment
        // was the wrong payload could pay again under a new key, while the
        // completer finished the first).
        const bool begun_elsewhere = !locked->handler.empty() && locked->handler != ctx.handler;
        if (begun_elsewhere) {
          const auto own = handlers_.find(locked->handler);
          if (ctx.runner != runner_completer && !ctx.resumed && own != handlers_.end()) {
            t->commit();
            throw resume_with_handler{own->first,
                                      std::max(0ms, std::chrono::ceil<std::chrono::milliseconds>(
                                                        wait_until - clock::now()))};
          }
          // Not resumed here. Parked, or out of budget with no live lease,
          // it is answered below as any record (found in review: after a
          // rollback to a build without its handler, such a record was
          // answered 409 "in progress, retry in 1 s" for ever: never
          // parked, no alert, though nothing of the handler runs to park).
          if (locked->state != record_state::parked &&
              (lease_is_live(*locked) || !(no_attempts || no_window))) {
            t->commit();
            throw_begun_elsewhere(locked->handler, locked->handler_version);
          }
        }
        if (locked->state == record_state::parked) {
          t->commit();
          throw_parked(config_.parked_retry_after);
        }
        if (lease_is_live(*locked)) {
          t->rollback();
          continue;  // the fast path decides: wait or 409
        }
        // A completer finishes the request with the retention it was made
        // with (found in review: the default could purge it early), and a
        // client's retry with no less (found in review: a retry made
        // without the first call's longer process_options::retention
        // recorded the default, and a later retry after that ran as new).
        if (locked->retention_us > 0) {
          terms.retention_us = ctx.runner == runner_completer
                                   ? locked->retention_us
                                   : std::max(terms.retention_us, locked->retention_us);
        }
        // An attempt whose lease ran out under it: it crashed, stalled past
        // its lease, or was held in doubt (then it has a history row). Its
        // call may still land, whatever the later attempts do (found in
        // review: a crash left no in_doubt_until_us).
        if (locked->state == record_state::in_progress) {
          t->add_abandoned(id);
          t->mark_in_doubt(id, "", terms.in_doubt_window_us, 0);
        }
        // A call downstream whose outcome was unknown may still land
        // (record::in_doubt_until_us). A spent budget does not park the
        // record meanwhile, nor is it made retryable for want of a readable
        // Pre-RPC result (found in review: either let it be resolved by hand
        // while the call could still land; first for a client's retry, then
        // for a record without a handler, or one whose in-doubt attempt was
        // followed by one that failed safely).
        // Records held by a binary from before schema version 5 have no such
        // time: the rule of those binaries (a client's retry, an attempt
        // in progress whose next_attempt_us is still ahead) holds for them.
        const bool held_in_doubt =
            locked->in_doubt_until_us > locked->db_now_us ||
            (ctx.runner != runner_completer && locked->state == record_state::in_progress &&
             locked->next_attempt_us > locked->db_now_us);
        if (no_attempts || no_window) {
          if (held_in_doubt) {
            t->rollback();
            throw_in_progress((locked->in_doubt_until_us > locked->db_now_us
                                   ? locked->in_doubt_until_us
                                   : locked->next_attempt_us) -
                              locked->db_now_us);
          }
          // Any version may park: nothing of the handler runs.
          park_and_alert(store_, t, id, *locked,
                         no_attempts ? codes::attempts_exhausted : codes::retry_window_exhausted,
                         config_, ctx.runner);
          throw_parked(config_.parked_retry_after);
        }
        if (begun_elsewhere) {  // not reached: its budget is spent (above)
          t->rollback();
          throw_begun_elsewhere(locked->handler, locked->handler_version);
        }
        // Nor is it resumed by an older version of the handler (found in
        // review: during a rolling deploy or after a rollback, a client's
        // retry reaching an older server ran the older RPC on the newer
        // request's stored Pre-RPC result, another call under the same
        // downstream key). Left as it is for a server that has the version,
        // as the completer leaves it: retryable, nothing asked downstream,
        // nothing written. Once its budget is spent it is parked (above).
        if (!locked->handler.empty() && locked->handler_version > ctx.handler_version) {
          t->rollback();
          throw error(unreadable_pre_state(
              "recorded by version " + std::to_string(locked->handler_version) + " of handler '" +
              locked->handler + "'; this server has version " +
              std::to_string(ctx.handler_version)));
        }
        // The stored Pre-RPC result must still read as the handler's type
        // (a rolling deploy may have changed it). If it does not, nothing is
        // asked downstream and nothing is final: the key stays retryable, the
        // reason is recorded, and a server that can read it will finish it.
        // So must its kind: a multi-step request is resumed only as one, a
        // single-RPC request never as steps (a deploy may have changed which
        // one a handler is).
        try {
          std::string_view text = locked->pre_state;
          const bool as_steps = text.starts_with(detail::steps_pre_state_prefix);
          if (as_steps != (p.flow != nullptr)) {
            throw std::runtime_error(as_steps ? "the request was recorded as steps"
                                              : "the request was recorded as a single RPC");
          }
          if (as_steps) text.remove_prefix(detail::steps_pre_state_prefix.size());
          const auto stored = detail::decode_pre_state(text);
          if (!stored) throw std::runtime_error("not JSON, not the binary form");
          p.load(*stored);
          if (p.flow) {
            // The steps as recorded must be this build's (a deploy may have
            // changed them): never resumed at a guessed step.
            progress = detail::decode_progress(locked->recovery_point);
            if (!progress) throw std::runtime_error("the recovery point does not read");
            if (progress->names != step_names(*p.flow) || progress->pivot != p.flow->pivot) {
              throw std::runtime_error("the request was recorded with other steps");
            }
          }
        } catch (const std::exception& e) {
          unreadable = unreadable_pre_state(e.what());
        }
        // A record of an older version of the handler may read on a server
        // that still has that version (a rolling deploy): the completer
        // leaves it as it is for one, as it leaves a newer version's (its
        // claim put it off by a lease), and it is parked once its budget is
        // spent (above). Found in review: a deploy that changed a flow's
        // steps had its completers park every request of the older version
        // in flight, past the pivot too; and then, had they released it,
        // each pass would have claimed it again and written its history.
        const bool left_for_older_version = unreadable && ctx.runner == runner_completer &&
                                            !locked->handler.empty() &&
                                            locked->handler_version < ctx.handler_version;
        if (left_for_older_version) {
          t->rollback();
          throw error(*unreadable);
        }
        if (unreadable && ctx.runner == runner_completer && !held_in_doubt) {
          // Nobody is waiting for this answer, and a later pass would meet
          // the same result: a person decides (requeue after a deploy).
          park_and_alert(store_, t, id, *locked, codes::pre_state_unreadable, config_, ctx.runner);
          throw_parked(config_.parked_retry_after);
        }
        if (unreadable && held_in_doubt) {
          t->rollback();  // left as it is (above); the unreadable answer follows
          // Not sooner than a parking could be decided (found in review).
          unreadable->retry_after =
              std::chrono::ceil<std::chrono::milliseconds>(std::chrono::microseconds(
                  std::max(locked->in_doubt_until_us, locked->next_attempt_us) -
                  locked->db_now_us));
        } else if (unreadable) {
          t->take_lease(id, owner, locked->attempts, terms);
          t->release(id, owner, reason_of(*unreadable), backoff_us(locked->attempts), ctx.runner);
          t->commit();
        } else {
          t->take_lease(id, owner, locked->attempts + 1, terms);
          // An attempt of a newer version of the record's handler makes it
          // that version's: an older server, still running in a rolling
          // deploy or after a rollback, no longer runs it (found in review:
          // only the version that inserted it counted, so after a newer
          // version had called downstream, perhaps under other downstream
          // keys, an older one could call again under its own).
          if (!locked->handler.empty() && locked->handler == ctx.handler &&
              locked->handler_version < ctx.handler_version) {
            t->raise_handler_version(id, ctx.handler_version);
          }
          attempt_number = locked->attempts + 1;
          // The later of the record's in-doubt time and, for an attempt
          // whose lease ran out under it (marked above), now plus the window.
          std::int64_t may_land_us = locked->in_doubt_until_us;
          if (locked->state == record_state::in_progress) {
            may_land_us = std::max(may_land_us, locked->db_now_us + terms.in_doubt_window_us);
          }
          // From a time read after the database's clock was (found in
          // review: `started`, before transaction 1 began, ended the window
          // early by however long the transaction waited).
          if (may_land_us > locked->db_now_us) {
            earlier_may_land_until =
                clock::now() + std::chrono::microseconds(may_land_us - locked->db_now_us);
          }
          acquired = locked->state == record_state::in_progress ? request_event::takeover
                                                                : request_event::retry;
          t->commit();
        }
      }
    } catch (const storage_error& e) {
      // Nothing happened, or (in doubt) a lease may have landed: release it
      // so the retry need not wait for the lease to expire.
      if (e.in_doubt()) {
        release_quietly(store_, id, owner, e.what(), ctx, backoff_us(attempt_number));
      }
      // A new key's refusal is final: nothing of it was kept (the
      // application's own bad SQL in Pre-RPC, say). Not a held key's.
      if (seen && !e.retryable() && e.code() != codes::nested_transaction) {
        throw_refused_on_held_key(e, held ? held : seen, /*read_in_full=*/held.has_value());
      }
      throw;
    }
    // After transaction 1 committed: its lease ends no later than this plus
    // config::lease.
    const auto leased_by = clock::now();
    if (acquired) note(config_, ctx.shard, *acquired);
    if (unreadable) {
      log(log_level::error, "scope " + id.scope + " key " + id.key + ": " + reason_of(*unreadable));
      throw error(*unreadable);
    }

    if (p.flow) {  // a multi-step request: its steps, from the first unfinished one
      flow_run f{id,
                 *p.flow,
                 ctx,
                 terms,
                 owner,
                 attempt_number,
                 started,
                 leased_by,
                 std::move(*progress),
                 earlier_may_land_until};
      return run_flow(f);
    }

    // 3. RPC, outside any transaction, with a deadline before the lease ends
    // (the lease started after `started`, on the database clock).
    const attempt a(id, attempt_number, started + config_.rpc_timeout, {},
                    ctx.runner == runner_completer, earlier_may_land_until);
    // Transaction 1 may have taken the whole RPC budget (a stalled database).
    ensure_time_left(store_, id, owner, ctx, a, backoff_us(attempt_number),
                     leased_by + config_.lease);
    std::optional<error_info> failure;
    {
      const phase_timer timed(config_, ctx.shard, request_phase::rpc);
      failure = p.rpc(a);
    }

    // 4. Record (transaction 2), fenced by the owner token.
    const std::int64_t backoff = wait_after(backoff_us(a.number()), failure, config_);
    response r;
    record_after_rpc({store_, config_, id, owner, ctx, a, leased_by, failure, backoff},
                     [&](detail::record_tx& t, tx& handler_tx) {
                       r = p.post(handler_tx, a);
                       if (!failure) {
                         return t.finish(id, owner, record_state::succeeded, r, {}, terms);
                       }
                       if (!failure->retryable()) {
                         return t.finish(id, owner, record_state::failed, r, reason_of(*failure),
                                         terms);
                       }
                       if (failure->in_doubt()) {
                         // The downstream outcome is unknown and the call may still be
                         // running there: keep the key until this attempt's deadline.
                         return hold_until(t, id, owner, a.deadline(), terms, reason_of(*failure),
                                           ctx.runner, backoff);
                       }
                       return t.release(id, owner, reason_of(*failure), backoff, ctx.runner);
                     });
    if (failure && failure->retryable()) throw_retryable(*failure, a);
    return r;
  }
  // Only a storm of inserts and purges on one key gets here.
  throw_in_progress(0);
}

response manager::run_flow(flow_run& f) {
  if (f.progress.compensating) return compensate_and_fail(f, nullptr, std::nullopt);
  const auto& steps = f.flow.steps;
  const after_rpc::failure_type no_failure;
  for (std::size_t i = f.progress.done.size(); i < steps.size(); ++i) {
    const detail::step_phase& s = steps[i];
    const attempt a(f.id, f.number, f.started + config_.rpc_timeout, s.name,
                    f.ctx.runner == runner_completer, f.earlier_may_land_until);
    const std::int64_t backoff = backoff_us(f.number);
    ensure_time_left(store_, f.id, f.owner, f.ctx, a, backoff, f.leased_by + config_.lease);
    nlohmann::json result;
    std::optional<error_info> failure;
    {
      const phase_timer timed(config_, f.ctx.shard, request_phase::rpc);
      failure = s.rpc(a, step_results(f.progress.done), result);
    }
    if (!failure) {
      // The step's SQL and its result commit together: the recovery point,
      // with the lease renewed for the next step, or after the last step the
      // response.
      const bool last = i + 1 == steps.size();
      f.started = clock::now();
      // Later steps and the step's SQL get what a retry would get: the
      // stored form read back (a NaN reads back as null on both).
      f.progress.done.emplace_back(
          std::string(s.name),
          detail::decode_pre_state(detail::encode_pre_state(result)).value_or(nullptr));
      response r;
      record_after_rpc({store_, config_, f.id, f.owner, f.ctx, a, f.leased_by, no_failure, backoff},
                       [&](detail::record_tx& t, tx& handler_tx) {
                         if (s.post) s.post(handler_tx, a, f.progress.done.back().second);
                         if (!last) {
                           return t.save_progress(f.id, f.owner,
                                                  detail::encode_progress(f.progress), f.terms);
                         }
                         r = f.flow.respond(handler_tx, a, step_results(f.progress.done));
                         return t.finish(f.id, f.owner, record_state::succeeded, r, {}, f.terms);
                       });
      if (last) return r;
      f.leased_by = clock::now();  // the lease was renewed with the recovery point
      continue;
    }
    if (!failure->retryable() && i <= f.flow.pivot) {
      // Up to the pivot a failure for good goes backwards: the finished
      // steps are compensated, then the failure is recorded.
      f.progress.compensating = *failure;
      f.progress.failed_step = s.name;
      return compensate_and_fail(f, &a, failure);
    }
    // Past the pivot a failure of unknown cause (class internal: what the
    // step threw and did not classify, under the default
    // config::unclassified) may have come after its call went out: a reset
    // after sending, an answer that did not parse. It is held in doubt like
    // a timeout, so that the next attempt neither overlaps the call nor,
    // within the in-doubt window, believes a "never received" (found in
    // review: it was released at once, and a completer sent the step again
    // a second later, to a bank that does not deduplicate). Up to the pivot
    // it sent the request backwards above, and failed it: stuck, not paid
    // twice.
    if (failure->kind == error_class::internal) {
      failure = error_info::of(error_class::in_doubt, codes::step_failed_after_pivot,
                               "the request is past its point of no return and a later step "
                               "failed with an unknown outcome; it will be finished, retry "
                               "later with the same key")
                    .with_internal(reason_of(*failure));
    }
    // Safe to retry; or past the pivot, where the request only goes forward:
    // it stays retryable (a completer or the client tries again, and a
    // person decides once it runs out of attempts).
    // A longer Retry-After than the backoff (a throttled or in-doubt step)
    // is waited for, as for a single RPC (found in review: a step's or a
    // compensation's was not, and the completer spent the attempts inside
    // it and parked the request).
    const std::int64_t wait = wait_after(backoff, failure, config_);
    error_info told = *failure;
    if (!failure->retryable()) {
      told = error_info::of(error_class::unavailable, codes::step_failed_after_pivot,
                            "the request is past its point of no return and a later step "
                            "failed; it will be finished, retry later with the same key")
                 .with_internal("step " + std::string(s.name) + ": " + reason_of(*failure));
      // The backoff its completer waits, for the client too (found in
      // review: a client told nothing retried at once and spent the
      // attempts on a step that had just failed for good).
      told.retry_after = std::chrono::ceil<std::chrono::milliseconds>(
          std::chrono::microseconds(std::max<std::int64_t>(wait, 1000)));
    }
    record_after_rpc({store_, config_, f.id, f.owner, f.ctx, a, f.leased_by, failure, wait},
                     [&](detail::record_tx& t, tx&) {
                       const std::string why = std::string(s.name) + ": " + reason_of(*failure);
                       if (failure->in_doubt()) {
                         return hold_until(t, f.id, f.owner, a.deadline(), f.terms, why,
                                           f.ctx.runner, wait, s.name);
                       }
                       return t.release(f.id, f.owner, why, wait, f.ctx.runner, s.name);
                     });
    throw_retryable(told, a);
  }
  // Every step finished and the response was not recorded: cannot happen
  // (the last step records it), unless the recovery point was edited by hand.
  throw error(unreadable_pre_state("the recovery point says every step finished"));
}

response manager::compensate_and_fail(flow_run& f, const attempt* failed_step,
                                      const std::optional<error_info>& step_failure) {
  const error_info failure = *f.progress.compensating;
  const auto& steps = f.flow.steps;
  const auto index_of = [&](std::string_view name) {
    for (std::size_t i = 0; i < steps.size(); ++i) {
      if (steps[i].name == name) return i;
    }
    return steps.size();  // decode_progress checked the names: not reached
  };
  const bool any_compensation = std::any_of(
      f.progress.done.begin(), f.progress.done.end(),
      [&](const auto& d) { return static_cast<bool>(steps[index_of(d.first)].compensate); });
  const after_rpc::failure_type no_failure;
  if (any_compensation && failed_step != nullptr) {
    // The way back is recorded before it starts: a crash from here on
    // resumes the compensations, never the steps.
    f.started = clock::now();
    record_after_rpc(
        {store_, config_, f.id, f.owner, f.ctx, *failed_step, f.leased_by, step_failure,
         backoff_us(f.number)},
        [&](detail::record_tx& t, tx&) {
          if (!t.save_progress(f.id, f.owner, detail::encode_progress(f.progress), f.terms)) {
            return false;
          }
          // The history says why the request turned back, and at which step.
          t.add_history(f.id, "compensating", reason_of(failure), f.ctx.runner,
                        failed_step->step());
          return true;
        });
    f.leased_by = clock::now();  // the lease was renewed with the way back
  }
  while (!f.progress.done.empty()) {
    const detail::step_phase& s = steps[index_of(f.progress.done.back().first)];
    if (!s.compensate) {  // nothing to undo; on a resume it is passed over again
      f.progress.done.pop_back();
      continue;
    }
    const attempt a(f.id, f.number, f.started + config_.rpc_timeout, s.name,
                    f.ctx.runner == runner_completer, f.earlier_may_land_until);
    const std::int64_t backoff = backoff_us(f.number);
    ensure_time_left(store_, f.id, f.owner, f.ctx, a, backoff, f.leased_by + config_.lease);
    const std::optional<error_info> err = s.compensate(a, f.progress.done.back().second);
    const std::string why =
        std::string(s.name) + " (compensation): " + (err ? reason_of(*err) : std::string());
    if (!err) {
      f.started = clock::now();
      f.progress.done.pop_back();
      record_after_rpc({store_, config_, f.id, f.owner, f.ctx, a, f.leased_by, no_failure, backoff},
                       [&](detail::record_tx& t, tx&) {
                         return t.save_progress(f.id, f.owner, detail::encode_progress(f.progress),
                                                f.terms);
                       });
      f.leased_by = clock::now();  // the lease was renewed with the recovery point
      continue;
    }
    if (err->retryable()) {
      const std::int64_t wait = wait_after(backoff, err, config_);  // as for a step
      record_after_rpc({store_, config_, f.id, f.owner, f.ctx, a, f.leased_by, err, wait},
                       [&](detail::record_tx& t, tx&) {
                         if (err->in_doubt()) {
                           return hold_until(t, f.id, f.owner, a.deadline(), f.terms, why,
                                             f.ctx.runner, wait, s.name);
                         }
                         return t.release(f.id, f.owner, why, wait, f.ctx.runner, s.name);
                       });
      throw_retryable(*err, a);
    }
    // A compensation that cannot succeed (a void refused after a capture):
    // the library cannot undo the step; a person decides.
    const std::string parked_why = std::string(codes::compensation_failed) + " at attempt " +
                                   std::to_string(f.number) + ": " + why;
    parked_event event{f.id.scope, f.id.key, f.number, std::string(codes::compensation_failed),
                       why,        false};
    try {
      record_after_rpc(
          {store_, config_, f.id, f.owner, f.ctx, a, f.leased_by, no_failure, backoff,
           /*after_a_call=*/false},
          [&](detail::record_tx& t, tx&) {
            if (!t.save_progress(f.id, f.owner, detail::encode_progress(f.progress), f.terms)) {
              return false;
            }
            // No window of its own: this attempt holds the lease and its
            // compensation answered for good, so no call of it is in flight
            // (found in review: the window made resolve() refuse a person
            // for the lease plus in_doubt_window). An earlier attempt's
            // in-doubt window is kept: park() only moves it later.
            t.park(f.id, parked_why, f.ctx.runner, s.name, 0);
            return true;
          });
    } catch (const storage_error& e) {
      // The parking may have landed: say so (an attempt that finds the
      // request still going backwards parks it again and alerts again).
      if (e.in_doubt()) {
        event.in_doubt = true;
        alert_parked(store_, config_, event);
      }
      throw;
    }
    log(log_level::warning, "scope " + f.id.scope + " key " + f.id.key + ": parked, " + parked_why);
    alert_parked(store_, config_, event);
    throw_parked(config_.parked_retry_after);
  }
  // Everything undone: the failure is the request's answer from now on.
  const attempt a(
      f.id, f.number, f.started + config_.rpc_timeout,
      failed_step != nullptr ? failed_step->step() : std::string_view(f.progress.failed_step),
      f.ctx.runner == runner_completer, f.earlier_may_land_until);
  // When this attempt's step has just failed, its failure goes with it: if
  // the recording fails, a failure of unknown outcome is marked in doubt
  // before the key is let go (record_after_rpc), as above.
  response r;
  record_after_rpc({store_, config_, f.id, f.owner, f.ctx, a, f.leased_by,
                    failed_step != nullptr ? step_failure : no_failure, backoff_us(f.number),
                    /*after_a_call=*/failed_step != nullptr},
                   [&](detail::record_tx& t, tx& handler_tx) {
                     r = f.flow.failed(handler_tx, a, failure);
                     return t.finish(f.id, f.owner, record_state::failed, r, reason_of(failure),
                                     f.terms);
                   });
  return r;
}

std::int64_t manager::backoff_us(int attempts) const {
  thread_local std::mt19937_64 random{std::random_device{}()};
  const double r = std::uniform_real_distribution<double>(0.0, 1.0)(random);
  return micros(retry_backoff(std::max(attempts, 1), config_.retry_backoff_base,
                              config_.retry_backoff_max, r));
}

void manager::add_handler(std::string name, int version, registered_handler h) {
  if (name.empty() || name.size() > 64 || !std::all_of(name.begin(), name.end(), [](char c) {
        return detail::is_ascii_alnum(c) || c == '_' || c == '-' || c == '.';
      })) {
    throw config_error("a handler name is 1 to 64 characters of A-Z a-z 0-9 _ - .");
  }
  if (version < 1) throw config_error("a handler version is >= 1");
  h.version = version;
  if (!handlers_.emplace(std::move(name), std::move(h)).second) {
    throw config_error("a handler with this name is registered already");
  }
}

std::vector<std::pair<std::string, int>> manager::handlers() const {
  std::vector<std::pair<std::string, int>> out;
  for (const auto& [name, h] : handlers_) out.emplace_back(name, h.version);
  return out;
}

const manager::registered_handler& manager::handler_named(std::string_view name) const {
  const auto h = handlers_.find(name);
  if (h == handlers_.end()) {
    throw config_error("no handler '" + std::string(name) + "' is registered");
  }
  return h->second;
}

response manager::complete(const request_id& id, std::string_view handler, int version) {
  const auto h = handlers_.find(handler);
  if (h != handlers_.end() && version <= h->second.version) {
    // Never called: run() inserts nothing for the completer.
    const pre_function no_pre = [](tx&) -> nlohmann::json {
      throw std::logic_error("the completer never starts a request");
    };
    return h->second.run(
        *this, id, {}, detail::run_context{h->first, h->second.version, runner_completer}, no_pre);
  }
  // Recorded by a handler this build does not have (another service on the
  // same tables, or a newer version): never guessed at; a person decides.
  validate(id);
  auto t = detail::begin_record_tx(store_, id);
  const std::optional<record> r = t->lock(id);
  const bool due = r && r->fingerprint == id.fingerprint &&
                   (r->state == record_state::retryable ||
                    (r->state == record_state::in_progress && !lease_is_live(*r)));
  if (!due) {
    t->rollback();
    throw_in_progress(0);
  }
  record why = *r;
  why.last_error = "handler '" + std::string(handler) + "' version " + std::to_string(version) +
                   " is not registered here" +
                   (h == handlers_.end()
                        ? ""
                        : " (this build has version " + std::to_string(h->second.version) + ")") +
                   (r->last_error.empty() ? "" : "; " + r->last_error);
  park_and_alert(store_, t, id, why, codes::handler_unknown, config_, runner_completer);
  throw_parked(config_.parked_retry_after);
}

std::size_t manager::purge_expired(std::size_t batch_limit) {
  std::size_t n = 0;
  // A shard that fails does not stop the others (found in review: with one
  // shard down or not yet migrated, the shards after it were never purged).
  std::exception_ptr first_failure;
  for (std::size_t s = 0; s < store_.shard_count(); ++s) {
    try {
      n += purge_expired_on(s, batch_limit);
    } catch (const error&) {
      if (!first_failure) first_failure = std::current_exception();
    }
  }
  if (first_failure) std::rethrow_exception(first_failure);
  return n;
}

std::size_t manager::purge_expired_on(std::size_t shard, std::size_t batch_limit) {
  std::size_t n = 0;
  // Which keys went is not known here: forget every remembered record once
  // any may have gone, also when the purge fails part way (its statement may
  // have deleted rows before failing).
  try {
    n = store_.purge_expired(shard, batch_limit);
  } catch (...) {
    if (replay_cache_) replay_cache_->clear();
    throw;
  }
  if (n > 0 && replay_cache_) replay_cache_->clear();
  return n;
}

}  // namespace orpheus
