// Idempotency for Boost.Beast HTTP handlers.
//
//   orpheus::beast::middleware mw(manager, pool, {.scope = client_of});
//   // in the request handler, for POST /v1/payments:
//   mw.handle(std::move(req), respond,
//             [](orpheus::tx& tx, const http_request& req) { return record_payment(tx, req); },
//             [](const orpheus::attempt& a, const payment& p) { return charge(a, p); },
//             [](orpheus::tx& tx, const orpheus::attempt&, const charge& c) {
//               return record_charge(tx, c); });  // on success; failures are recorded
//
// What it does, in the order it does it:
//  1. reads the key from `Idempotency-Key` (name configurable; a bare token or
//     a quoted sf-string, one only: the header twice or a bare comma is a
//     list, refused); required on POST and PATCH by default: missing or
//     invalid is 400, before any database work;
//  2. asks `scope` for the caller's identity (nullopt: 401 with
//     `WWW-Authenticate`), so one client can never replay or block another's
//     key;
//  3. fingerprints method, target, chosen headers and the body (JSON bodies
//     canonicalised: key order and spacing do not matter; a JSON body nested
//     deeper than `max_json_depth` is 400 at once; form bodies with their
//     fields ordered by decoded name, repeated fields kept in the order
//     sent);
//  4. runs manager::try_process() on the bounded work_pool, never on the io
//     thread; a full queue answers 503, retryable. A request without a key
//     (where none is required) runs under a random key of its own, and its
//     record is kept for no time (process_options::retention = 0). With
//     `wait`, a request that finds its key held tries again on a timer
//     until the wait is over, holding no pool thread in between;
//  5. answers: the recorded response byte for byte (plus
//     `Idempotent-Replayed: true` on a replay), or an RFC 9457
//     application/problem+json error with a `retryable` member: 409 in
//     progress, 422 key re-used with another payload, 503 (or the recorded
//     5xx) for retryable failures, with Retry-After where useful. Every answer
//     echoes the key and says how long it is kept
//     (`Idempotency-Key-Retention: <seconds>`). An error's internal detail
//     (error_info::internal: hosts, SQL, exception text) is logged through
//     orpheus::log with its code, scope and key, never sent.
//
// Thread safety: handle() may be called from any thread.
//
// Lifetime (issue 7: this used to say the reverse): the pool's jobs use the
// middleware, the manager and the store, so the pool must be drained
// (work_pool::drain()) before any of them is destroyed. A graceful
// shutdown: server::stop_accepting(), work_pool::drain(), server::stop(),
// then destroy the middleware, the manager and the store.
#pragma once

#include <boost/beast/http/verb.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "orpheus/api_keys.hpp"
#include "orpheus/beast/server.hpp"
#include "orpheus/manager.hpp"
#include "orpheus/work_pool.hpp"

