#include "orpheus/beast/middleware.hpp"

#include <algorithm>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include "orpheus/detail/hex.hpp"
#include "orpheus/log.hpp"

namespace orpheus::beast {

namespace http = boost::beast::http;

namespace {

// Beast 1.74 speaks boost::string_view.
std::string_view sv(boost::beast::string_view v) { return {v.data(), v.size()}; }

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

// Form bodies: the same fields in another order are the same request. Only
// the NAMES are ordered, stably: the order of a repeated field is part of its
// meaning. (Issue 7, defect 2: sorting whole "name=value" fields gave
// amount=100&...&amount=5 and amount=5&...&amount=100 one fingerprint, and
// the second payment was answered with the first one's replay.)
// Issue 9 (fuzzing): names are compared as a handler reads them, decoded
// ('+' is a space, %XX a byte): amount=100&%61mount=5 and
// %61mount=5&amount=100 were one fingerprint, though both send "amount"
// twice, in another order. The fields themselves are kept as sent.
std::string canonical_form(std::string_view body) {
  using orpheus::detail::hex_digit_value;
  auto decoded_name = [&](std::string_view f) {
    f = f.substr(0, f.find('='));
    std::string out;
    for (std::size_t i = 0; i < f.size(); ++i) {
      if (f[i] == '+') {
        out += ' ';
      } else if (f[i] == '%' && i + 2 < f.size() && hex_digit_value(f[i + 1]) >= 0 &&
                 hex_digit_value(f[i + 2]) >= 0) {
        out += static_cast<char>(hex_digit_value(f[i + 1]) * 16 + hex_digit_value(f[i + 2]));
        i += 2;
      } else {
        out += f[i];
      }
    }
    return out;
  };
  std::vector<std::pair<std::string, std::string_view>> fields;  // decoded name, field
  while (!body.empty()) {
    const auto amp = body.find('&');
    const auto field = body.substr(0, amp);
    fields.emplace_back(decoded_name(field), field);
    body = amp == std::string_view::npos ? std::string_view{} : body.substr(amp + 1);
  }
  std::stable_sort(fields.begin(), fields.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::string out;
  for (const auto& f : fields) out.append(f.second).push_back('&');
  return out;
}

bool is_json(const http_request& req) {
  return lower(sv(req[http::field::content_type])).rfind("application/json", 0) == 0;
}

// Whether a JSON text nests arrays and objects deeper than `limit`: one pass,
// no recursion, brackets inside strings ignored. Issue 7, defect 14(a):
// nlohmann's dump() (and the handler's own use of the value) recurses once
// per level, so 100000 '[' overflowed the io thread's stack.
bool nested_deeper_than(std::string_view text, std::size_t limit) {
  std::size_t depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return true;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return false;
}

std::string canonical_body(const http_request& req, std::size_t max_json_depth) {
  const auto type = lower(sv(req[http::field::content_type]));
  if (type.rfind("application/json", 0) == 0 && !nested_deeper_than(req.body(), max_json_depth)) {
    // Parsed and dumped again: key order and white space do not matter. A
    // body that does not parse is fingerprinted as it is (the handler will
    // refuse it anyway).
    auto j = nlohmann::json::parse(req.body(), nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded()) return "json:" + j.dump();
  }
  if (type.rfind("application/x-www-form-urlencoded", 0) == 0) {
    return "form:" + canonical_form(req.body());
  }
  return "raw:" + req.body();
}

}  // namespace

response record_of(const http_response& res) {
  response r;
  r.status = static_cast<int>(res.result_int());
  for (const auto& field : res) {
    if (field.name() == http::field::content_length) continue;  // recomputed on the way out
    r.headers.emplace_back(std::string(sv(field.name_string())), std::string(sv(field.value())));
  }
  r.body = res.body();
  return r;
}

middleware::middleware(manager& m, work_pool& pool, middleware_options options)
    : manager_(m), pool_(pool), options_(std::move(options)) {
  if (!options_.scope) throw config_error("middleware: a scope extractor is required");
  if (options_.key_header.empty()) throw config_error("middleware: key_header is empty");
  for (auto& h : options_.fingerprint_headers) h = lower(h);
}

std::string middleware::canonical_request(const http_request& req,
                                          const std::vector<std::string>& headers,
                                          std::size_t max_json_depth) {
  std::string out;
  out.append(sv(req.method_string())).push_back(' ');
  out.append(sv(req.target())).push_back('\n');
  for (const auto& name : headers) {
    out.append(lower(name)).push_back(':');
    out.append(sv(req[name])).push_back('\n');
  }
  out.push_back('\n');
  out.append(canonical_body(req, max_json_depth));
  return out;
}

std::variant<request_id, http_response> middleware::identify(const http_request& req) const {
  std::optional<std::string> key;
  const auto field = req.find(options_.key_header);
  if (field != req.end()) {
    // The header's reading is the core's (key_of_header_value), the key rule
    // the core's too (validate, below): the client helper sends with the same
    // pair, so a key it accepts is a key this accepts.
    key = key_of_header_value(sv(field->value()));
    if (!key) {
      return error_response(
          error_info{400, std::string(codes::invalid_key),
                     options_.key_header + " is not a valid token or quoted string", false, false,
                     std::nullopt},
          {});
    }
  } else if (std::find(options_.key_required_on.begin(), options_.key_required_on.end(),
                       req.method()) != options_.key_required_on.end()) {
    return error_response(
        error_info{400, "missing_key", "this request needs an " + options_.key_header + " header",
                   false, false, std::nullopt},
        {});
  } else {
    // No key where none is required: no deduplication, as with any API. The
    // request runs once under a key of its own, which is not echoed.
    // 128 random bits per made-up key (issue 7.14(b): a thread_local
    // mt19937_64 seeded once was predictable and repeated in a forked child).
    key = "orpheus-unkeyed-" + orpheus::random_token();
  }
  // Before anything parses the body, here on the io thread.
  if (is_json(req) && nested_deeper_than(req.body(), options_.max_json_depth)) {
    return error_response(error_info{400, "invalid_request",
                                     "the JSON body is nested deeper than " +
                                         std::to_string(options_.max_json_depth) + " levels",
                                     false, false, std::nullopt},
                          {});
  }
  const std::optional<std::string> scope = options_.scope(req);
  if (!scope) {
    return error_response(
        error_info{401, "unauthenticated", "no caller identity", false, false, std::nullopt}, {});
  }
  request_id id{*scope, *key,
                fingerprint_of(
                    canonical_request(req, options_.fingerprint_headers, options_.max_json_depth))};
  try {
    validate(id);
  } catch (const error& e) {
    return error_response(e.info(), {});  // never echo an invalid key
  }
  return id;
}

http_response middleware::error_response(const error_info& e, const std::string& key) const {
  error_info shown = e;
  // A retryable failure that is not a conflict is "try again later": 503.
  if (shown.retryable && shown.http_status < 500 && shown.http_status != 409 &&
      shown.http_status != 429) {
    shown.http_status = 503;
  }
  const response p = problem_response(shown);
  http_response res{static_cast<http::status>(shown.http_status), 11};
  for (const auto& [name, value] : p.headers) res.set(name, value);
  res.body() = p.body;
  if (shown.retryable) {
    const auto after = shown.retry_after.value_or(std::chrono::milliseconds(1000));
    res.set(http::field::retry_after, std::to_string((after.count() + 999) / 1000));
  }
  if (!key.empty()) {
    res.set(options_.key_header, key);
    res.set("Idempotency-Key-Retention", retention_seconds());
  }
  res.prepare_payload();
  return res;
}

void middleware::start(std::shared_ptr<pending> p) {
  const responder respond = p->respond;
  submit([this, p = std::move(p)] { try_once(p); }, respond);
}

// One try of process(), on a pool thread. It never waits inside process():
// issue 7, defect 14(c), the manager's wait loop slept on the pool thread,
// so a few waiters on one held key starved every other request.
void middleware::try_once(const std::shared_ptr<pending>& p) {
  process_options o = options_.wait;
  o.wait_for = std::chrono::milliseconds(0);
  // A made-up key can never be sent again: nobody can replay its record.
  // Issue 7, defect 12: such rows used to be kept for the full retention.
  if (!p->key_sent) o.retention = std::chrono::milliseconds(0);
  const std::string shown_key = p->key_sent ? p->id.key : std::string();
  const outcome<response> out = p->run(p->id, p->req, o);
  if (!out.ok()) {
    const error_info& e = out.error();
    if (e.code == codes::in_progress && wait_again(p, e.retry_after)) return;
    log_internal(e, "scope=" + p->id.scope + " key=" + p->id.key);
    return finish(*p, error_response(e, shown_key));
  }
  http_response res;
  try {  // the pool swallows what a job throws: every request gets an answer
    const response& r = out.value();
    res = http_response{static_cast<http::status>(r.status), 11};
    for (const auto& [name, value] : r.headers) res.insert(name, value);
    res.body() = r.body;
    if (r.replayed) res.set("Idempotent-Replayed", "true");
    if (p->key_sent) {
      res.set(options_.key_header, p->id.key);
      res.set("Idempotency-Key-Retention", retention_seconds());
    }
    res.prepare_payload();
  } catch (...) {
    const error_info info = classify(std::current_exception(), manager_.settings().unclassified);
    log_internal(info, "scope=" + p->id.scope + " key=" + p->id.key);
    res = error_response(info, shown_key);
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
        finish(*p,
               error_response(error_info{503, "overloaded", "too many requests queued; retry later",
                                         true, false, std::chrono::milliseconds(1000)},
                              p->key_sent ? p->id.key : std::string()));
      });
}

void middleware::finish(const pending& p, http_response res) const {
  if (options_.observe) {
    options_.observe(p.req, res,
                     std::chrono::duration_cast<std::chrono::microseconds>(
                         std::chrono::steady_clock::now() - p.started));
  }
  p.respond(std::move(res));
}

// Issue 7, defect 13: the detail clients must not see (hosts, SQL, what())
// is still needed by whoever runs the service.
void middleware::log_internal(const error_info& e, std::string_view about) const {
  if (e.internal.empty()) return;
  std::string line = "orpheus::beast: answered ";
  line += std::to_string(e.http_status);
  line += " " + e.code + " ";
  line += about;
  line += ": " + e.internal;
  log(log_level::error, line);
}

std::string middleware::retention_seconds() const {
  return std::to_string(
      std::chrono::duration_cast<std::chrono::seconds>(manager_.settings().retention).count());
}

void middleware::submit(std::function<void()> job, const responder& respond) {
  if (!pool_.try_submit(std::move(job))) {
    respond(error_response(error_info{503, "overloaded", "too many requests queued; retry later",
                                      true, false, std::chrono::milliseconds(1000)},
                           {}));
  }
}

void middleware::run_blocking(http_request&& req, const responder& respond,
                              std::function<http_response(const http_request&)> work) {
  auto job = [this, req = std::move(req), respond, work = std::move(work)] {
    const std::string where = "target=" + std::string(sv(req.target()));
    try {
      respond(work(req));
    } catch (const error& e) {
      log_internal(e.info(), where);
      respond(error_response(e.info(), {}));
    } catch (...) {
      const error_info info = classify(std::current_exception(), manager_.settings().unclassified);
      log_internal(info, where);
      respond(error_response(info, {}));
    }
  };
  submit(std::move(job), respond);
}

}  // namespace orpheus::beast
