#include "orpheus/beast/middleware.hpp"

#include <algorithm>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <charconv>
#include <nlohmann/json.hpp>

#include "orpheus/api_keys.hpp"
#include "orpheus/beast/server.hpp"
#include "orpheus/detail/ascii.hpp"
#include "orpheus/detail/records.hpp"
#include "orpheus/identify.hpp"
#include "orpheus/log.hpp"
#include "orpheus/problem.hpp"

namespace orpheus::beast {

namespace http = boost::beast::http;

namespace {

// Beast 1.74 speaks boost::string_view.
std::string_view sv(boost::beast::string_view v) { return {v.data(), v.size()}; }

// The pool's queue is full: nothing was started.
error_info overloaded() {
  return error_info::of(error_class::unavailable, codes::overloaded,
                        "too many requests queued; retry later");
}

// Every field named `name`, joined as a proxy may join them (RFC 9110,
// section 5.3); nullopt when there is none. Found in review: req[name] is
// the first field alone, so a retry whose client or proxy added a second
// key ran under the first one it saw (a new key, a second charge), and
// "X-Account: a" with "X-Account: b" and with "X-Account: c" had one
// fingerprint (the second request was answered with the first's record).
std::optional<std::string> joined_field(const http_request& req, std::string_view name) {
  std::optional<std::string> value;
  for (auto [it, end] = req.equal_range(boost::beast::string_view(name.data(), name.size()));
       it != end; ++it) {
    if (value) {
      value->append(", ").append(sv(it->value()));
    } else {
      value.emplace(sv(it->value()));
    }
  }
  return value;
}

// What a request sent without a key (where none is required) is told when
// process() failed in a way a keyed one would retry. Its key was made up
// and never sent back, so "retry with the same key" cannot be followed: a
// retry is a new request under a new key and new downstream keys, and the
// first may have run (found in review: with keys optional on POST, a
// downstream timeout was answered "retryable", and the retry charged
// again). Same status and code; not retryable, and it says why.
error_info unkeyed_retry_refused(const error_info& e) {
  return error_info::of(error_class::internal, e.code,
                        "this request was sent without an Idempotency-Key and may have been "
                        "carried out; sending it again may carry it out twice. Send requests "
                        "with an Idempotency-Key to retry them safely")
      .with_http_status(http_status_of(e))
      .with_internal(e.internal);
}

// The request as the core's identify() and canonical_request() read it.
request_text text_of(const http_request& req, const std::vector<std::string>& headers) {
  request_text t{sv(req.method_string()),
                 sv(req.target()),
                 sv(req[http::field::content_type]),
                 req.body(),
                 {}};
  t.headers.reserve(headers.size());
  for (const auto& name : headers) {
    t.headers.emplace_back(name, joined_field(req, name).value_or(std::string()));
  }
  return t;
}

// Headers of one connection or of the message's framing (RFC 9110, 7.6.1),
// and Content-Length: the way out recomputes them. Found in review: a
// one-lambda handler that returned the bank's answer as it came had the
// bank's connection headers (Connection, Keep-Alive, Transfer-Encoding)
// recorded and sent with the first answer and every replay, as if they were
// this server's (prepare_payload() happened to drop a chunked encoding).
bool framing_header(std::string_view name) {
  // Not Upgrade: a 426 must carry it (RFC 9110, 15.5.22).
  switch (http::string_to_field(boost::beast::string_view(name.data(), name.size()))) {
    case http::field::content_length:
    case http::field::transfer_encoding:
    case http::field::connection:
    case http::field::keep_alive:
    case http::field::proxy_connection:
    case http::field::te:
    case http::field::trailer:
      return true;
    default:
      return false;
  }
}

}  // namespace

scope_function bearer_scope(api_keys keys, std::string prefix) {
  // Found in review: a prefix that breaks the scope rule made every request
  // a client's 400 invalid_scope, final; refused once, here. With the
  // longest client it still keeps the rule.
  if (auto why = invalid_scope_reason(prefix + std::string(api_keys::max_client_bytes, 'c'))) {
    throw config_error("bearer_scope: the prefix '" + prefix +
                       "' makes scopes that break the rule: " + *why);
  }
  return [keys = std::move(keys),
          prefix = std::move(prefix)](const http_request& req) -> std::optional<std::string> {
    // One credential: req[] is the first field alone, and a second one was
    // ignored (found in review), as gRPC refuses two `authorization` entries.
    if (req.count(http::field::authorization) != 1) return std::nullopt;
    auto client = keys.client_of(sv(req[http::field::authorization]));
    if (!client) return std::nullopt;
    return prefix + *client;
  };
}

response record_of(const http_response& res) {
  response r;
  r.status = static_cast<int>(res.result_int());
  for (const auto& field : res) {
    if (framing_header(sv(field.name_string()))) continue;
    r.headers.emplace_back(std::string(sv(field.name_string())), std::string(sv(field.value())));
  }
  r.body = res.body();
  return r;
}

std::optional<error_info> retry_later_error(const http_response& res) {
  const unsigned status = res.result_int();
  // 409 and 425 (Too Early, RFC 8470): downstream is still busy with this
  // key. 408: downstream gave up waiting for the handler's request, which it
  // may still have acted on. Found in review: 425 and 408 were recorded, and
  // replayed for the key's whole retention, though the client helper reads
  // 408 as "retry" and the payment wrapper both as an unknown outcome.
  const bool busy = status == 409 || status == 425;
  if ((!busy && status != 408 && !retry_later_status(status)) || says_final(res)) {
    return std::nullopt;
  }
  std::chrono::milliseconds retry_after{1000};
  if (auto it = res.find(http::field::retry_after); it != res.end()) {
    // Delta-seconds only (an HTTP date is left to the default), cut to a
    // day (found in review: a longer one, a maintenance window, became the
    // default second, and clients came back at once).
    const std::string_view v = sv(it->value());
    unsigned seconds = 0;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), seconds);
    const bool digits = !v.empty() && end == v.data() + v.size();
    if (digits && ec == std::errc()) {
      retry_after = std::chrono::seconds(std::min(seconds, 86400U));
    } else if (digits && ec == std::errc::result_out_of_range) {
      retry_after = std::chrono::seconds(86400);
    }
  }
  const bool throttled = status == 429;
  std::string internal = "the handler answered " + std::to_string(status) + ": " +
                         res.body().substr(0, std::min<std::size_t>(res.body().size(), 200));
  if (throttled) {
    return error_info::of(error_class::unavailable, codes::downstream_throttled,
                          "downstream asked to slow down; retry with the same key")
        .with_http_status(static_cast<int>(status))
        .with_retry_after(retry_after)
        .with_internal(std::move(internal));
  }
  if (busy) {  // downstream is still busy with this key: its outcome is unknown
    return error_info::of(error_class::in_doubt, codes::downstream_in_progress,
                          "downstream is still processing this request; retry with the same key")
        .with_http_status(static_cast<int>(status))
        .with_retry_after(retry_after)
        .with_internal(std::move(internal));
  }
  // A 408 of this server's would say that it did not get the request: the
  // handler did, and downstream timed out, so the client is told 504.
  return error_info::of(error_class::in_doubt, codes::downstream_failed,
                        "the request failed downstream and was not recorded; retry with the "
                        "same key")
      .with_http_status(status == 408 ? 504 : static_cast<int>(status))
      .with_retry_after(retry_after)
      .with_internal(std::move(internal));
}

