// What every fuzz target shares: splitting an input into parts, and a check
// that reports a broken property and aborts (libFuzzer keeps the input).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "orpheus/detail/hex.hpp"
#include "orpheus/request.hpp"

namespace orpheus::fuzz {

/// The input as text.
inline std::string_view text_of(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

/// `in` cut at every `separator`: at most `max_parts` parts, the last one
/// keeping the rest (separators included).
inline std::vector<std::string_view> split(std::string_view in, std::string_view separator,
                                           std::size_t max_parts) {
  std::vector<std::string_view> parts;
  while (parts.size() + 1 < max_parts) {
    const auto at = in.find(separator);
    if (at == std::string_view::npos) break;
    parts.push_back(in.substr(0, at));
    in.remove_prefix(at + separator.size());
  }
  parts.push_back(in);
  return parts;
}

/// `s` as the string view type of the library that takes it (Boost 1.74's
/// Beast takes boost::string_view, not std::string_view).
template <class View>
View as(std::string_view s) {
  return View(s.data(), s.size());
}

/// Printable: the bytes of `s` with anything outside 0x20..0x7E as \xNN.
inline std::string shown(std::string_view s) {
  std::string out;
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7F && u != '\\') {
      out += c;
    } else {
      out += "\\x" + orpheus::detail::lowercase_hex(std::string_view(&c, 1));
    }
  }
  return out;
}

[[noreturn]] inline void broken(const char* file, int line, const char* property,
                                const std::string& detail) {
  std::fprintf(stderr, "%s:%d: property broken: %s\n  %s\n", file, line, property, detail.c_str());
  std::abort();
}

}  // namespace orpheus::fuzz

/// Aborts with `detail` (a std::string expression) when `property` is false.
#define FUZZ_CHECK(property, detail)                                                   \
  do {                                                                                 \
    if (!(property)) ::orpheus::fuzz::broken(__FILE__, __LINE__, #property, (detail)); \
  } while (false)

namespace orpheus::fuzz {

/// The fingerprint targets' shared property: the input is one body, or two
/// split at "\n--\n"; `check(body)` checks one body and returns its payload,
/// and two bodies whose canonical forms (`canonical(body)`) have one
/// fingerprint must have one payload.
template <class Check, class Canonical>
void one_fingerprint_one_payload(const std::uint8_t* data, std::size_t size, Check check,
                                 Canonical canonical) {
  const auto bodies = split(text_of(data, size), "\n--\n", 2);
  const auto a = check(bodies[0]);
  if (bodies.size() == 2) {
    const auto b = check(bodies[1]);
    const bool same_fingerprint = orpheus::fingerprint_of(canonical(bodies[0])) ==
                                  orpheus::fingerprint_of(canonical(bodies[1]));
    FUZZ_CHECK(!same_fingerprint || a == b,
               "one fingerprint for " + shown(bodies[0]) + " and " + shown(bodies[1]));
  }
}

}  // namespace orpheus::fuzz
