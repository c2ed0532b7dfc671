// ASCII case, once: for names compared without case (HTTP header names,
// host names, a server's status variable names).
//
//   detail::ascii_lower("Idempotency-Key")   // "idempotency-key"
//
// Header-only, like hex.hpp, so that the core, the adapters and the stores
// use this copy rather than a loop of their own. Bytes outside ASCII are
// kept as they are (std::tolower of the "C" locale). Thread safety: pure.
#pragma once

#include <algorithm>
#include <cctype>
#include <string>
#include <string_view>

namespace orpheus::detail {

/// `s` with ASCII letters in lower case.
[[nodiscard]] inline std::string ascii_lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

}  // namespace orpheus::detail
