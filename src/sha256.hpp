// SHA-256 for the core (fingerprints, shard hashes, downstream keys).
#pragma once

#include <array>
#include <string_view>

namespace orpheus::detail {

/// SHA-256 of `data`. Fetches the digest implementation once: OpenSSL 3's
/// one-shot SHA256() looks it up in the provider on every call, which cost
/// more than the hashing itself on the replay path.
std::array<unsigned char, 32> sha256(std::string_view data);

}  // namespace orpheus::detail
