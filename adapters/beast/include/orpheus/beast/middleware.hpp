// Idempotency for Boost.Beast HTTP handlers.
//
//   orpheus::beast::middleware mw(manager, pool, {.scope = client_of});
//   // in the request handler, for POST /v1/payments:
//   mw.handle(std::move(req), respond,
//             [](orpheus::tx& tx, const http_request& req) { return record_payment(tx, req); },
//             [](const orpheus::attempt& a, const payment& p) { return charge(a, p); },
//             [](orpheus::tx& tx, const orpheus::attempt&, const orpheus::outcome<charge>& o) {
//               return record_result(tx, o); });
//
// What it does, in the order it does it:
//  1. reads the key from `Idempotency-Key` (name configurable; a bare token or
//     a quoted sf-string); required on POST and PATCH by default: missing or
//     invalid is 400, before any database work;
//  2. asks `scope` for the caller's identity (nullopt: 401), so one client can
//     never replay or block another's key;
//  3. fingerprints method, target, chosen headers and the body (JSON bodies
//     canonicalised: key order and spacing do not matter; form bodies with
//     their fields sorted);
//  4. runs manager::process() on the bounded work_pool, never on the io
//     thread; a full queue answers 503, retryable;
//  5. answers: the recorded response byte for byte (plus
//     `Idempotent-Replayed: true` on a replay), or an RFC 9457
//     application/problem+json error with a `retryable` member: 409 in
//     progress, 422 key re-used with another payload, 503 (or the recorded
//     5xx) for retryable failures, with Retry-After where useful. Every answer
//     echoes the key and says how long it is kept
//     (`Idempotency-Key-Retention: <seconds>`).
//
// Thread safety: handle() may be called from any thread. The manager and the
// pool must outlive the middleware and every request in flight.
#pragma once

#include <boost/beast/http/verb.hpp>
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "orpheus/beast/server.hpp"
#include "orpheus/beast/work_pool.hpp"
#include "orpheus/manager.hpp"

namespace orpheus::beast {

struct middleware_options {
  std::string key_header = "Idempotency-Key";
  /// Methods on which a request without a key is refused with 400.
  std::vector<boost::beast::http::verb> key_required_on = {boost::beast::http::verb::post,
                                                           boost::beast::http::verb::patch};
  /// Request headers that are part of the fingerprint (case-insensitive).
  std::vector<std::string> fingerprint_headers;
  /// The caller's identity, from the authenticated request; nullopt: 401.
  std::function<std::optional<std::string>(const http_request&)> scope;
  /// Wait for a concurrent attempt instead of answering 409 at once.
  process_options wait;
  /// Called once per answered request (for metrics and logs).
  std::function<void(const http_request&, const http_response&, std::chrono::microseconds)> observe;
};

/// A Beast response as Orpheus records it (status, headers in order, body),
/// for handlers that already produce Beast responses.
[[nodiscard]] response record_of(const http_response& res);

class middleware {
 public:
  /// Throws config_error when options.scope is empty or key_header is empty.
  middleware(manager& m, work_pool& pool, middleware_options options);

  /// Answers `req` through `respond`, exactly once, running the three phases
  /// with the library's guarantees. Pre receives the request:
  /// `pre(tx&, const http_request&) -> PreState`.
  template <class Pre, class Rpc, class Post>
  void handle(http_request&& req, const responder& respond, Pre pre, Rpc rpc, Post post);

  /// Runs other blocking work (a GET that reads the database) on the pool,
  /// with the same overload answer (503) when the queue is full.
  void run_blocking(http_request&& req, const responder& respond,
                    std::function<http_response(const http_request&)> work);

  /// The request id of `req`, or the error response to send instead.
  [[nodiscard]] std::variant<request_id, http_response> identify(const http_request& req) const;

  /// The text the fingerprint is taken of (exposed for tests and docs).
  [[nodiscard]] static std::string canonical_request(const http_request& req,
                                                     const std::vector<std::string>& headers);

  /// An error as the HTTP answer: problem+json, Retry-After, the key echoed.
  [[nodiscard]] http_response error_response(const error_info& e, const std::string& key) const;

 private:
  http_response answer(const request_id& id, bool echo_key,
                       const std::function<response()>& run) const;
  std::string retention_seconds() const;
  void submit(std::function<void()> job, const responder& respond);

  manager& manager_;
  work_pool& pool_;
  middleware_options options_;
};

template <class Pre, class Rpc, class Post>
void middleware::handle(http_request&& req, const responder& respond, Pre pre, Rpc rpc, Post post) {
  const auto started = std::chrono::steady_clock::now();
  auto who = identify(req);
  if (auto* early = std::get_if<http_response>(&who)) {
    if (options_.observe) {
      options_.observe(req, *early,
                       std::chrono::duration_cast<std::chrono::microseconds>(
                           std::chrono::steady_clock::now() - started));
    }
    return respond(std::move(*early));
  }
  const bool echo_key = req.find(options_.key_header) != req.end();
  auto job = [this, started, echo_key, id = std::get<request_id>(std::move(who)),
              req = std::move(req), respond, pre = std::move(pre), rpc = std::move(rpc),
              post = std::move(post)]() {
    http_response res = answer(id, echo_key, [&] {
      return manager_.process(
          id, [&](tx& t) { return pre(t, req); }, rpc, post, options_.wait);
    });
    if (options_.observe) {
      options_.observe(req, res,
                       std::chrono::duration_cast<std::chrono::microseconds>(
                           std::chrono::steady_clock::now() - started));
    }
    respond(std::move(res));
  };
  submit(std::move(job), respond);
}

}  // namespace orpheus::beast
