#include "orpheus/shard_map.hpp"

#include <array>
#include <stdexcept>
#include <string>

#include "sha256.hpp"

namespace orpheus {

std::int32_t jump_consistent_hash(std::uint64_t key, std::int32_t buckets) noexcept {
  std::int64_t b = -1;
  std::int64_t j = 0;
  while (j < buckets) {
    b = j;
    key = key * 2862933555777941757ULL + 1;
    j = static_cast<std::int64_t>(
        static_cast<double>(b + 1) *
        (static_cast<double>(1LL << 31) / static_cast<double>((key >> 33) + 1)));
  }
  return static_cast<std::int32_t>(b);
}

std::uint64_t key_hash(std::string_view scope, std::string_view key) {
  std::string input;
  input.reserve(scope.size() + 1 + key.size());
  input.append(scope).push_back('\0');
  input.append(key);
  const auto digest = detail::sha256(input);
  std::uint64_t h = 0;
  for (int i = 0; i < 8; ++i) h = (h << 8) | digest[static_cast<std::size_t>(i)];
  return h;
}

std::size_t shard_for(std::string_view scope, std::string_view key, std::size_t shards) {
  if (shards == 0) throw std::invalid_argument("shard_for: no shards");
  if (shards == 1) return 0;  // jump_consistent_hash(h, 1) is 0 for every h
  return static_cast<std::size_t>(
      jump_consistent_hash(key_hash(scope, key), static_cast<std::int32_t>(shards)));
}

}  // namespace orpheus