middleware::middleware(manager& m, work_pool& pool, middleware_options options)
    : manager_(m), pool_(pool), options_(std::move(options)) {
  if (!options_.scope) throw config_error("middleware: a scope extractor is required");
  if (options_.www_authenticate.empty() ||
      std::any_of(options_.www_authenticate.begin(), options_.www_authenticate.end(),
                  [](unsigned char c) { return (c < 0x20 && c != '\t') || c == 0x7f; })) {
    throw config_error(
        "middleware: www_authenticate (the 401's challenge) is empty or not one "
        "line of text");
  }
  // RFC 6750 section 3: the auth-scheme, then its parameters after a space.
  const std::string_view challenge = options_.www_authenticate;
  const std::size_t scheme_end = std::min(challenge.find(' '), challenge.size());
  if (boost::beast::iequals(boost::beast::string_view(challenge.data(), scheme_end), "Bearer")) {
    const bool has_params = challenge.find_first_not_of(' ', scheme_end) != std::string_view::npos;
    invalid_token_challenge_ =
        options_.www_authenticate + (has_params ? ", " : " ") + R"(error="invalid_token")";
  }
  // Header names are tokens (found in review: a CR or LF in key_header was
  // written into every keyed answer).
  const auto header_name = [](const std::string& name) {
    return detail::sendable_field(name, "", detail::max_header_value);
  };
  if (!header_name(options_.key_header)) {
    throw config_error("middleware: key_header '" + options_.key_header +
                       "' is not a header name (a token)");
  }
  for (const auto& h : options_.fingerprint_headers) {
    if (!header_name(h)) {
      throw config_error("middleware: fingerprint header '" + h + "' is not a header name");
    }
  }
  validate(options_.wait);  // what process() would refuse on every request
  // Found in review: a retention here applied to every keyed request, past
  // validate(config)'s check that records outlive the retry window (a
  // record purged while its client may still retry runs again: a second
  // charge), while Idempotency-Key-Retention still announced the manager's.
  if (options_.wait.retention) {
    throw config_error(
        "middleware: wait.retention would apply to every request; set the manager's "
        "config::retention instead");
  }
  for (auto& h : options_.fingerprint_headers) h = detail::ascii_lower(h);
}

