#include "orpheus/client/client.hpp"

#include <algorithm>
#include <boost/beast/http.hpp>
#include <optional>
#include <stdexcept>
#include <string_view>
#include <thread>

#include "orpheus/error.hpp"
#include "orpheus/request.hpp"

namespace orpheus::client {

namespace http = boost::beast::http;

namespace {

// RFC 9110 section 5.6.2: a header name is a token.
bool is_token(std::string_view s) noexcept {
  constexpr std::string_view marks = "!#$%&'*+-.^_`|~";
  return !s.empty() && std::all_of(s.begin(), s.end(), [&](char c) {
    return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
           marks.find(c) != std::string_view::npos;
  });
}

// A byte HTTP/1.1 cannot carry in a header value or a request line: the
// control bytes (CR and LF among them) and DEL; HTAB only in a value.
bool is_control(char c, bool tab_allowed) noexcept {
  const auto b = static_cast<unsigned char>(c);
  return (b < 0x20 && !(tab_allowed && b == '\t')) || b == 0x7f;
}

// Why HTTP/1.1 cannot carry the request line or a header as given, or
// nullopt. Beast writes them as they are: a CR LF in a value ends the
// header there and starts another (pay_client sent its --api-key
// "k\r\nX: y" or --client so, and the server answered). Values are never
// quoted back: an Authorization value is a secret.
std::optional<std::string> unsendable_reason(
    std::string_view target, const std::vector<std::pair<std::string, std::string>>& headers) {
  if (target.empty() || std::any_of(target.begin(), target.end(),
                                    [](char c) { return c == ' ' || is_control(c, false); })) {
    return "the request target must be non-empty, without spaces or control bytes";
  }
  for (const auto& [name, value] : headers) {
    if (!is_token(name)) {
      // Named only when it is printable: a CR LF in it would forge a line
      // of whatever log the message goes to.
      const bool printable =
          std::none_of(name.begin(), name.end(), [](char c) { return is_control(c, false); });
      return (printable ? "header name \"" + name + "\"" : std::string("a header name")) +
             " is not an HTTP token (RFC 9110 section 5.6.2)";
    }
    if (std::any_of(value.begin(), value.end(), [](char c) { return is_control(c, true); })) {
      return "the value of header " + name + " holds a control byte (CR, LF, NUL, ...)";
    }
  }
  return std::nullopt;
}

}  // namespace

prepared_request::prepared_request(http::verb method, std::string target, std::string body,
                                   std::vector<std::pair<std::string, std::string>> headers,
                                   std::string key)
    : method_(method),
      target_(std::move(target)),
      body_(std::move(body)),
      headers_(std::move(headers)),
      key_(std::move(key)) {
  // The server's rule, not a copy of it: a key refused here is a key the
  // server would refuse (issue 9, fuzzing: " k" reached the server as "k").
  if (auto why = invalid_key_reason(key_)) throw std::invalid_argument(*why);
  if (auto why = unsendable_reason(target_, headers_)) throw std::invalid_argument(*why);
  // What Beast cannot frame (an unknown method, a TRACE with a body) is
  // refused here too, not by send()'s first attempt with a bare exception
  // (found in review). Beast's own rule, by building the message once;
  // Beast would write verb::unknown as "<unknown>".
  if (method_ == http::verb::unknown) throw std::invalid_argument("the request has no method");
  try {
    (void)message("Idempotency-Key");
  } catch (const std::exception& e) {
    throw std::invalid_argument(std::string("the request cannot be framed as HTTP/1.1: ") +
                                e.what());
  }
}

http_request prepared_request::message(const std::string& key_header) const {
  http_request req{method_, target_, 11};
  for (const auto& [name, value] : headers_) req.set(name, value);
  // A key that starts with '"' goes quoted, else the server would read it
  // as an sf-string: "abc" arrived as abc, another request's key (issue 9).
  req.set(key_header, key_header_value(key_));
  req.body() = body_;
  req.prepare_payload();
  return req;
}

retry_loop::retry_loop(const client_options& o, const prepared_request& req)
    : o_(o), req_(req), started_(o.time.now()), rng_(std::random_device{}()) {
  result_.key = req.key();
  result_.earlier_attempt_in_doubt = req.resuming_earlier_run();
}

std::chrono::milliseconds retry_loop::attempt_timeout() const {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      started_ + o_.policy.deadline - o_.time.now());
  return std::max(std::chrono::milliseconds(1), std::min(o_.policy.attempt_timeout, left));
}

