// The prepared statements of one connection, one policy for every backend:
// looked up by the SQL text without copying it (a statement is a few hundred
// bytes, and a copy per execution was a heap allocation per statement), and
// bounded: an application that builds SQL at run time cannot grow it without
// end. When full, it is emptied and fills again with what is in use.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

namespace orpheus::detail {

/// `Handle` owns one prepared statement (a std::unique_ptr with the driver's
/// deleter). Not thread-safe: a connection is used by one thread at a time.
template <class Handle>
class statement_cache {
 public:
  using pointer = typename Handle::pointer;
  static constexpr std::size_t capacity = 128;

  /// The statement prepared for `sql`, or null.
  [[nodiscard]] pointer find(std::string_view sql) const {
    const auto it = map_.find(sql);
    return it == map_.end() ? pointer{} : it->second.get();
  }
  /// Keeps `h` for `sql`. Invalidates every pointer find() returned before.
  pointer add(std::string_view sql, Handle h) {
    if (map_.size() >= capacity) map_.clear();
    return map_.insert_or_assign(std::string(sql), std::move(h)).first->second.get();
  }
  void clear() noexcept { map_.clear(); }

 private:
  struct text_hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept {
      return std::hash<std::string_view>{}(s);
    }
  };
  std::unordered_map<std::string, Handle, text_hash, std::equal_to<>> map_;
};

}  // namespace orpheus::detail
