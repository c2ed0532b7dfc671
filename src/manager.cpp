// The algorithm of SPEC section 4. Read this file top to bottom: run() is the
// whole story, the helpers below it are its steps.
#include "orpheus/manager.hpp"

#include <openssl/rand.h>

#include <algorithm>
#include <array>
#include <thread>

namespace orpheus {
namespace {

using clock = std::chrono::steady_clock;

std::int64_t micros(std::chrono::milliseconds d) {
  return std::chrono::duration_cast<std::chrono::microseconds>(d).count();
}

lease_terms terms_of(const config& c) {
  return {micros(c.lease), micros(c.retry_window), micros(c.retention)};
}

// The fencing token of one attempt: 128 random bits. Unpredictable, so that
// no other process can forge a token and record over this attempt.
std::string new_owner_token() {
  std::array<unsigned char, 16> bytes{};
  if (RAND_bytes(bytes.data(), static_cast<int>(bytes.size())) != 1) {
    throw storage_error::transient("no randomness for a lease token");
  }
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  for (const unsigned char b : bytes) {
    out += digits[b >> 4];
    out += digits[b & 0xF];
  }
  return out;
}

[[noreturn]] void throw_mismatch() {
  throw error(error_info{422, std::string(codes::fingerprint_mismatch),
                         "this idempotency key was used with another request "
                         "payload",
                         false, false, std::nullopt});
}

[[noreturn]] void throw_in_progress(std::int64_t remaining_us) {
  // Round up, so a client that honours Retry-After never comes back early.
  const auto ms = std::max<std::int64_t>(1, (remaining_us + 999) / 1000);
  throw error(error_info{409, std::string(codes::in_progress),
                         "another request with this idempotency key is in "
                         "progress",
                         true, false, std::chrono::milliseconds(ms)});
}

response replay_of(const record& r) {
  response out = r.recorded;
  out.replayed = true;
  return out;
}

bool lease_is_live(const record& r) {
  return r.state == record_state::in_progress && r.lease_expires_us > r.db_now_us;
}

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
  }
  return "unknown";
}

void validate(const config& c) {
  if (c.lease <= 0ms) throw config_error("lease must be positive");
  if (c.rpc_timeout <= 0ms) throw config_error("rpc_timeout must be positive");
  if (c.rpc_timeout >= c.lease) {
    throw config_error(
        "rpc_timeout must be shorter than the lease: Post-RPC has to run "
        "while this attempt still holds the key");
  }
  if (c.retry_window <= 0ms) {
    throw config_error("retry_window must be positive");
  }
  if (c.retention <= 0ms) throw config_error("retention must be positive");
  if (c.max_attempts < 1) throw config_error("max_attempts must be >= 1");
}

manager::manager(store& s, config c) : store_(s), config_(c) { validate(config_); }

namespace {

/// Best-effort, fenced: releases this attempt's lease so a retry need not wait
/// for it to expire. Harmless when the lease is gone or the record final.
void release_quietly(store& s, const request_id& id, std::string_view owner,
                     std::string_view why) noexcept {
  try {
    auto t = s.begin(id);
    if (t->release(id, owner, why)) {
      t->commit();
    } else {
      t->rollback();
    }
  } catch (...) {  // NOLINT(bugprone-empty-catch): the lease expiry covers it
  }
}

}  // namespace

