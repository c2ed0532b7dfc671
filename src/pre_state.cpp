#include "pre_state.hpp"

#include <openssl/evp.h>

#include <cstdint>
#include <vector>

namespace orpheus::detail {
namespace {

constexpr std::string_view cbor_prefix = "cbor:";

}  // namespace

std::string encode_pre_state(const nlohmann::json& value) {
  try {
    return value.dump();
  } catch (const nlohmann::json::type_error&) {
    // 316: a string that is not valid UTF-8. Fall through to the binary form.
  }
  const std::vector<std::uint8_t> cbor = nlohmann::json::to_cbor(value);
  std::string out(cbor_prefix);
  const std::size_t at = out.size();
  out.resize(at + 4 * ((cbor.size() + 2) / 3) + 1);  // + the NUL EVP writes
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data() + at), cbor.data(),
                                static_cast<int>(cbor.size()));
  out.resize(at + static_cast<std::size_t>(n));
  return out;
}

std::optional<nlohmann::json> decode_pre_state(std::string_view stored) {
  if (stored.substr(0, cbor_prefix.size()) != cbor_prefix) {
    auto j = nlohmann::json::parse(stored, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return std::nullopt;
    return j;
  }
  const std::string_view b64 = stored.substr(cbor_prefix.size());
  if (b64.size() % 4 != 0) return std::nullopt;
  std::vector<std::uint8_t> bytes(b64.size() / 4 * 3 + 1);
  const int n = EVP_DecodeBlock(bytes.data(), reinterpret_cast<const unsigned char*>(b64.data()),
                                static_cast<int>(b64.size()));
  if (n < 0) return std::nullopt;
  // EVP_DecodeBlock counts the '=' padding as zero bytes: drop them.
  auto len = static_cast<std::size_t>(n);
  for (std::size_t i = b64.size(); i > 0 && b64[i - 1] == '=' && len > 0; --i) --len;
  bytes.resize(len);
  // from_cbor() throws out_of_range despite allow_exceptions = false when an
  // array or map announces more elements than a vector can hold (issue 9,
  // fuzzing): that is corrupt text too.
  try {
    auto j = nlohmann::json::from_cbor(bytes, /*strict=*/true, /*allow_exceptions=*/false);
    if (j.is_discarded()) return std::nullopt;
    return j;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

}  // namespace orpheus::detail