std::string middleware::canonical_request(const http_request& req,
                                          const std::vector<std::string>& headers,
                                          std::size_t max_json_depth) {
  return orpheus::canonical_request(text_of(req, headers), max_json_depth);
}

// The core decides (orpheus/identify.hpp); this only reads the Beast request
// and writes the refusal as an HTTP answer (never echoing a refused key).
std::variant<request_id, http_response> middleware::identify(const http_request& req) const {
  // Two fields are two keys, whatever they hold, as in the gRPC adapter
  // (found in review: '"ab' and 'cd"', joined, read as the one quoted key
  // 'ab, cd', a new key for a retry of '"ab,cd"': a second charge). A list
  // in one field (a proxy joined them) is the core's to refuse.
  const boost::beast::string_view key_name(options_.key_header.data(), options_.key_header.size());
  if (req.count(key_name) > 1) {
    return error_response(
        error_info::of(error_class::invalid_input, codes::invalid_key,
                       options_.key_header +
                           " holds more than one value (the header was sent twice): send one key"),
        {});
  }
  const std::optional<std::string> key_value = joined_field(req, options_.key_header);
  const identify_options rules{
      options_.key_header,
      std::find(options_.key_required_on.begin(), options_.key_required_on.end(), req.method()) !=
          options_.key_required_on.end(),
      options_.max_json_depth};
  auto who = orpheus::identify(
      text_of(req, options_.fingerprint_headers), key_value, [&] { return options_.scope(req); },
      rules);
  if (auto* refused = std::get_if<error_info>(&who)) {
    auto res = error_response(*refused, {});
    if (res.result() == http::status::unauthorized && !invalid_token_challenge_.empty() &&
        bearer_token(sv(req[http::field::authorization]))) {
      res.set(http::field::www_authenticate, invalid_token_challenge_);
    }
    return res;
  }
  return std::get<identity>(std::move(who)).id;
}

http_response middleware::error_response(const error_info& e, const std::string& key) const {
  const response p = problem_response(e);
  http_response res{static_cast<http::status>(p.status), 11};
  for (const auto& [name, value] : p.headers) res.set(name, value);
  res.body() = p.body;
  if (p.status == 401) res.set(http::field::www_authenticate, options_.www_authenticate);
  if (e.retryable()) {
    // Whole seconds, rounded up.
    const auto after = announced_retry_after(e);
    res.set(http::field::retry_after, std::to_string((after.count() + 999) / 1000));
  }
  if (!key.empty()) {
    res.set(options_.key_header, key_header_value(key));  // as the client sends it
    res.set("Idempotency-Key-Retention", retention_seconds());
  }
  res.prepare_payload();
  return res;
}

