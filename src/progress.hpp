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

struct progress {
  std::vector<std::string> names;
  std::size_t pivot = 0;
  /// The finished steps, in order, with their results. While compensating,
  /// the ones not compensated yet (a compensated step is taken off the end).
  std::vector<std::pair<std::string, nlohmann::json>> done;
  /// Set once the request goes backwards: the failure it will record.
  std::optional<error_info> compensating;

  /// Past the pivot: the request only goes forward.
  [[nodiscard]] bool past_pivot() const { return done.size() > pivot && !compensating; }
};

/// The stored text (the Pre-RPC result's encoding: JSON, or CBOR when a
/// result holds bytes that are not UTF-8).
[[nodiscard]] std::string encode_progress(const progress& p);
/// nullopt when `stored` is not a recovery point this version writes.
[[nodiscard]] std::optional<progress> decode_progress(std::string_view stored);

}  // namespace orpheus::detail
