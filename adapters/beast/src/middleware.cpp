#include "orpheus/beast/middleware.hpp"

#include <algorithm>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>
#include <random>

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

// The key as sent: a bare token, or an RFC 8941 sf-string ("..." with \" and
// \\ escapes), as the IETF Idempotency-Key draft specifies. nullopt when the
// quoting is broken.
std::optional<std::string> unquote(std::string_view v) {
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
  if (v.empty() || v.front() != '"') return std::string(v);
  if (v.size() < 2 || v.back() != '"') return std::nullopt;
  v = v.substr(1, v.size() - 2);
  std::string out;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (v[i] == '\\') {
      if (i + 1 >= v.size() || (v[i + 1] != '"' && v[i + 1] != '\\')) return std::nullopt;
      out += v[++i];
    } else if (v[i] == '"') {
      return std::nullopt;
    } else {
      out += v[i];
    }
  }
  return out;
}

// Form bodies: the same fields in another order are the same request.
std::string canonical_form(std::string_view body) {
  std::vector<std::string_view> fields;
  while (!body.empty()) {
    const auto amp = body.find('&');
    fields.push_back(body.substr(0, amp));
    body = amp == std::string_view::npos ? std::string_view{} : body.substr(amp + 1);
  }
  std::sort(fields.begin(), fields.end());
  std::string out;
  for (const auto f : fields) out.append(f).push_back('&');
  return out;
}

std::string canonical_body(const http_request& req) {
  const auto type = lower(sv(req[http::field::content_type]));
  if (type.rfind("application/json", 0) == 0) {
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
                                          const std::vector<std::string>& headers) {
  std::string out;
  out.append(sv(req.method_string())).push_back(' ');
  out.append(sv(req.target())).push_back('\n');
  for (const auto& name : headers) {
    out.append(lower(name)).push_back(':');
    out.append(sv(req[name])).push_back('\n');
  }
  out.push_back('\n');
  out.append(canonical_body(req));
  return out;
}

std::variant<request_id, http_response> middleware::identify(const http_request& req) const {
  std::optional<std::string> key;
  const auto field = req.find(options_.key_header);
  if (field != req.end()) {
    key = unquote(sv(field->value()));
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
    thread_local std::mt19937_64 rng{std::random_device{}()};
    key = "orpheus-unkeyed-" + std::to_string(rng()) + "-" + std::to_string(rng());
  }
  const std::optional<std::string> scope = options_.scope(req);
  if (!scope) {
    return error_response(
        error_info{401, "unauthenticated", "no caller identity", false, false, std::nullopt}, {});
  }
  request_id id{*scope, *key, fingerprint_of(canonical_request(req, options_.fingerprint_headers))};
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

http_response middleware::answer(const request_id& id, bool echo_key,
                                 const std::function<response()>& run) const {
  const std::string shown_key = echo_key ? id.key : std::string();
  try {
    const response r = run();
    http_response res{static_cast<http::status>(r.status), 11};
    for (const auto& [name, value] : r.headers) res.insert(name, value);
    res.body() = r.body;
    if (r.replayed) res.set("Idempotent-Replayed", "true");
    if (echo_key) {
      res.set(options_.key_header, id.key);
      res.set("Idempotency-Key-Retention", retention_seconds());
    }
    res.prepare_payload();
    return res;
  } catch (const error& e) {
    return error_response(e.info(), shown_key);
  } catch (...) {
    return error_response(classify(std::current_exception(), manager_.settings().unclassified),
                          shown_key);
  }
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
    try {
      respond(work(req));
    } catch (const error& e) {
      respond(error_response(e.info(), {}));
    } catch (...) {
      respond(
          error_response(classify(std::current_exception(), manager_.settings().unclassified), {}));
    }
  };
  submit(std::move(job), respond);
}

}  // namespace orpheus::beast
