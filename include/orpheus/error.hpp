// Orpheus errors: every failure says whether the caller may retry.
//
// Three answers, in the spirit of absl::Status:
//  - retryable(): nothing was recorded as final. The caller may send the SAME
//    request again with the SAME idempotency key (after retry_after() if set).
//    The library guarantees the retry has its effect at most once.
//  - in_doubt(): a special retryable case. The library does not know whether
//    its last commit landed (the connection died during COMMIT). Retrying with
//    the same key is the only safe move: the retry either replays the recorded
//    answer or takes the lease over with is_retry() == true.
//  - neither: the request will not succeed as sent. Do not retry it with this
//    key; fix the input (4xx) or reconcile by hand (a recorded 5xx).
//
//   try {
//     auto r = manager.process(id, pre, rpc, post);
//   } catch (const orpheus::error& e) {
//     if (e.retryable()) schedule_retry(e.retry_after());
//   }
//
// Thread safety: error objects are immutable values.
#pragma once

#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "orpheus/codes.hpp"

namespace orpheus {

// The codes the library emits, and their classes: orpheus/codes.hpp.

/// The Retry-After every retryable error_info::of() starts with. A longer
/// one was asked for by whoever made the error, and a completer waits it too.
inline constexpr std::chrono::milliseconds default_retry_after{1000};

/// The plain data of an error: what travels to the client and what is recorded.
///
/// Its class (`kind`) is transport-neutral and decides retryable() and
/// in_doubt(); an adapter maps it to its own status (HTTP: http_status_of()
/// in orpheus/problem.hpp, the one place that does).
struct error_info {
  error_class kind = error_class::internal;
  std::string code;
  std::string message;
  /// A hint for clients (HTTP Retry-After); empty when there is no better
  /// answer than the client's own backoff.
  std::optional<std::chrono::milliseconds> retry_after;
  /// What happened in detail (database host, SQL text, an exception's
  /// what()): logged through orpheus::log and kept in the record's
  /// last_error, never sent to the client. `message` is what clients see.
  std::string internal{};
  /// The HTTP status a handler chose for this failure (a declined card as
  /// 402), or a downstream's status an adapter passes on: 400 to 599, others
  /// are ignored. Empty: HTTP answers with the status of the class and code
  /// (http_status_of()). The core never sets it.
  std::optional<int> http_status{};

  /// Nothing final happened (conflict, unavailable, in_doubt): the same
  /// request may be sent again with the same key.
  [[nodiscard]] bool retryable() const noexcept { return orpheus::retryable(kind); }
  /// The outcome of the last commit or call is unknown (always retryable).
  [[nodiscard]] bool in_doubt() const noexcept { return kind == error_class::in_doubt; }

  /// The way to make one. For the retryable classes retry_after starts at
  /// default_retry_after. The with_ calls change one field each:
  ///
  ///   throw error(error_info::of(error_class::rejected, codes::card_declined,
  ///                              "the card was declined")
  ///                   .with_http_status(402)
  ///                   .with_internal(detail));
  [[nodiscard]] static error_info of(error_class c, std::string_view code, std::string message);
  [[nodiscard]] error_info with_http_status(std::optional<int> status) && {
    http_status = status;
    return std::move(*this);
  }
  [[nodiscard]] error_info with_retry_after(std::optional<std::chrono::milliseconds> after) && {
    retry_after = after;
    return std::move(*this);
  }
  [[nodiscard]] error_info with_internal(std::string detail) && {
    internal = std::move(detail);
    return std::move(*this);
  }
};

/// Base of every error Orpheus throws or handlers throw to Orpheus.
class error : public std::runtime_error {
 public:
  /// what() is the internal detail when there is one, else the message.
  explicit error(error_info info)
      : std::runtime_error(info.internal.empty() ? info.message : info.internal),
        info_(std::move(info)) {}

  [[nodiscard]] const error_info& info() const noexcept { return info_; }
  [[nodiscard]] error_class kind() const noexcept { return info_.kind; }
  [[nodiscard]] bool retryable() const noexcept { return info_.retryable(); }
  [[nodiscard]] bool in_doubt() const noexcept { return info_.in_doubt(); }
  [[nodiscard]] const std::string& code() const noexcept { return info_.code; }
  [[nodiscard]] std::optional<std::chrono::milliseconds> retry_after() const noexcept {
    return info_.retry_after;
  }

