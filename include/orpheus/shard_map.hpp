// Which shard owns a key.
//
// A key's shard is jump_consistent_hash(h, N) where h is the first 8 bytes of
// SHA-256(scope, 0x00, key), big-endian. The hash is stable across hosts,
// builds and library versions, and growing N shards to N+1 moves about
// 1/(N+1) of the keys (Lamping & Veach, "A Fast, Minimal Memory, Consistent
// Hash Algorithm", 2014). The application's own rows for a request live on the
// key's shard, because its Pre/Post-RPC SQL runs in that shard's transaction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace orpheus {

/// Lamping & Veach jump consistent hash: a bucket in [0, buckets).
[[nodiscard]] std::int32_t jump_consistent_hash(std::uint64_t key, std::int32_t buckets) noexcept;

/// The 64-bit stable hash of (scope, key).
[[nodiscard]] std::uint64_t key_hash(std::string_view scope, std::string_view key);

/// The shard in [0, shards) that owns (scope, key). `shards` must be >= 1.
[[nodiscard]] std::size_t shard_for(std::string_view scope, std::string_view key,
                                    std::size_t shards);

}  // namespace orpheus
