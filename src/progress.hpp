// The recovery point of a multi-step request (orpheus/steps.hpp): which
// steps it has, which one is the pivot, the results of the finished ones,
// and, once a step before the pivot failed for good (or a person cancelled
// the request), the failure whose compensations are running.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "orpheus/error.hpp"

namespace orpheus::detail {

/// Put before a multi-step request's stored Pre-RPC result. JSON text
/// cannot start with 's' and the binary form starts with "cbor:", so no
/// single-RPC reader, of this version or an older one, reads it: an older
/// server answers pre_state_unreadable (its completer parks the request)
/// instead of resuming it as one RPC during a rolling deploy.
inline constexpr std::string_view steps_pre_state_prefix = "steps:";

struct progress {
  std::vector<std::string> names;
  std::size_t pivot = 0;
  /// The finished steps, in order, with their results. While compensating,
  /// the ones not compensated yet (a compensated step is taken off the end).
  std::vector<std::pair<std::string, nlohmann::json>> done;
  /// Set once the request goes backwards: the failure it will record.
  std::optional<error_info> compensating;
  /// The step that failed for good ("" for a cancel).
  std::string failed_step;

  /// The pivot is the next step to run or behind: it may have run (an
  /// attempt that died in it, or whose record failed after it), so the
  /// request may only go forward, unless the pivot itself fails for good.
  [[nodiscard]] bool pivot_may_have_run() const { return done.size() >= pivot; }
};

/// The stored text (the Pre-RPC result's encoding: JSON, or CBOR when a
/// result holds bytes that are not UTF-8).
[[nodiscard]] std::string encode_progress(const progress& p);
/// nullopt when `stored` is not a recovery point this version writes.
[[nodiscard]] std::optional<progress> decode_progress(std::string_view stored);

}  // namespace orpheus::detail