std::shared_ptr<middleware::pending> middleware::admit(http_request&& req,
                                                       const responder& respond) {
  const auto started = std::chrono::steady_clock::now();
  std::variant<request_id, http_response> who;
  // Found in review: what identify() threw (no randomness for a made-up key,
  // a scope function that failed) went out as the server's bare 500, not the
  // problem+json every other refusal is. Nothing has run yet: what is not an
  // orpheus::error is retryable, whatever config::unclassified says (that
  // policy is for a call downstream that may have taken effect).
  try {
    who = identify(req);
  } catch (...) {
    const error_info info = classify(std::current_exception(), unclassified_policy::retryable);
    log_internal(info, "before the request was identified");
    who = error_response(info, {});
  }
  if (auto* early = std::get_if<http_response>(&who)) {
    notify_observer(req, *early, started);
    respond(std::move(*early));
    return nullptr;
  }
  auto p = std::make_shared<pending>();
  p->id = std::get<request_id>(std::move(who));
  p->key_sent = req.find(options_.key_header) != req.end();
  p->req = std::move(req);
  p->respond = respond;
  p->started = started;
  p->wait_until = started + options_.wait.wait_for;
  return p;
}

void middleware::start(const std::shared_ptr<pending>& p) {
  // Found in review: the full queue's 503 went straight to the responder,
  // so observe never saw it and the key was not echoed, unlike the 503 of
  // a wait that the draining pool refuses.
  if (!pool_.try_submit([this, p] { try_once(p); })) {
    finish(*p, error_response(refused_by_pool(), p->key_sent ? p->id.key : std::string()));
  }
}

// Found in review: a pool that refuses a job because it is draining said
// "too many requests queued" (overloaded), so a stop read as an overload
// in metrics and logs. Both are retryable; the code says which.
error_info middleware::refused_by_pool() const {
  return pool_.draining() ? work_pool::draining_refusal() : overloaded();
}

// Found in review: what run_once() threw outside its own guards (an answer,
// or the timer of a wait, that could not be allocated) went to the pool,
// which swallows it, and the request was never answered: its connection
// waited for ever and kept its slot. It is answered as a failure of unknown
// cause: retryable with the key, whose record decides what a retry gets
// (unkeyed, as unkeyed_retry_refused() says). Never a second answer; when
// even that cannot be built, the connection is dropped.
void middleware::try_once(const std::shared_ptr<pending>& p) {
  try {
    run_once(p);
  } catch (...) {
    if (p->answered) return;
    try {
      const error_info info = classify(std::current_exception(), unclassified_policy::retryable);
      log_internal(info, "scope=" + p->id.scope + " key=" + p->id.key);
      finish(*p, failure_response(*p, info));
    } catch (...) {
      drop_unanswered(*p);
    }
  }
}

void middleware::drop_unanswered(pending& p) noexcept {
  if (p.answered) return;
  p.answered = true;
  try {
    p.respond(drop_connection());
  } catch (...) {  // NOLINT(bugprone-empty-catch): nothing is left to answer with
  }
}

http_response middleware::failure_response(const pending& p, const error_info& e) const {
  if (p.key_sent || !e.retryable() || idempotent_by_http(p.req.method())) {
    return error_response(e, p.key_sent ? p.id.key : std::string());
  }
  // It may have run: flagged in doubt as well (found in review: the rewritten
  // class dropped the flag, and a caller reading the flags took the answer
  // for a recorded final failure).
  http_response res = error_response(unkeyed_retry_refused(e), {});
  auto body = nlohmann::json::parse(res.body(), nullptr, false);
  if (body.is_object()) {
    body["in_doubt"] = true;
    res.body() = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    res.prepare_payload();
  }
  return res;
}

