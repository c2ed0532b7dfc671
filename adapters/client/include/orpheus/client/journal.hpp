// A key journal: the idempotency key of a logical request is written down
// (durably) before the request is first sent, so a client process that
// crashes and restarts resumes the same logical request with the same key,
// and the server deduplicates it.
//
//   orpheus::client::sqlite_key_journal journal("client-keys.db");
//   const auto key = journal.key_for("order-1001/pay", fingerprint_of(body));
//   ... send with `key` until a final answer ...
//   journal.complete("order-1001/pay");
//
// Thread safety: the SQLite journal may be used from several threads.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace orpheus::client {

/// The journal holds another payload for this logical request: the payload of
/// a logical request can not change between attempts.
class payload_changed : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

class key_journal {
 public:
  key_journal() = default;
  key_journal(const key_journal&) = delete;
  key_journal& operator=(const key_journal&) = delete;
  virtual ~key_journal() = default;

  /// The key of logical request `name`: the journaled one, or a new UUIDv4
  /// written durably before this returns. Throws payload_changed when `name`
  /// was journaled with another payload fingerprint.
  virtual std::string key_for(std::string_view name, std::string_view payload_fingerprint) = 0;
  /// The logical request got an answer that settles it (call_result::
  /// settled(): a 2xx, a replay, or a final answer with nothing in doubt
  /// before it); its entry is removed. A run that resumes a pending entry
  /// sends with prepared_request::resuming().
  virtual void complete(std::string_view name) = 0;
  /// Logical requests started and not completed, oldest first.
  virtual std::vector<std::string> pending() = 0;
};

/// A journal in one SQLite file (WAL, synchronous=FULL).
class sqlite_key_journal final : public key_journal {
 public:
  /// Opens or creates the file; throws std::runtime_error when it cannot.
  explicit sqlite_key_journal(const std::string& path);
  ~sqlite_key_journal() override;
  std::string key_for(std::string_view name, std::string_view payload_fingerprint) override;
  void complete(std::string_view name) override;
  std::vector<std::string> pending() override;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace orpheus::client
