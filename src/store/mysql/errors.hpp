// The one place where mysql-connector-c++ errors are classified.
#pragma once

#include <cppconn/exception.h>

#include <string_view>

#include "orpheus/error.hpp"

namespace orpheus::mysql_detail {

/// What one driver error means for the caller, the connection and the
/// transaction.
struct verdict {
  bool retryable = false;
  bool in_doubt = false;           ///< a COMMIT that may have landed
  bool connection_broken = false;  ///< discard the connection, never reuse it
  bool transaction_ended = false;  ///< the server rolled the whole transaction back
};

/// Classifies a driver error. `in_commit`: it came out of COMMIT.
/// `rollback_on_timeout`: the server's innodb_rollback_on_timeout.
[[nodiscard]] verdict judge(const sql::SQLException& e, bool in_commit,
                            bool rollback_on_timeout) noexcept;

/// True when the connection can no longer be trusted and must be discarded
/// (lost link, server gone, killed session).
[[nodiscard]] bool connection_broken(int code) noexcept;

/// Maps a driver error to a storage_error. `in_commit`: the error came out of
/// COMMIT, where a lost connection means the outcome is unknown (in doubt).
[[nodiscard]] storage_error classify(const sql::SQLException& e, std::string_view what,
                                     bool in_commit, bool rollback_on_timeout = false);

inline constexpr int duplicate_key = 1062;

}  // namespace orpheus::mysql_detail