 private:
  error_info info_;
};

/// A failure that is safe to retry with the same key: nothing final happened,
/// or (for RPC outcomes) the downstream service deduplicates by the
/// downstream key. Class unavailable (HTTP 503 unless `http_status` says
/// otherwise).
class retryable_error : public error {
 public:
  retryable_error(std::string_view code, std::string message,
                  std::optional<int> http_status = std::nullopt,
                  std::optional<std::chrono::milliseconds> retry_after = {})
      : error(error_info::of(error_class::unavailable, code, std::move(message))
                  .with_http_status(http_status)
                  .with_retry_after(retry_after)) {}
};

/// A failure that will not go away by retrying: bad input, a business refusal
/// (card declined). When it comes out of the RPC it is recorded and replayed
/// for the key's lifetime. Class rejected (HTTP: `http_status` when given,
/// else what http_status_of() gives its code, usually 422).
class non_retryable_error : public error {
 public:
  non_retryable_error(std::string_view code, std::string message,
                      std::optional<int> http_status = std::nullopt)
      : error(error_info::of(error_class::rejected, code, std::move(message))
                  .with_http_status(http_status)) {}

 protected:
  /// For the subclasses below, whose class is not `rejected`.
  explicit non_retryable_error(error_info info) : error(std::move(info)) {}
};

/// Bad input (key, scope, fingerprint): class invalid_input (HTTP 400), never
/// retryable, and thrown before any database work.
class bad_input_error : public non_retryable_error {
 public:
  bad_input_error(std::string_view code, std::string message)
      : non_retryable_error(error_info::of(error_class::invalid_input, code, std::move(message))) {}
};

/// A configuration the library refuses to run with. Thrown at start-up.
class config_error : public non_retryable_error {
 public:
  explicit config_error(std::string message)
      : non_retryable_error(
            error_info::of(error_class::internal, codes::invalid_config, std::move(message))) {}
};

/// A storage failure, already classified by the backend (one file per backend
/// maps driver error codes to this). Database failures are retryable except
/// for programming errors (bad SQL, missing table), which are not.
class storage_error : public error {
 public:
  using error::error;
  /// A retryable failure; `in_doubt` when a COMMIT got no answer. `detail`
  /// (host, SQL, driver text) is internal: clients get a fixed message.
  static storage_error transient(std::string detail, bool in_doubt = false) {
    if (in_doubt) {
      // NOLINTNEXTLINE(modernize-return-braced-init-list): the constructor is explicit
      return storage_error(
          error_info::of(error_class::in_doubt, codes::commit_in_doubt,
                         "the outcome of the last database commit is unknown; retry with the "
                         "same key")
              .with_internal(std::move(detail)));
    }
    // NOLINTNEXTLINE(modernize-return-braced-init-list): the constructor is explicit
    return storage_error(error_info::of(error_class::unavailable, codes::storage_unavailable,
                                        "the database is unavailable; retry later")
                             .with_internal(std::move(detail)));
  }
  /// A fenced write found that this attempt no longer holds its lease (it
  /// expired and another attempt took it over); nothing was committed. A
  /// backend that checks the fence inside its COMMIT reports it this way.
  static storage_error lease_lost(std::string detail) {
    // NOLINTNEXTLINE(modernize-return-braced-init-list): the constructor is explicit
    return storage_error(
        error_info::of(error_class::conflict, codes::lease_lost,
                       "this attempt's lease expired and was taken over; its result was not "
                       "recorded")
            .with_internal(std::move(detail)));
  }
  /// A failure that retrying will not fix (bad SQL, missing table). `detail`
  /// is internal, as for transient().
  static storage_error permanent(std::string detail) {
    // NOLINTNEXTLINE(modernize-return-braced-init-list): the constructor is explicit
    return storage_error(error_info::of(error_class::internal, codes::storage_error,
                                        "the database refused the request")
                             .with_internal(std::move(detail)));
  }
};

/// How an exception that is not an orpheus::error is classified.
enum class unclassified_policy {
  non_retryable,  ///< default: money is safer stuck than paid twice
  /// Class unavailable. From an RPC, a step or a compensation this says the
  /// call's outcome is known: nothing reached downstream, or downstream
  /// deduplicates by the downstream key. The key is released at once, and
  /// no in-doubt window holds it (config::in_doubt_window): once its budget
  /// is spent it may be parked and resolved by hand at once. A call that may
  /// still land (a timeout after sending) should throw class in_doubt.
  retryable,
};

/// Classifies any exception: orpheus::error keeps its own class; anything else
/// follows `policy`. Returns the data to record or report.
[[nodiscard]] error_info classify(std::exception_ptr e, unclassified_policy policy);

}  // namespace orpheus