response manager::run(const request_id& id, const detail::phases& p,
                      const process_options& options) {
  validate(id);  // bad input: before any database work
  const auto wait_until = clock::now() + options.wait_for;
  lease_terms terms = terms_of(config_);
  if (options.retention) {
    if (*options.retention < 0ms) throw config_error("process_options::retention is negative");
    terms.retention_us = micros(*options.retention);
  }
  auto poll = 5ms;

  // A few rounds at most: a round ends early only when another request
  // changed the record between our read and our write.
  for (int round = 0; round < 8; ++round) {
    // 1. Replay fast path: one read, no transaction, no lock.
    std::optional<record> seen = store_.read(id);
    if (seen) {
      if (seen->fingerprint != id.fingerprint) throw_mismatch();
      if (is_terminal(seen->state)) return replay_of(*seen);
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

    // 2. Acquire (transaction 1).
    const auto started = clock::now();
    // What transaction 1 leaves for the RPC: the attempt and the Pre-RPC result.
    int attempt_number = 0;
    nlohmann::json pre_state;
    std::string owner = new_owner_token();
    try {
      auto t = store_.begin(id);
      std::optional<record> locked;
      if (!seen) {
        if (t->insert(id, owner, terms)) {
          // A new request: Pre-RPC runs here, once per key, with the lease row.
          nlohmann::json pre;
          try {
            pre = p.pre(*t);
          } catch (const storage_error&) {
            throw;
          } catch (...) {
            t->rollback();
            throw error(classify(std::current_exception(), config_.unclassified));
          }
          if (!t->save_pre_state(id, owner, pre.dump())) {
            throw storage_error::permanent(
                "lease row vanished inside its own "
                "transaction");
          }
          attempt_number = 1;
          pre_state = std::move(pre);
        } else {
          t->rollback();  // someone inserted first; drop its lock and re-read
          continue;
        }
      } else {
        locked = t->lock(id);
        if (!locked) {  // purged between the read and the lock
          t->rollback();
          continue;
        }
        if (locked->fingerprint != id.fingerprint) throw_mismatch();
        if (is_terminal(locked->state)) {
          t->rollback();
          return replay_of(*locked);
        }
        if (lease_is_live(*locked)) {
          t->rollback();
          continue;  // the fast path decides: wait or 409
        }
        // Expired lease or retryable: a retry, unless the budget is spent.
        const bool no_attempts = locked->attempts >= config_.max_attempts;
        const bool no_window = locked->db_now_us >= locked->retry_until_us;
        if (no_attempts || no_window) {
          const error_info why{
              500,
              std::string(no_attempts ? codes::attempts_exhausted : codes::retry_window_exhausted),
              "the request did not complete within its retry budget; its "
              "outcome downstream may need manual reconciliation",
              false,
              false,
              std::nullopt};
          response r = problem_response(why);
          t->take_lease(id, owner, locked->attempts, terms);
          t->finish(id, owner, record_state::failed, r, why.message, terms);
          t->commit();
          return r;
        }
        pre_state = nlohmann::json::parse(locked->pre_state, nullptr, /*allow_exceptions=*/false);
        if (pre_state.is_discarded()) {
          throw storage_error::permanent("the stored Pre-RPC result of this key is unreadable");
        }
        t->take_lease(id, owner, locked->attempts + 1, terms);
        attempt_number = locked->attempts + 1;
      }
      t->commit();
    } catch (const storage_error& e) {
      // Nothing happened, or (in doubt) a lease may have landed: release it
      // so the retry need not wait for the lease to expire.
      if (e.in_doubt()) release_quietly(store_, id, owner, e.what());
      throw;
    }

    // 3. RPC, outside any transaction, with a deadline before the lease ends
    // (the lease started after `started`, on the database clock).
    const attempt a(id, attempt_number, started + config_.rpc_timeout);
    const std::optional<error_info> failure = p.rpc(a, pre_state);

    // 4. Record (transaction 2), fenced by the owner token.
    try {
      auto t = store_.begin(id);
      response r;
      try {
        r = p.post(*t, a);
      } catch (const storage_error&) {
        throw;
      } catch (...) {
        // The RPC ran: this is never "nothing happened". Leave the key
        // retryable so the next attempt (is_retry) can finish it.
        t->rollback();
        const error_info cause = classify(std::current_exception(), config_.unclassified);
        release_quietly(store_, id, owner, cause.message);
        throw error(error_info{503, std::string(codes::post_rpc_failed),
                               "recording the result failed: " + cause.message, true, false,
                               std::chrono::milliseconds(1000)});
      }
      bool fenced = false;
      if (!failure) {
        fenced = t->finish(id, owner, record_state::succeeded, r, {}, terms);
      } else if (!failure->retryable) {
        fenced = t->finish(id, owner, record_state::failed, r,
                           failure->code + ": " + failure->message, terms);
      } else {
        fenced = t->release(id, owner, failure->code + ": " + failure->message);
      }
      if (!fenced) {
        t->rollback();
        throw error(error_info{409, std::string(codes::lease_lost),
                               "this attempt's lease expired and was taken "
                               "over; its result was not recorded",
                               true, false, std::chrono::milliseconds(1000)});
      }
      t->commit();
      if (failure && failure->retryable) throw error(*failure);
      return r;
    } catch (const storage_error& e) {
      release_quietly(store_, id, owner, e.what());
      if (e.retryable()) throw;
      // Even a permanent database error here leaves the key retryable: the
      // RPC ran, so the client must come back and let a retry finish it.
      throw error(error_info{503, std::string(codes::post_rpc_failed),
                             std::string("recording the result failed: ") + e.what(), true, false,
                             std::chrono::milliseconds(1000)});
    }
  }
  // Only a storm of inserts and purges on one key gets here.
  throw_in_progress(0);
}

std::size_t manager::purge_expired(std::size_t batch_limit) {
  std::size_t n = 0;
  for (std::size_t s = 0; s < store_.shard_count(); ++s) {
    n += store_.purge_expired(s, batch_limit);
  }
  return n;
}

}  // namespace orpheus
