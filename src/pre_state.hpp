// How a Pre-RPC result is stored: faithfully, whatever bytes it holds.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace orpheus::detail {

/// The stored text of a Pre-RPC result: its JSON when the JSON can be written,
/// else "cbor:" and the base64 of its CBOR. JSON text cannot start with 'c',
/// so both forms are told apart and records written before stay readable.
/// The CBOR form exists for strings that are not valid UTF-8 (a raw request
/// body): JSON cannot carry them and replacing bytes would change the
/// request that retries send downstream.
[[nodiscard]] std::string encode_pre_state(const nlohmann::json& value);

/// The value back, or nullopt when the text is neither form (corrupt, or
/// written by something else).
[[nodiscard]] std::optional<nlohmann::json> decode_pre_state(std::string_view stored);

}  // namespace orpheus::detail