namespace orpheus::beast {

/// The caller's identity (the scope of its keys) from a request; nullopt
/// when the request does not authenticate one.
using scope_function = std::function<std::optional<std::string>(const http_request&)>;

/// What middleware_options::scope is for callers with API keys: `prefix` +
/// the client whose key the request's `Authorization: Bearer <key>` carries
/// (api_keys::client_of()), or nullopt (401) for a request without one, with
/// another scheme, or with a key `keys` does not hold. Throws config_error
/// when `prefix` would make scopes that break the scope rule.
///
///   options.scope = orpheus::beast::bearer_scope(orpheus::api_keys::load(path));
[[nodiscard]] scope_function bearer_scope(api_keys keys, std::string prefix = "client:");

struct middleware_options {
  std::string key_header = "Idempotency-Key";
  /// Methods on which a request without a key is refused with 400.
  std::vector<boost::beast::http::verb> key_required_on = {boost::beast::http::verb::post,
                                                           boost::beast::http::verb::patch};
  /// Request headers that are part of the fingerprint (case-insensitive;
  /// every field of a name, joined with ", ").
  std::vector<std::string> fingerprint_headers;
  /// The caller's identity, from the authenticated request; nullopt: 401.
  /// orpheus/api_keys.hpp reads bearer tokens (`Authorization: Bearer`).
  scope_function scope;
  /// The challenge every 401 carries in `WWW-Authenticate` (HTTP requires
  /// one): the scheme `scope` authenticates with, and its parameters. When
  /// it is a Bearer challenge and the request did present a well-formed
  /// Bearer token, that token was refused, and the challenge says so with
  /// `error="invalid_token"` (RFC 6750 section 3.1: a client may then fetch
  /// a new token); a request without one, or with another scheme, gets the
  /// challenge as it is.
  std::string www_authenticate = "Bearer";
  /// Wait up to wait.wait_for for a concurrent attempt instead of answering
  /// 409 at once; the wait is a timer, not a pool thread. wait.retention
  /// must stay unset (config_error): records are kept for the manager's
  /// config::retention.
  process_options wait;
  /// JSON bodies nested deeper than this are refused with 400 before they
  /// are parsed (parsing and printing them recurses on the io thread).
  std::size_t max_json_depth = 64;
  /// Called once per answered request (for metrics and logs), before the
  /// answer goes out; what it throws is logged, and the answer goes anyway.
  std::function<void(const http_request&, const http_response&, std::chrono::microseconds)> observe;
};

/// A Beast response as Orpheus records it (status, headers in order, body),
/// for handlers that already produce Beast responses.
[[nodiscard]] response record_of(const http_response& res);

/// What the one-lambda handle() makes of an answer with a "try again" status
/// (retry_later_status(), 408, 409 or 425), instead of recording it: a
/// retryable error with the same status (408: 504) and the answer's
/// Retry-After when it gives seconds; code `downstream_throttled` for 429,
/// `downstream_in_progress` for 409 and 425 (downstream still busy with
/// this key), `downstream_failed` for 408 and a 5xx. All but 429 are in
/// doubt: the handler passes on a failure downstream (a timeout, a 502)
/// that may hide a call still running there, so the key is held until the
/// attempt's deadline and the retry runs with is_retry(), as for the payment
/// wrapper's unknown outcomes. A 429 says downstream did not act: the key
/// is released at once. nullopt for any other status, and for an answer
/// that says_final(): it is recorded.
[[nodiscard]] std::optional<error_info> retry_later_error(const http_response& res);

class middleware {
 public:
  /// Throws config_error when options.scope is empty or key_header is empty.
  middleware(manager& m, work_pool& pool, middleware_options options);

  /// Answers `req` through `respond`, exactly once, running the three phases
  /// with the library's guarantees. Pre receives the request, and the
  /// request id the middleware computed when it takes one:
  /// `pre(tx&, const http_request&) -> PreState` or
  /// `pre(tx&, const http_request&, const request_id&) -> PreState`.
  /// Rpc and Post are manager::process()'s (orpheus/manager.hpp); both reach
  /// the request id through `attempt::id()`.
  template <class Pre, class Rpc, class Post>
  void handle(http_request&& req, const responder& respond, Pre pre, Rpc rpc, Post post);

  /// As handle() above, with the RPC and Post-RPC registered with the manager
  /// under `handler_name` (manager::register_handler): a completer
  /// (orpheus/completer.hpp) can then finish the request without its
  /// client. Pre is this request's, as above.
  template <class Pre>
  void handle_named(std::string handler_name, http_request&& req, const responder& respond,
                    Pre pre);

  /// The one-lambda form, for a handler that calls downstream and answers:
  /// `answer(const attempt&, const http_request&) -> http_response`. It runs
  /// as the RPC phase (no database, outside any transaction, once per
  /// attempt, with attempt::downstream_key() for the service it calls).
  /// Its answer is recorded and replayed, unless it is a "try again" status
  /// (408, 409, 425, 429, 5xx except 501), which is never recorded: see
  /// retry_later_error(). Throwing retryable_error leaves the key
  /// retryable too; non_retryable_error records a problem+json answer. A
  /// status that is not final (is_final_status(): a 1xx) is never recorded
  /// either: 503 post_rpc_failed, and the retry runs the handler again.
  template <class Handler>
  requires std::is_invocable_r_v<http_response, Handler&, const attempt&, const http_request&>
  void handle(http_request&& req, const responder& respond, Handler answer);

  /// Runs other blocking work (a GET that reads the database) on the pool,
  /// with the same overload answer (503) when the queue is full, and the
  /// same 503 server_stopping, without running `work`, for a job still
  /// queued when the pool began to drain. Every answer is observed.
  void run_blocking(http_request&& req, const responder& respond,
                    std::function<http_response(const http_request&)> work);

  /// The request id of `req`, or the error response to send instead.
  [[nodiscard]] std::variant<request_id, http_response> identify(const http_request& req) const;

