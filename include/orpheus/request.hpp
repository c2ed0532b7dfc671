// The identity of an idempotent request, the response Orpheus records and
// replays, and the Attempt handed to the RPC phase.
//
//   orpheus::request_id id{"tenant-42/payments.create", key,
//                          orpheus::fingerprint_of(canonical_request)};
//
// A key is identified by (scope, key): one caller never sees, replays or
// blocks another caller's key. The fingerprint is a SHA-256 of the canonical
// request; re-using a key with another fingerprint is rejected (422). Keys
// and scopes follow one rule, defined here once (invalid_key_reason()) and
// applied by the core, the Beast middleware and the client helper alike.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "orpheus/error.hpp"

namespace orpheus {

inline constexpr std::size_t max_key_bytes = 255;
inline constexpr std::size_t max_scope_bytes = 255;

struct request_id {
  std::string scope;
  std::string key;
  /// 64 lowercase hex characters (SHA-256); see fingerprint_of().
  std::string fingerprint;
};

/// The key rule, the one definition every part of Orpheus applies (this
/// core's validate(), the Beast middleware, the client helper): a key is 1 to
/// max_key_bytes (255) bytes of printable ASCII (0x20..0x7E) with no space at
/// either end. Inner spaces and quotes are allowed; a leading or trailing
/// space is not, because HTTP drops the white space around a header value and
/// " k" would arrive as "k", another request's key (issue 9, fuzzing).
/// Returns why `key` breaks the rule ("idempotency key is empty", ...), or
/// nullopt when it keeps it.
[[nodiscard]] std::optional<std::string> invalid_key_reason(std::string_view key);

/// The same rule for a scope (max_scope_bytes); the reason names the scope.
[[nodiscard]] std::optional<std::string> invalid_scope_reason(std::string_view scope);

/// The Idempotency-Key header value that carries `key` (a key that keeps the
/// key rule): the key itself, or, when it starts with '"' or holds a comma,
/// an RFC 8941 sf-string ("..." with \" and \\ escapes), which
/// key_of_header_value() reads back as the key (sent bare, "abc" would read
/// as abc, issue 9, and a,b as a list).
[[nodiscard]] std::string key_header_value(std::string_view key);

/// The key an Idempotency-Key header value carries, as the IETF draft reads
/// it: a bare token, or an RFC 8941 sf-string whose only escapes are \" and
/// \\, with optional spaces and tabs around either. nullopt when the
/// quoting is broken, or when a bare value holds a comma: that is a list of
/// values (the header sent twice, joined by a proxy as RFC 9110 allows), not
/// one key. The key rule is not checked here: validate() does.
[[nodiscard]] std::optional<std::string> key_of_header_value(std::string_view value);

/// Throws bad_input_error (400, not retryable) when the key breaks the key
/// rule (invalid_key_reason(), code invalid_key), the scope breaks it
/// (invalid_scope_reason(), code invalid_scope), or the fingerprint is not 64
/// lowercase hex characters (invalid_fingerprint); the first bad part is
/// named. Touches no database.
///
/// Every validate(x) of Orpheus and its adapters has this contract: it checks
/// `x`, changes nothing, and throws (bad_input_error for a request's input,
/// config_error for settings: see validate(const config&) and
/// client::validate(const retry_policy&)).
void validate(const request_id& id);

/// SHA-256 of `canonical`, as 64 lowercase hex characters.
[[nodiscard]] std::string fingerprint_of(std::string_view canonical);

/// `bytes` random bytes from OpenSSL's CSPRNG (seeded by the kernel, safe
/// across fork), as 2 * bytes lowercase hex characters: lease owner tokens,
/// keys a server makes up, ids nobody may guess. Throws a retryable
/// orpheus::error when no randomness can be had.
[[nodiscard]] std::string random_token(std::size_t bytes = 16);

/// A response as recorded and replayed: status, headers in order, body bytes.
struct response {
  int status = 200;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  /// True when this answer was replayed from the record, not produced now.
  bool replayed = false;

  friend bool operator==(const response& a, const response& b) {
    return a.status == b.status && a.headers == b.headers && a.body == b.body;
  }
};

/// Whether `status` can be a request's recorded answer: a final HTTP status,
/// 200 to 599. A Post-RPC answer with any other (a 1xx is interim, never an
/// answer) is refused like a Post-RPC that throws: undone, the key left
/// retryable (codes::post_rpc_failed), the reason in the record's last_error.
[[nodiscard]] constexpr bool is_final_status(int status) noexcept {
  return status >= 200 && status <= 599;
}

/// What the RPC phase knows about the attempt it runs in.
///
/// Lifetime: valid for the duration of one process() call.
class attempt {
 public:
  attempt(const request_id& id, int number, std::chrono::steady_clock::time_point deadline,
          std::string_view step = {}, bool by_completer = false,
          std::chrono::steady_clock::time_point earlier_may_land_until = {})
      : id_(&id),
        number_(number),
        deadline_(deadline),
        step_(step),
        by_completer_(by_completer),
        earlier_may_land_until_(earlier_may_land_until) {}

  [[nodiscard]] const request_id& id() const noexcept { return *id_; }
  /// 1 for the first attempt; a take-over after a crash or a retryable
  /// failure counts up.
  [[nodiscard]] int number() const noexcept { return number_; }
  /// True when an earlier attempt may have reached the downstream service:
  /// ask it what became of that attempt before acting again.
  [[nodiscard]] bool is_retry() const noexcept { return number_ > 1; }
  /// The RPC must be finished by then; it ends before the lease does.
  [[nodiscard]] std::chrono::steady_clock::time_point deadline() const noexcept {
    return deadline_;
  }
  /// A key derived from (scope, key, name), the same on every attempt, to pass
  /// to a downstream service so that it deduplicates too.
  [[nodiscard]] std::string downstream_key(std::string_view name) const;
  /// The step this RPC (or compensation) belongs to, in a multi-step request
  /// (orpheus/steps.hpp); empty for process()'s single RPC. In a
  /// compensation it names the step being undone: give the compensation's
  /// downstream key a name of its own, or a service that deduplicates by key
  /// answers it with the step's own outcome.
  [[nodiscard]] std::string_view step() const noexcept { return step_; }
  /// True when a completer (orpheus/completer.hpp) runs this attempt, not a
  /// client's request.
  [[nodiscard]] bool by_completer() const noexcept { return by_completer_; }
  /// Until when a call of an earlier attempt whose outcome is unknown (it
  /// timed out, its answer was lost, its process died) may still be acted
  /// on downstream: config::in_doubt_window after that attempt's lease (or,
  /// for an attempt whose lease ran out under it, after this take-over). A
  /// downstream service that says it never received that call is not to be
  /// believed before then, unless it deduplicates by downstream_key() (a
  /// second call is then answered with the first one's outcome). The epoch
  /// (the default) when no earlier call is in doubt.
  [[nodiscard]] std::chrono::steady_clock::time_point earlier_may_land_until() const noexcept {
    return earlier_may_land_until_;
  }

 private:
  const request_id* id_;
  int number_;
  std::chrono::steady_clock::time_point deadline_;
  std::string_view step_;
  bool by_completer_ = false;
  std::chrono::steady_clock::time_point earlier_may_land_until_{};
};

}  // namespace orpheus
