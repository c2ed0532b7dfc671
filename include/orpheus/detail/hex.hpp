// Hex, once: lowercase hex encoding of bytes (fingerprints, tokens, keys) and
// the value of one hex digit (percent-decoding).
//
//   detail::lowercase_hex(digest)          // "9f86d0..."
//   detail::hex_digit_value('B')           // 11; -1 for a non-digit
//
// Header-only, so that the adapters, tests and fuzz targets use this copy
// rather than a loop of their own. Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

namespace orpheus::detail {

inline constexpr std::string_view lowercase_hex_digits = "0123456789abcdef";

/// `bytes` as 2 * bytes.size() lowercase hex characters.
[[nodiscard]] inline std::string lowercase_hex(std::span<const unsigned char> bytes) {
  std::string out(bytes.size() * 2, '0');
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    out[2 * i] = lowercase_hex_digits[bytes[i] >> 4U];
    out[2 * i + 1] = lowercase_hex_digits[bytes[i] & 0xFU];
  }
  return out;
}

/// The bytes of `text` as lowercase hex.
[[nodiscard]] inline std::string lowercase_hex(std::string_view text) {
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-reinterpret-cast): char and unsigned char alias
  return lowercase_hex({reinterpret_cast<const unsigned char*>(text.data()), text.size()});
}

/// True when `text` is exactly `length` lowercase hex characters.
[[nodiscard]] inline bool is_lowercase_hex(std::string_view text, std::size_t length) noexcept {
  return text.size() == length && text.find_first_not_of(lowercase_hex_digits) == text.npos;
}

/// The value of hex digit `c` (either case), or -1 when it is not one.
[[nodiscard]] constexpr int hex_digit_value(char c) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace orpheus::detail
