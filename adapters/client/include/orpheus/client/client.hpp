// A retrying client for idempotent HTTP APIs (synchronous form; the Asio
// coroutine form is in async.hpp).
//
//   orpheus::client::idempotent_client api(orpheus::beast::parse_http_url(url));
//   const orpheus::client::prepared_request req(http::verb::post, "/v1/payments", body,
//                                               {{"Content-Type", "application/json"}});
//   const auto result = api.send(req);   // same key, same bytes on every attempt
//   if (result.why == orpheus::client::stop_reason::answered) use(*result.response);
//
// One prepared_request is one logical request: its key (a UUIDv4 unless you
// give one, see entity_key() and key_journal), headers and body are fixed when
// it is made and cannot change between attempts. What is retried and how long
// is retry.hpp's policy; the retry budget is shared by every call made through
// one client. send() never throws for HTTP or network failures: the result
// says what happened and why it stopped.
//
// Attempts go through a beast::http_client (orpheus/beast/client.hpp): kept-
// alive connections to the server, reused across attempts, calls and
// threads, on the http_client's own io thread. One deadline bounds each
// attempt: waiting for a connection, host name lookup, connect, write and
// read. The http_client never re-sends an attempt the server may have
// received (delivery::at_most_once); an attempt whose connection broke is a
// `network` error that this helper retries with the same key.
//
// Thread safety: a client may be used by several threads at once; it shares
// its retry budget and its connections between them. Lifetimes: the
// http_client lives as long as the last client (or copy) that uses it;
// destroying it waits for a host name lookup still running.
#pragma once

#include <atomic>
#include <boost/beast/http/verb.hpp>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "orpheus/beast/client.hpp"
#include "orpheus/client/retry.hpp"

namespace orpheus::client {

using beast::http_endpoint;
using beast::http_request;
using beast::http_response;

/// A logical request, fixed once.
class prepared_request {
 public:
  /// Throws std::invalid_argument, with orpheus::invalid_key_reason()'s text,
  /// when the key breaks the key rule (orpheus/request.hpp): the server's own
  /// rule, so the client refuses exactly the keys the server would refuse.
  /// Throws it too when HTTP/1.1 cannot carry the target or a header as
  /// given: an empty target, or one with a space or a control byte; a header
  /// name that is not a token; a value with a control byte other than HTAB
  /// (a CR LF would end that header and start another). The message names
  /// the header, never its value.
  prepared_request(boost::beast::http::verb method, std::string target, std::string body,
                   std::vector<std::pair<std::string, std::string>> headers = {},
                   std::string key = new_idempotency_key());

  [[nodiscard]] const std::string& key() const noexcept { return key_; }
  [[nodiscard]] const std::string& body() const noexcept { return body_; }

  /// Says that an earlier run (a process that crashed or gave up, a key
  /// kept in a journal) may have sent this request already: its calls start
  /// with call_result::earlier_attempt_in_doubt set, so only an answer that
  /// says what became of the request is settled() (found in review: a
  /// resumed key answered 401 was "settled", the journal forgot it, and the
  /// next run paid under a new key).
  ///
  /// Within a process the request remembers it by itself: once an attempt
  /// of a send() may have arrived unanswered (a timeout, a lost connection,
  /// a 409, a 5xx), later send()s of this request, and of its copies (the
  /// same logical request, the same key), start in doubt too (found in
  /// review: a call that stopped on its attempt cap after a lost answer, sent
  /// again and answered 401, was "settled"), and a send of it still running
  /// when a copy's attempt is found lost ends in doubt.
  /// resuming(false) is the caller's word that nothing was sent: it clears
  /// the mark for every copy of the request.
  prepared_request& resuming(bool may_have_been_sent = true) noexcept {
    if (in_doubt_) in_doubt_->store(may_have_been_sent);
    return *this;
  }
  [[nodiscard]] bool resuming_earlier_run() const noexcept {
    return in_doubt_ && in_doubt_->load();
  }
  /// Called by the retry loop when an attempt may have arrived unanswered.
  void may_have_been_sent() const noexcept {
    if (in_doubt_) in_doubt_->store(true);
  }
  /// A fresh HTTP message for one attempt, carrying the key as
  /// orpheus::key_header_value() writes it (quoted when it starts with '"' or holds a comma).
  [[nodiscard]] http_request message(const std::string& key_header) const;

