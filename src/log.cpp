#include "orpheus/log.hpp"

#include <cstdio>
#include <memory>
#include <mutex>
#include <string>

namespace orpheus {
namespace {

std::mutex sink_mutex;
std::shared_ptr<const log_sink> current_sink;  // null: stderr

void to_stderr(log_level level, std::string_view line) {
  std::string out = "orpheus ";
  out.append(to_string(level)).append(": ").append(line).push_back('\n');
  std::fwrite(out.data(), 1, out.size(), stderr);
}

}  // namespace

std::string_view to_string(log_level l) noexcept {
  switch (l) {
    case log_level::info:
      return "info";
    case log_level::warning:
      return "warning";
    case log_level::error:
      return "error";
  }
  return "unknown";
}

void set_log_sink(log_sink sink) {
  auto next = sink ? std::make_shared<const log_sink>(std::move(sink)) : nullptr;
  const std::lock_guard lock(sink_mutex);
  current_sink = std::move(next);
}

void log(log_level level, std::string_view line) noexcept {
  try {
    std::shared_ptr<const log_sink> sink;
    {
      const std::lock_guard lock(sink_mutex);
      sink = current_sink;
    }
    if (sink) {
      (*sink)(level, line);
    } else {
      to_stderr(level, line);
    }
  } catch (...) {  // NOLINT(bugprone-empty-catch): logging must never fail a request
  }
}

}  // namespace orpheus