// One try of process(), on a pool thread. It never waits inside process():
// issue 7, defect 14(c), the manager's wait loop slept on the pool thread,
// so a few waiters on one held key starved every other request.
void middleware::run_once(const std::shared_ptr<pending>& p) {
  process_options o = options_.wait;
  o.wait_for = std::chrono::milliseconds(0);
  // A made-up key can never be sent again: nobody can replay its record.
  // Issue 7, defect 12: such rows used to be kept for the full retention.
  if (!p->key_sent) o.retention = std::chrono::milliseconds(0);
  const std::string shown_key = p->key_sent ? p->id.key : std::string();
  // Nothing of a request still queued when the drain began has run: the
  // stop waits only for the requests already running.
  if (pool_.draining()) {
    return finish(*p, error_response(work_pool::draining_refusal(), shown_key));
  }
  const outcome<response> out = p->run(p->id, p->req, o);
  if (!out.ok()) {
    const error_info& e = out.error();
    if (e.code == codes::in_progress && wait_again(p, e.retry_after)) return;
    log_internal(e, "scope=" + p->id.scope + " key=" + p->id.key);
    return finish(*p, failure_response(*p, e));
  }
  const response& r = out.value();
  // Only a record from before such answers were refused (a handler's 1xx,
  // or an operator's resolve with one) cannot be sent. As it was, it went
  // out as a bare 500 that clients retried until they gave up, for a request
  // whose RPC had run: a final problem instead, marked replayed, that tells
  // the client not to retry with this key.
  const auto unsendable = [&](const std::string& why) {
    const error_info e =
        error_info::of(error_class::internal, codes::unclassified,
                       "the recorded answer to this request cannot be sent; do not retry with "
                       "this key: the service's operators can tell what became of it")
            .with_internal(why);
    log_internal(e, "scope=" + p->id.scope + " key=" + p->id.key);
    http_response res = error_response(e, shown_key);
    if (r.replayed) res.set("Idempotent-Replayed", "true");
    return res;
  };
  if (!is_final_status(r.status)) {
    return finish(*p, unsendable("recorded status " + std::to_string(r.status)));
  }
  http_response res;
  try {  // the pool swallows what a job throws: every request gets an answer
    res = http_response{static_cast<http::status>(r.status), 11};
    // This server's own idempotency headers, set below from this request
    // alone. Found in review: a handler that passed on an idempotent
    // downstream's answer sent its "Idempotent-Replayed: true" with a first
    // answer, and its key headers with an answer to a request without one.
    const auto own_header = [&](const std::string& name) {
      return boost::beast::iequals(name, "Idempotent-Replayed") ||
             boost::beast::iequals(name, options_.key_header) ||
             boost::beast::iequals(name, "Idempotency-Key") ||
             boost::beast::iequals(name, "Idempotency-Key-Retention");
    };
    for (const auto& [name, value] : r.headers) {
      // Records made before record_of() dropped them, and the two-lambda
      // form's own headers.
      if (framing_header(name) || own_header(name)) continue;
      if (detail::sendable_field(name, value, detail::max_header_value)) {
        res.insert(name, value);
        continue;
      }
      // A record made before finish() refused such headers: the status and
      // body say what became of the request, so they go out, with a control
      // character (a line break would send the rest of the value as a header
      // of its own) replaced by a space as RFC 9110 (5.5) allows, and a
      // header that cannot be sent even so left out (found in review: both
      // made the answer a final failure, for a request that had succeeded).
      std::string clean = value;
      std::replace_if(
          clean.begin(), clean.end(),
          [](char c) { return detail::header_control(static_cast<unsigned char>(c)); }, ' ');
      if (detail::sendable_field(name, clean, detail::max_header_value)) {
        res.insert(name, clean);
      } else {
        log(log_level::error, "orpheus::beast: scope=" + p->id.scope + " key=" + p->id.key +
                                  ": the recorded header '" + name.substr(0, 64) +
                                  "' cannot be sent; answered without it");
      }
    }
    // A 204 or 304 has no body on the wire (found in review: a
    // recorded 204 with "{}" made prepare_payload() throw, and every replay
    // of a charged payment answered 500 "do not retry"). The record keeps
    // what the handler returned.
    if (r.status != 204 && r.status != 304) res.body() = r.body;
    if (r.replayed) res.set("Idempotent-Replayed", "true");
    if (p->key_sent) {
      res.set(options_.key_header, key_header_value(p->id.key));  // as the client sends it
      res.set("Idempotency-Key-Retention", retention_seconds());
    }
    res.prepare_payload();
  } catch (const std::bad_alloc&) {  // not the record's fault, and it passes: retry
    const error_info info = classify(std::current_exception(), unclassified_policy::retryable);
    log_internal(info, "scope=" + p->id.scope + " key=" + p->id.key);
    // The request ran: unkeyed, not retryable (found in review: a charged
    // unkeyed POST was told to retry, under a new key).
    res = failure_response(*p, info);
  } catch (const std::exception& e) {
    res = unsendable(std::string("the recorded answer: ") + e.what());
  } catch (...) {
    res = unsendable("the recorded answer: an exception of no known type");
  }
  finish(*p, std::move(res));
}

