// Where the library reports what it does not tell clients.
//
// Database host names, SQL text and raw exception messages never go into an
// answer (they would leak internals to callers); they go here, one line per
// event, together with the stable error code the client was sent.
//
//   orpheus::set_log_sink([](orpheus::log_level l, std::string_view line) {
//     my_logger.write(l == orpheus::log_level::error, line);
//   });
//
// The default sink writes the line to stderr. Thread safety: set_log_sink()
// and log() may be called from any thread; the sink is called on the thread
// that logs, so it must be thread-safe itself and must not throw. Nor may
// it block: it is called inside transactions too (from Pre-RPC, Post-RPC
// and the library's own phases), on a sharded store's map reader thread
// (store::backend_for_records(); until every shard's place agrees, and it
// may log while the application stops), on SQLite's one writer thread, where a
// sink waiting on a full pipe or a stopped terminal stops every write of
// the process (found in review). Hand lines to a queue that drops when full.
#pragma once

#include <functional>
#include <string_view>

namespace orpheus {

enum class log_level { info, warning, error };

[[nodiscard]] std::string_view to_string(log_level l) noexcept;

using log_sink = std::function<void(log_level, std::string_view line)>;

/// Replaces the process-wide sink; an empty sink restores the default (stderr).
void set_log_sink(log_sink sink);

/// Writes one line through the current sink. Never throws.
void log(log_level level, std::string_view line) noexcept;

}  // namespace orpheus