  /// The text the fingerprint is taken of (exposed for tests and docs). A
  /// JSON body nested deeper than `max_json_depth` is taken as it is.
  [[nodiscard]] static std::string canonical_request(const http_request& req,
                                                     const std::vector<std::string>& headers,
                                                     std::size_t max_json_depth = 64);

  /// An error as the HTTP answer: problem+json, Retry-After, the key echoed,
  /// and on a 401 `WWW-Authenticate` (middleware_options::www_authenticate).
  [[nodiscard]] http_response error_response(const error_info& e, const std::string& key) const;

 private:
  // A request on its way through the pool: what each try needs, kept
  // between tries while it waits for a held key.
  struct pending {
    request_id id;
    bool key_sent = false;
    http_request req;
    responder respond;
    std::chrono::steady_clock::time_point started;
    std::chrono::steady_clock::time_point wait_until;
    std::chrono::milliseconds poll{5};
    bool answered = false;  ///< finish() has handed its answer to `respond`
    std::function<outcome<response>(const request_id&, const http_request&, const process_options&)>
        run;
  };
  /// The request's pending state, or nullptr when it was answered already
  /// (refused by identify(): 400, 401).
  std::shared_ptr<pending> admit(http_request&& req, const responder& respond);
  void start(const std::shared_ptr<pending>& p);
  /// One try, on a pool thread; never throws, and answers whatever happens.
  void try_once(const std::shared_ptr<pending>& p);
  void run_once(const std::shared_ptr<pending>& p);
  bool wait_again(const std::shared_ptr<pending>& p,
                  std::optional<std::chrono::milliseconds> retry_after);
  void finish(pending& p, http_response res) const;
  /// The answer to a request that failed once process() may have run it.
  [[nodiscard]] http_response failure_response(const pending& p, const error_info& e) const;
  /// The last resort when no answer could be built: the connection is
  /// dropped, unless an answer was handed on already. Never throws.
  static void drop_unanswered(pending& p) noexcept;
  void notify_observer(const http_request& req, const http_response& res,
                       std::chrono::steady_clock::time_point started) const noexcept;
  void log_internal(const error_info& e, std::string_view about) const;
  std::string retention_seconds() const;
  /// Why the pool refused a job: overloaded, or server_stopping once it drains.
  [[nodiscard]] error_info refused_by_pool() const;

  manager& manager_;
  work_pool& pool_;
  middleware_options options_;
  /// www_authenticate with `error="invalid_token"`, when it is a Bearer
  /// challenge; empty otherwise.
  std::string invalid_token_challenge_;
};

template <class Pre, class Rpc, class Post>
void middleware::handle(http_request&& req, const responder& respond, Pre pre, Rpc rpc, Post post) {
  auto p = admit(std::move(req), respond);
  if (!p) return;  // answered already (400, 401)
  p->run = [this, pre = std::move(pre), rpc = std::move(rpc), post = std::move(post)](
               const request_id& id, const http_request& r, const process_options& o) {
    return manager_.try_process(
        id, [&](tx& t) { return orpheus::detail::call_pre(pre, t, r, id); }, rpc, post, o);
  };
  start(p);
}

template <class Pre>
void middleware::handle_named(std::string handler_name, http_request&& req,
                              const responder& respond, Pre pre) {
  auto p = admit(std::move(req), respond);
  if (!p) return;  // answered already (400, 401)
  p->run = [this, name = std::move(handler_name), pre = std::move(pre)](
               const request_id& id, const http_request& r, const process_options& o) {
    return manager_.try_process(
        name, id, [&](tx& t) { return orpheus::detail::call_pre(pre, t, r, id); }, o);
  };
  start(p);
}

template <class Handler>
requires std::is_invocable_r_v<http_response, Handler&, const attempt&, const http_request&>
void middleware::handle(http_request&& req, const responder& respond, Handler answer) {
  auto p = admit(std::move(req), respond);
  if (!p) return;
  // Pre-RPC stores nothing (an empty object): a retry needs only the request
  // it is sent again with, which `pending` keeps for every try.
  p->run = [this, answer = std::move(answer)](const request_id& id, const http_request& r,
                                              const process_options& o) mutable {
    return manager_.try_process(
        id, [](tx&) { return nlohmann::json::object(); },
        [&](const attempt& a, const nlohmann::json&) {
          const http_response res = answer(a, r);
          if (auto later = retry_later_error(res)) throw error(std::move(*later));
          return record_of(res);
        },
        [](tx&, const attempt&, const response& recorded) { return recorded; }, o);
  };
  start(p);
}

}  // namespace orpheus::beast
