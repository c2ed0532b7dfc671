// ASCII character classes and case, once: for names compared without case
// (HTTP header names, host names, a server's status variable names), SQL
// keywords and the names the library validates.
//
//   detail::ascii_lower("Idempotency-Key")   // "idempotency-key"
//
// Never the C library's <cctype> functions, which follow the process's
// LC_CTYPE (found in review: under tr_TR.UTF-8 glibc's toupper('i') is 'i',
// so the SQL guard read "commit" as "COMMiT" and let it through; under
// tr_TR.ISO-8859-9 tolower('I') is 0xFD, and isalnum(0xE9) is true). Bytes
// outside ASCII are kept as they are and belong to no class here: what the
// "C" locale does, whatever locale the application set.
//
// Header-only, like hex.hpp, so that the core, the adapters and the stores
// use this copy rather than a loop of their own. Thread safety: pure.
#pragma once

#include <string>
#include <string_view>

namespace orpheus::detail {

[[nodiscard]] constexpr char ascii_lower(char c) noexcept {
  return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
}

[[nodiscard]] constexpr char ascii_upper(char c) noexcept {
  return c >= 'a' && c <= 'z' ? static_cast<char>(c - 'a' + 'A') : c;
}

/// A-Z, a-z or 0-9.
[[nodiscard]] constexpr bool is_ascii_alnum(char c) noexcept {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
}

/// Space, tab, LF, VT, FF or CR: std::isspace of the "C" locale.
[[nodiscard]] constexpr bool is_ascii_space(char c) noexcept {
  return c == ' ' || (c >= '\t' && c <= '\r');
}

/// `s` with ASCII letters in lower case.
[[nodiscard]] inline std::string ascii_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = ascii_lower(c);
  return out;
}

/// Whether `a` and `b` are the same but for the case of ASCII letters.
[[nodiscard]] constexpr bool ascii_iequals(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (ascii_lower(a[i]) != ascii_lower(b[i])) return false;
  }
  return true;
}

}  // namespace orpheus::detail
