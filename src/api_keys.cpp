#include "orpheus/api_keys.hpp"

#include <filesystem>
#include <fstream>
#include <vector>

#include "orpheus/error.hpp"
#include "sha256.hpp"

namespace orpheus {
namespace {

bool is_alnum(char c) noexcept {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

bool is_space(char c) noexcept { return c == ' ' || c == '\t'; }

bool is_one_of(char c, std::string_view set) noexcept {
  return set.find(c) != std::string_view::npos;
}

// RFC 7235's token68: 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"="
bool is_token68(std::string_view s) noexcept {
  std::size_t i = 0;
  while (i < s.size() && (is_alnum(s[i]) || is_one_of(s[i], "-._~+/"))) ++i;
  if (i == 0) return false;
  while (i < s.size() && s[i] == '=') ++i;
  return i == s.size();
}

bool is_client_id(std::string_view s) noexcept {
  if (s.empty() || s.size() > api_keys::max_client_bytes) return false;
  for (const char c : s) {
    if (!is_alnum(c) && !is_one_of(c, "-._:@")) return false;
  }
  return true;
}

std::string digest_of(std::string_view key) {
  const auto d = detail::sha256(key);
  return {reinterpret_cast<const char*>(d.data()), d.size()};
}

// The fields of a line, split at runs of spaces and tabs.
std::vector<std::string_view> fields_of(std::string_view line) {
  std::vector<std::string_view> out;
  std::size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && is_space(line[i])) ++i;
    const std::size_t start = i;
    while (i < line.size() && !is_space(line[i])) ++i;
    if (i > start) out.push_back(line.substr(start, i - start));
  }
  return out;
}

}  // namespace

std::optional<std::string_view> bearer_token(std::string_view authorization) noexcept {
  constexpr std::string_view scheme = "bearer";
  if (authorization.size() <= scheme.size() || !is_space(authorization[scheme.size()])) {
    return std::nullopt;
  }
  for (std::size_t i = 0; i < scheme.size(); ++i) {
    const char c = authorization[i];
    if ((c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c) != scheme[i]) {
      return std::nullopt;
    }
  }
  std::string_view token = authorization.substr(scheme.size());
  while (!token.empty() && is_space(token.front())) token.remove_prefix(1);
  while (!token.empty() && is_space(token.back())) token.remove_suffix(1);
  if (!is_token68(token)) return std::nullopt;
  return token;
}

api_keys api_keys::parse(std::string_view text) {
  api_keys keys;
  std::unordered_map<std::string, std::size_t> line_of_digest;
  std::unordered_map<std::string, std::size_t> line_of_bare;  // without '=' padding
  std::size_t number = 0;
  while (!text.empty()) {
    ++number;
    const std::size_t end = text.find('\n');
    std::string_view line = text.substr(0, end);
    text.remove_prefix(end == std::string_view::npos ? text.size() : end + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    const auto fields = fields_of(line);
    if (fields.empty() || fields[0].front() == '#') continue;
    const std::string where = "api keys, line " + std::to_string(number) + ": ";
    if (fields.size() != 2) throw config_error(where + "want `<key> <client>`");
    const std::string_view key = fields[0];
    if (!is_token68(key)) {
      throw config_error(where + "the key has a character a bearer token cannot carry");
    }
    // The '=' padding counts toward the length, not toward the minimum
    // (found in review: "a===============" passed a minimum that exists so
    // that keys cannot be guessed).
    const std::size_t unpadded =
        key.find('=') == std::string_view::npos ? key.size() : key.find('=');
    if (unpadded < min_key_bytes || key.size() > max_key_bytes) {
      throw config_error(where + "the key must be " + std::to_string(min_key_bytes) + " to " +
                         std::to_string(max_key_bytes) + " characters, '=' padding not counted");
    }
    if (!is_client_id(fields[1])) {
      throw config_error(where + "the client must be 1 to " + std::to_string(max_client_bytes) +
                         " letters, digits and -._:@");
    }
    std::string digest = digest_of(key);
    if (const auto seen = line_of_digest.find(digest); seen != line_of_digest.end()) {
      throw config_error(where + "the same key as line " + std::to_string(seen->second));
    }
    // Keys that differ in their '=' padding alone are one secret to a
    // reader of base64 (found in review: whoever held the first could act as
    // the client of the second by adding "==").
    const std::string bare_digest = digest_of(key.substr(0, unpadded));
    if (const auto seen = line_of_bare.find(bare_digest); seen != line_of_bare.end()) {
      throw config_error(where + "the same key as line " + std::to_string(seen->second) +
                         " but for its '=' padding");
    }
    line_of_bare.emplace(bare_digest, number);
    line_of_digest.emplace(digest, number);
    keys.client_by_digest_.emplace(std::move(digest), std::string(fields[1]));
  }
  if (keys.client_by_digest_.empty()) throw config_error("api keys: the table has no keys");
  return keys;
}

api_keys api_keys::load(const std::string& path) {
  // Not a stream's `<< rdbuf()`: a directory opens, reads nothing and says
  // nothing, and a read error part way would load half a table (review).
  std::error_code ec;
  const bool regular = std::filesystem::is_regular_file(path, ec);
  const auto size = regular ? std::filesystem::file_size(path, ec) : 0;
  std::ifstream in(path, std::ios::binary);
  std::string text(ec ? 0 : size, '\0');
  if (!regular || ec || !in || !in.read(text.data(), static_cast<std::streamsize>(text.size())) ||
      in.peek() != std::ifstream::traits_type::eof()) {
    throw config_error("api keys: cannot read " + path + " (a regular file that stays put)");
  }
  return parse(text);
}

std::optional<std::string> api_keys::client_of(std::string_view authorization) const {
  const auto token = bearer_token(authorization);
  if (!token || token->size() > max_key_bytes) return std::nullopt;
  const auto found = client_by_digest_.find(digest_of(*token));
  if (found == client_by_digest_.end()) return std::nullopt;
  return found->second;
}

}  // namespace orpheus