std::optional<std::chrono::milliseconds> retry_loop::after(
    std::optional<http_response> res, std::optional<beast::transport_error> failure) {
  ++result_.attempts;
  attempt_info info;
  info.number = result_.attempts;
  info.key = result_.key;
  std::optional<std::chrono::milliseconds> retry_after;
  if (res) {
    info.status = res->result_int();
    info.kind = kind_of_status(info.status);
    // The server's own word wins: a problem+json body with "retryable":
    // false (a recorded terminal failure) is final whatever its status.
    // Only a JSON boolean counts: value("retryable", true) threw
    // nlohmann's type_error out of send() on "yes", 1 or null (issue 7,
    // defect 14); anything but a boolean is treated as absent.
    // (beast::says_final(), the rule the middleware applies too).
    if (info.kind != error_kind::none && beast::says_final(*res)) info.kind = error_kind::none;
    // A replayed answer is one the server recorded for good (a handler's),
    // not one about this delivery: final whatever its status (found in
    // review of the 408 retry; then of a recorded 503, retried until the
    // attempts ran out, which told the caller nothing was settled).
    if ((*res)["Idempotent-Replayed"] == "true") info.kind = error_kind::none;
    const auto ra = (*res)[http::field::retry_after];
    if (!ra.empty())
      retry_after = parse_retry_after(std::string_view(ra.data(), ra.size()), o_.time.wall_now());
    result_.replayed = (*res)["Idempotent-Replayed"] == "true";
    result_.response = std::move(res);
  } else {
    info.kind = kind_of_transport(failure ? failure->error_kind() : transport_failure::closed);
    // From the error's own strings, not what(): a transport_error from the
    // http_client's io thread shares std::runtime_error's text with the
    // io thread's copy (TSan saw this thread read it as the io thread freed
    // it; the reference count is libstdc++'s, unseen by TSan).
    if (failure) {
      const auto& e = failure->info();
      info.error = e.internal.empty() ? e.message : e.internal;
    } else {
      info.error = "no answer";
    }
  }
  result_.last_error = info.kind;
  result_.elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(o_.time.now() - started_);

  auto stop = [&](stop_reason why) -> std::optional<std::chrono::milliseconds> {
    result_.why = why;
    // A copy of the request sent at the same time may have left it in doubt
    // while this call ran: the request's mark is read again at the end, not
    // only at the start (found in review: a send answered 401 while a
    // copy's attempt went unanswered was settled(), and its caller could pay
    // again under a new key).
    if (req_.resuming_earlier_run()) result_.earlier_attempt_in_doubt = true;
    if (o_.on_attempt) o_.on_attempt(info);
    return std::nullopt;
  };
  // A final answer that says it is in doubt (the server's 500 for a handler
  // that threw, perhaps after it charged) does not say what became of the
  // request either (found in review: it was settled(), and pay_client
  // forgot the key of a payment that may have gone through). A replay is
  // the server's record, final as it is.
  if (!retryable(info.kind)) {
    if (info.status != 0 && !result_.replayed && beast::says_in_doubt(*result_.response)) {
      result_.earlier_attempt_in_doubt = true;
      req_.may_have_been_sent();
    }
    o_.budget->on_success();
    return stop(stop_reason::answered);
  }
  // Did this attempt leave the request in doubt? Nothing reached the server
  // on a failed connect, and a 408 or a 429 says it did not act. Recorded
  // before any stop (found in review: a call that stopped here on its
  // attempt cap said nothing was in doubt, and the request, sent again and
  // answered 401, was settled()), and in the request, for its later sends.
  // An answer that says it is in doubt arrived, whatever its status (found
  // in review: an in-doubt 429 was taken for "not acted on").
  const bool arrived =
      info.status != 0
          ? info.kind == error_kind::conflict || info.kind == error_kind::server ||
                (result_.response && beast::says_in_doubt(*result_.response))
          : may_have_arrived(failure ? failure->error_kind() : transport_failure::closed);
  if (arrived) {
    result_.earlier_attempt_in_doubt = true;
    req_.may_have_been_sent();
  }
  if (result_.attempts >= o_.policy.max_attempts) return stop(stop_reason::attempts_exhausted);
  const double r =
      o_.time.random01 ? o_.time.random01() : std::uniform_real_distribution<>(0, 1)(rng_);
  info.wait = backoff(o_.policy, result_.attempts, retry_after, r);
  if (o_.time.now() + info.wait >= started_ + o_.policy.deadline) {
    info.wait = std::chrono::milliseconds(0);
    return stop(stop_reason::deadline);
  }
  if (!o_.budget->try_spend(info.kind)) {
    info.wait = std::chrono::milliseconds(0);
    return stop(stop_reason::budget_exhausted);
  }
  if (o_.on_attempt) o_.on_attempt(info);
  return info.wait;
}

idempotent_client::idempotent_client(http_endpoint server, client_options options)
    : server_(std::move(server)), options_(std::move(options)) {
  validate(options_.policy);
  if (!options_.budget) throw config_error("client_options: no retry budget");
  if (!is_token(options_.key_header)) {
    throw config_error("client_options: the key header's name must be an HTTP token, non-empty");
  }
  if (!options_.http) options_.http = std::make_shared<beast::http_client>();
}

call_result idempotent_client::send(const prepared_request& req) const {
  retry_loop loop(options_, req);
  for (;;) {
    std::optional<http_response> res;
    std::optional<beast::transport_error> failure;
    try {
      res = options_.http->send(server_, req.message(options_.key_header), loop.attempt_timeout());
    } catch (const beast::transport_error& e) {
      failure = e;
    }
    const auto wait = loop.after(std::move(res), std::move(failure));
    if (!wait) return std::move(loop).result();
    if (options_.time.sleep) {
      options_.time.sleep(*wait);
    } else {
      std::this_thread::sleep_for(*wait);
    }
  }
}

}  // namespace orpheus::client
