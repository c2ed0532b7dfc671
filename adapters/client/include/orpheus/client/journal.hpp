// A key journal: the idempotency key of a logical request is written down
// (durably) before the request is first sent, so a client process that
// crashes and restarts resumes the same logical request with the same key,
// and the server deduplicates it.
//
//   orpheus::client::sqlite_key_journal journal("client-keys.db");
//   const auto entry = journal.entry_for("order-1001/pay", fingerprint_of(body));
//   orpheus::client::prepared_request req(verb, target, body, headers, entry.key);
//   req.resuming(entry.resumed);  // an earlier run may have sent it
//   const auto r = client.send(req);
//   if (r.settled()) journal.complete("order-1001/pay");  // kept, as completed
//
// Thread safety: the SQLite journal may be used from several threads.
#pragma once

#include <chrono>
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

/// The journal holds the logical request as completed: its answer settled
/// it, and sending it again under a new key would be a second request (a
/// second payment). A new logical request needs a new name, or forget() of
/// this one first. Found in review: complete() removed the entry, so a run
/// that completed it and died before using the answer, or the same command
/// run again, paid again under a new key.
class request_completed : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

/// The journal holds the logical request as pending, started longer ago than
/// the journal resumes (journal_options::resume_within): the server may have
/// purged its record by now (its retention, which it says in
/// Idempotency-Key-Retention: 7 days by default), and the key sent again
/// would be a new request, a second payment if the first went through. Find
/// out what became of it (its status downstream), then complete() or forget()
/// the name. Found in review: an entry was resumed whatever its age.
class entry_too_old : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A logical request's journal entry.
struct journal_entry {
  std::string key;
  /// The entry was there already: an earlier run may have sent the request,
  /// so this run sends it with prepared_request::resuming(), and only an
  /// answer that says what became of it settles it.
  bool resumed = false;
};

class key_journal {
 public:
  key_journal() = default;
  key_journal(const key_journal&) = delete;
  key_journal& operator=(const key_journal&) = delete;
  virtual ~key_journal() = default;

  /// The key of logical request `name`: the journaled one, or a new UUIDv4
  /// written durably before this returns. Throws payload_changed when `name`
  /// was journaled with another payload fingerprint, request_completed
  /// when it was completed (its message names the key, whose answer the
  /// server replays while it keeps the record), and entry_too_old (the SQLite
  /// journal) when it was started too long ago to be resumed safely. The
  /// SQLite journal refuses an empty name (std::invalid_argument).
  virtual std::string key_for(std::string_view name, std::string_view payload_fingerprint) = 0;
  /// key_for(), and whether the entry was there already: use this one, and
  /// send with prepared_request::resuming(entry.resumed). Found in review:
  /// with key_for() alone a caller could not tell a resumed entry from a
  /// new one, and a resumed run whose answer settled nothing (a 401 once its
  /// token expired) completed the entry; the next run paid under a new key.
  /// The default asks pending() first: exact only while no other call for
  /// the same name runs meanwhile (two threads starting one logical request
  /// at once could both be told "new"); override it to do both at once, as
  /// the SQLite journal does in one transaction.
  virtual journal_entry entry_for(std::string_view name, std::string_view payload_fingerprint);
  /// The logical request got an answer that settles it (call_result::
  /// settled(): a 2xx, a replay, or a final answer with nothing in doubt
  /// before it); its entry is kept, marked completed, and entry_for() then
  /// refuses the name (request_completed) until forget().
  virtual void complete(std::string_view name) = 0;
  /// Removes the entry of `name`, completed or not: the name then starts a
  /// new logical request under a new key. Forgetting a pending entry whose
  /// request may have been sent, and sending the request again, can pay
  /// twice: that is the caller's decision to make, never the journal's.
  /// The default throws std::logic_error: a journal of one's own written
  /// before forget() existed keeps compiling, and says it cannot.
  virtual void forget(std::string_view name);
  /// Logical requests started and not completed, oldest first.
  virtual std::vector<std::string> pending() = 0;
};

struct journal_options {
  /// A pending entry started longer ago is refused (entry_too_old), never
  /// resumed. Keep it below the server's retention (orpheus::config::
  /// retention, 7 days by default).
  std::chrono::seconds resume_within = std::chrono::hours{24 * 6};
};

/// A journal in one SQLite file (WAL, synchronous=FULL).
class sqlite_key_journal final : public key_journal {
 public:
  /// Opens or creates the file; throws std::runtime_error when it cannot,
  /// and orpheus::config_error when resume_within is not positive or `path`
  /// names no file that outlives the process ("", ":memory:", a "file:" URI).
  explicit sqlite_key_journal(const std::string& path, journal_options options = {});
  ~sqlite_key_journal() override;
  std::string key_for(std::string_view name, std::string_view payload_fingerprint) override;
  journal_entry entry_for(std::string_view name, std::string_view payload_fingerprint) override;
  void complete(std::string_view name) override;
  void forget(std::string_view name) override;
  std::vector<std::string> pending() override;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace orpheus::client