// The key is held by another attempt: try again after a short poll (never
// later than the caller's wait allows), from the pool's timer. False when
// the wait is over (or the pool is draining): the caller answers 409.
bool middleware::wait_again(const std::shared_ptr<pending>& p,
                            std::optional<std::chrono::milliseconds> retry_after) {
  const auto now = std::chrono::steady_clock::now();
  if (now >= p->wait_until) return false;
  auto delay = std::min(p->poll, std::chrono::ceil<std::chrono::milliseconds>(p->wait_until - now));
  if (retry_after && *retry_after > std::chrono::milliseconds(0))
    delay = std::min(delay, *retry_after);
  p->poll = std::min(p->poll * 2, std::chrono::milliseconds(200));
  return pool_.submit_after(
      delay, [this, p] { try_once(p); },
      [this, p] {
        // On the pool's timer thread, which swallows what this throws (found
        // in review: then the request was never answered).
        try {
          finish(*p, error_response(overloaded(), p->key_sent ? p->id.key : std::string()));
        } catch (...) {
          drop_unanswered(*p);
        }
      });
}

void middleware::finish(pending& p, http_response res) const {
  notify_observer(p.req, res, p.started);
  p.answered = true;
  p.respond(std::move(res));
}

// The observer's failure is its own: the answer goes out whatever it does
// (found in review: a throwing observer on a pool thread left a charged
// payment, and every replay of it, without an answer).
void middleware::notify_observer(const http_request& req, const http_response& res,
                                 std::chrono::steady_clock::time_point started) const noexcept {
  if (!options_.observe) return;
  try {
    options_.observe(req, res,
                     std::chrono::duration_cast<std::chrono::microseconds>(
                         std::chrono::steady_clock::now() - started));
  } catch (...) {
    try {
      log(log_level::error, "orpheus::beast: the observe hook threw; the answer went out anyway");
    } catch (...) {  // nothing more to do: the answer matters more than the line
    }
  }
}

// Issue 7, defect 13: the detail clients must not see (hosts, SQL, what())
// is still needed by whoever runs the service.
void middleware::log_internal(const error_info& e, std::string_view about) const {
  if (e.internal.empty()) return;
  std::string line = "orpheus::beast: answered ";
  line += std::to_string(http_status_of(e));
  line += " " + e.code + " ";
  line += about;
  line += ": " + e.internal;
  log(log_level::error, line);
}

std::string middleware::retention_seconds() const {
  return std::to_string(
      std::chrono::duration_cast<std::chrono::seconds>(manager_.settings().retention).count());
}

// Found in review: run_blocking() answered without the observe hook (a
// GET, its 503s included, was never counted), and a job still queued when
// the drain began ran all the same, where docs/http.md says nothing of such
// a request runs. Every answer goes through finish_blocking(); a job checks
// the drain before its work.
void middleware::run_blocking(http_request&& req, const responder& respond,
                              std::function<http_response(const http_request&)> work) {
  struct call {
    http_request req;
    responder respond;
    std::function<http_response(const http_request&)> work;
    std::chrono::steady_clock::time_point started;
  };
  auto c = std::make_shared<call>(
      call{std::move(req), respond, std::move(work), std::chrono::steady_clock::now()});
  auto answer = [this](const call& to, http_response res) {
    notify_observer(to.req, res, to.started);
    to.respond(std::move(res));
  };
  auto job = [this, c, answer] {
    if (pool_.draining()) return answer(*c, error_response(work_pool::draining_refusal(), {}));
    const std::string where = "target=" + std::string(sv(c->req.target()));
    std::optional<http_response> res;
    try {
      res = c->work(c->req);
    } catch (const error& e) {
      log_internal(e.info(), where);
      res = error_response(e.info(), {});
    } catch (...) {
      const error_info info = classify(std::current_exception(), manager_.settings().unclassified);
      log_internal(info, where);
      res = error_response(info, {});
    }
    answer(*c, std::move(*res));
  };
  if (!pool_.try_submit(std::move(job))) answer(*c, error_response(refused_by_pool(), {}));
}

}  // namespace orpheus::beast