 private:
  boost::beast::http::verb method_;
  std::string target_;
  std::string body_;
  std::vector<std::pair<std::string, std::string>> headers_;
  std::string key_;
  /// Shared by copies: one logical request, sent under one key.
  std::shared_ptr<std::atomic<bool>> in_doubt_ = std::make_shared<std::atomic<bool>>(false);
};

enum class stop_reason {
  answered,            ///< a final answer: 2xx, or a 4xx that is not retried
  attempts_exhausted,  ///< the attempt cap was reached
  deadline,            ///< the next wait would pass the overall deadline
  budget_exhausted,    ///< the client's retry budget is spent (an outage)
};

/// What the per-attempt hook sees.
struct attempt_info {
  int number = 0;
  std::string key;
  error_kind kind = error_kind::none;
  unsigned status = 0;                ///< 0 when no answer came
  std::string error;                  ///< transport error text, if any
  std::chrono::milliseconds wait{0};  ///< wait before the next attempt (0: none)
};

struct call_result {
  std::optional<http_response> response;  ///< the last answer received, if any
  int attempts = 0;
  std::chrono::milliseconds elapsed{0};
  bool replayed = false;  ///< the answer carried Idempotent-Replayed
  stop_reason why = stop_reason::answered;
  error_kind last_error = error_kind::none;
  std::string key;
  /// An attempt of this call (or of an earlier one, when the request was
  /// prepared_request::resuming() or sent before) may have been carried out,
  /// the last attempt included when the call stopped on it: it went unanswered
  /// after its request may have arrived (timeout, closed), or got a 409 (an
  /// attempt in progress) or a 5xx (the server's, or a proxy's after the
  /// server acted). A later answer that is neither 2xx nor a replay does not
  /// say what became of it (a 401 once a token expired, a proxy's 404
  /// during a deploy). See settled().
  bool earlier_attempt_in_doubt = false;

  /// True when `response` is what became of the request: a 2xx; a replay of
  /// the server's record; or a final answer while no earlier attempt was in
  /// doubt. False otherwise, and then the request may have been carried out:
  /// keep its key, and send it again later with that key, never under a new
  /// one (found in review: pay_client forgot the key on a 401 that followed
  /// a lost answer, and its next run paid again under a new key).
  [[nodiscard]] bool settled() const noexcept {
    if (why != stop_reason::answered || !response) return false;
    return response->result_int() / 100 == 2 || replayed || !earlier_attempt_in_doubt;
  }
};

struct client_options {
  retry_policy policy;
  std::shared_ptr<retry_budget> budget = std::make_shared<retry_budget>();
  std::string key_header = "Idempotency-Key";
  clock time;
  std::function<void(const attempt_info&)> on_attempt;
  /// The connections attempts use. Null: the client makes its own, shared
  /// by its copies (16 connections at most, 4 s idle). Give several clients
  /// of one service the same http_client to share its connections.
  std::shared_ptr<beast::http_client> http;
};

/// The retry decisions of one call, shared by the sync and async forms.
class retry_loop {
 public:
  /// `o` and `req` must outlive the loop: it marks `req` when an attempt may
  /// have arrived unanswered (prepared_request::resuming()).
  retry_loop(const client_options& o, const prepared_request& req);
  /// The timeout of the next attempt (the attempt timeout, cut to what is
  /// left of the deadline).
  [[nodiscard]] std::chrono::milliseconds attempt_timeout() const;
  /// Records an attempt's answer (or its transport failure); returns the
  /// wait before the next attempt, or nullopt when the call is over.
  std::optional<std::chrono::milliseconds> after(std::optional<http_response> res,
                                                 std::optional<beast::transport_error> failure);
  [[nodiscard]] call_result result() && { return std::move(result_); }

 private:
  const client_options& o_;
  const prepared_request& req_;
  std::chrono::steady_clock::time_point started_;
  call_result result_;
  std::mt19937_64 rng_;
};

class idempotent_client {
 public:
  /// Throws orpheus::config_error on a bad policy (validate()), a missing
  /// budget or a key header name that is not an HTTP token (an empty one
  /// among them).
  explicit idempotent_client(http_endpoint server, client_options options = {});

  /// Sends until a final answer or a stop; see call_result.
  call_result send(const prepared_request& req) const;

  [[nodiscard]] const http_endpoint& server() const noexcept { return server_; }
  [[nodiscard]] const client_options& options() const noexcept { return options_; }

 private:
  http_endpoint server_;
  client_options options_;  ///< options_.http is never null
};

}  // namespace orpheus::client
