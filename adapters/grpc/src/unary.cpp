#include "orpheus/grpc/unary.hpp"
#include "orpheus/detail/ascii.hpp"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <grpc/support/time.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "orpheus/grpc/google_rpc.pb.h"  // generated: the adapter's own copy
#include "orpheus/identify.hpp"
#include "orpheus/log.hpp"

namespace orpheus::grpc {
namespace {

using ::grpc::StatusCode;

// Whether `r`, recorded as a success, can be this method's reply: status
// 200, and handle()'s own content type (the media type compared without case
// or parameters, RFC 9110 8.3.1; the header's name without case: orpheusctl
// resolve writes "Content-Type"), or none and a body (an operator's resolve
// before orpheusctl could give a type, as docs/grpc.md then said; without a
// body it would answer OK with an empty reply, found in review).
bool is_recorded_reply(const response& r) {
  if (r.status != 200) return false;
  const auto same = [](std::string_view a, std::string_view b) {
    return orpheus::detail::ascii_iequals(a, b);
  };
  bool typed = false;
  const bool all_protobuf = std::all_of(r.headers.begin(), r.headers.end(), [&](const auto& h) {
    if (!same(h.first, "content-type")) return true;
    typed = true;
    std::string_view type(h.second);
    type = type.substr(0, type.find(';'));
    while (!type.empty() && (type.back() == ' ' || type.back() == '\t')) type.remove_suffix(1);
    while (!type.empty() && (type.front() == ' ' || type.front() == '\t')) type.remove_prefix(1);
    return same(type, reply_content_type);
  });
  return all_protobuf && (typed || !r.body.empty());
}

// Every value of `name`, joined with ", " as HTTP/2 may carry them (for
// authorization: two tokens never read as one). The key is read by start(),
// which refuses two entries whatever they hold.
std::optional<std::string> metadata(const ::grpc::CallbackServerContext& ctx,
                                    std::string_view name) {
  std::optional<std::string> value;
  const auto [first, last] =
      ctx.client_metadata().equal_range(::grpc::string_ref(name.data(), name.size()));
  for (auto it = first; it != last; ++it) {
    if (value) {
      value->append(", ");
    } else {
      value.emplace();
    }
    value->append(it->second.data(), it->second.size());
  }
  return value;
}

// The code for an error the library (or a handler) raised now.
StatusCode code_of(const error_info& e) {
  if (e.code == codes::unauthenticated) return StatusCode::UNAUTHENTICATED;
  if (e.code == codes::fingerprint_mismatch) return StatusCode::FAILED_PRECONDITION;
  switch (e.kind) {
    case error_class::invalid_input:
      return StatusCode::INVALID_ARGUMENT;
    // A held key (in_progress, lease_lost) is to be sent again as it is,
    // with the same key: UNAVAILABLE, gRPC's code for "retry this call".
    // Found in review: it was ABORTED, which gRPC's status-code guide gives
    // for "retry at a higher level" (restart the whole sequence), and retry
    // policies and proxies do not retry; a client that started over under a
    // new key while the first attempt still held the key was charged twice.
    // ErrorInfo's reason still says which.
    case error_class::conflict:
    case error_class::unavailable:
    case error_class::in_doubt:
      return StatusCode::UNAVAILABLE;
    case error_class::rejected:
      return StatusCode::FAILED_PRECONDITION;
    case error_class::internal:
      break;
  }
  return StatusCode::INTERNAL;
}

// The code for a failure recorded in its HTTP form, by its HTTP status.
// A record is final: nothing runs under its key any more, and the same key
// replays it. So a recorded 409 that says retryable is ABORTED, gRPC's
// "start over" (a new attempt needs a new key), unlike a key held now
// (code_of: UNAVAILABLE, "send this call again").
// ABORTED and RESOURCE_EXHAUSTED only when the record says to retry (found in
// review: a payment an operator cancelled, recorded 409 request_cancelled,
// was replayed as ABORTED, which gRPC's guidance and may_retry()'s fallback
// read as "retry", at a higher level too: under a new key).
StatusCode code_of_recorded(int status, bool retryable) {
  if ((status == 409 || status == 429) && !retryable) return StatusCode::FAILED_PRECONDITION;
  switch (status) {
    case 400:
      return StatusCode::INVALID_ARGUMENT;
    case 401:
      return StatusCode::UNAUTHENTICATED;
    case 403:
      return StatusCode::PERMISSION_DENIED;
    case 404:
      return StatusCode::NOT_FOUND;
    case 409:
      return StatusCode::ABORTED;
    case 429:
      return StatusCode::RESOURCE_EXHAUSTED;
    default:
      break;
  }
  if (status >= 500) return retryable ? StatusCode::UNAVAILABLE : StatusCode::INTERNAL;
  return StatusCode::FAILED_PRECONDITION;
}

// googleapis' type URLs: the adapter's copies of the messages are in a
// package of their own (so that a service may link googleapis' beside them),
// and are packed and read under googleapis' names, as clients expect them.
constexpr std::string_view error_info_type = "type.googleapis.com/google.rpc.ErrorInfo";
constexpr std::string_view retry_info_type = "type.googleapis.com/google.rpc.RetryInfo";

void pack(google_rpc::Status& status, std::string_view type_url,
          const google::protobuf::MessageLite& message) {
  auto* any = status.add_details();
  any->set_type_url(std::string(type_url));
  any->set_value(message.SerializeAsString());
}

/// Whether `any` holds the message `type_url` names. An Any's type is the
/// name after its URL's last '/', whatever the host before it.
bool holds(const google::protobuf::Any& any, std::string_view type_url) {
  const std::string_view name = type_url.substr(type_url.rfind('/') + 1);
  const std::string_view url = any.type_url();
  const auto slash = url.rfind('/');
  return slash != std::string_view::npos && url.substr(slash + 1) == name;
}

::grpc::Status with_details(StatusCode code, const std::string& message, std::string_view reason,
                            bool retryable, bool in_doubt,
                            std::optional<std::chrono::milliseconds> retry_after) {
  google_rpc::Status details;
  details.set_code(static_cast<int>(code));
  details.set_message(message);
  google_rpc::ErrorInfo info;
  info.set_reason(std::string(reason));
  info.set_domain("orpheus");
  (*info.mutable_metadata())["retryable"] = retryable ? "true" : "false";
  if (in_doubt) (*info.mutable_metadata())["in_doubt"] = "true";
  pack(details, error_info_type, info);
  if (retry_after) {
    google_rpc::RetryInfo retry;
    retry.mutable_retry_delay()->set_seconds(retry_after->count() / 1000);
    retry.mutable_retry_delay()->set_nanos(static_cast<int>(retry_after->count() % 1000) * 1000000);
    pack(details, retry_info_type, retry);
  }
  return {code, message, details.SerializeAsString()};
}

}  // namespace

scope_function bearer_scope(api_keys keys, std::string prefix) {
  // As the HTTP front end's (found in review: a prefix that breaks the scope
  // rule made every authenticated call INVALID_ARGUMENT invalid_scope, which
  // clients read as final); refused once, here, with the longest client.
  if (auto why = invalid_scope_reason(prefix + std::string(api_keys::max_client_bytes, 'c'))) {
    throw config_error("bearer_scope: the prefix '" + prefix +
                       "' makes scopes that break the rule: " + *why);
  }
  return [keys = std::move(keys), prefix = std::move(prefix)](
             const ::grpc::CallbackServerContext& ctx) -> std::optional<std::string> {
    const auto authorization = metadata(ctx, "authorization");
    if (!authorization) return std::nullopt;
    auto client = keys.client_of(*authorization);
    if (!client) return std::nullopt;
    return prefix + *client;
  };
}

::grpc::Status status_of(const error_info& e) {
  // From 0 to a day, as the HTTP front end's Retry-After (found in review: a
  // negative wait gave negative nanos, which no client reads).
  std::optional<std::chrono::milliseconds> retry_after;
  if (e.retryable() || e.retry_after) retry_after = announced_retry_after(e);
  return with_details(code_of(e), e.message, e.code, e.retryable(), e.in_doubt(), retry_after);
}

::grpc::Status status_of_recorded(const response& recorded) {
  // A success whose reply is not this method's (an operator's resolve with
  // 201 and a JSON body, or a 3xx, which admin records as succeeded, found
  // in review; another front end's record): the request was done,
  // so never a final failure (found in review: it was FAILED_PRECONDITION,
  // "do not retry", over a payment made, which a client may then make again
  // under a new key).
  if (recorded.status >= 200 && recorded.status < 400) {
    return status_of(error_info::of(error_class::unavailable, codes::reply_unreadable,
                                    "the request was done, but its recorded reply does not read "
                                    "as this method's reply; retry with the same key"));
  }
  const auto body = nlohmann::json::parse(recorded.body, nullptr, false);
  // The library records failures as problem+json; another front end's
  // handler may have recorded anything (then there is no code to give), and
  // a member of another type is read as absent (found in review:
  // {"retryable":"no"} threw, and the replay became INTERNAL).
  const bool is_problem = body.is_object();
  const auto text = [&](const char* name, const std::string& fallback) {
    const auto it = is_problem ? body.find(name) : body.end();
    return is_problem && it != body.end() && it->is_string() ? it->get<std::string>() : fallback;
  };
  const auto flag = [&](const char* name) {
    const auto it = is_problem ? body.find(name) : body.end();
    return is_problem && it != body.end() && it->is_boolean() && it->get<bool>();
  };
  const std::string code = text("code", "");
  const std::string detail =
      is_problem ? text("detail", code) : "the request failed; its answer was recorded";
  const bool retryable = flag("retryable");
  return with_details(code_of_recorded(recorded.status, retryable), detail, code, retryable,
                      flag("in_doubt"), std::nullopt);
}

bool may_retry(const ::grpc::Status& s) {
  google_rpc::Status details;
  if (!s.error_details().empty() && details.ParseFromString(s.error_details())) {
    for (const auto& any : details.details()) {
      google_rpc::ErrorInfo info;
      if (holds(any, error_info_type) && info.ParseFromString(any.value()) &&
          info.domain() == "orpheus") {
        return info.metadata().count("retryable") != 0 && info.metadata().at("retryable") == "true";
      }
    }
  }
  // Not from an Orpheus server's adapter, which always says: the transport's
  // or a proxy's. Found in review: a stream reset (INTERNAL), a proxy's 500
  // (UNKNOWN) or a call cancelled on the way (CANCELLED) was final, though
  // the request may have run: a client told so may pay again under a new
  // key. Only what cannot have reached a handler, or is the caller's own
  // mistake, is final.
  switch (s.error_code()) {
    case StatusCode::UNAVAILABLE:
    case StatusCode::ABORTED:
    case StatusCode::DEADLINE_EXCEEDED:
    case StatusCode::RESOURCE_EXHAUSTED:
    case StatusCode::INTERNAL:
    case StatusCode::UNKNOWN:
    case StatusCode::CANCELLED:
    case StatusCode::DATA_LOSS:
      return true;
    default:
      return false;
  }
}

std::optional<std::chrono::milliseconds> retry_delay_of(const ::grpc::Status& s) {
  google_rpc::Status details;
  if (s.error_details().empty() || !details.ParseFromString(s.error_details())) {
    return std::nullopt;
  }
  for (const auto& any : details.details()) {
    google_rpc::RetryInfo retry;
    if (holds(any, retry_info_type) && retry.ParseFromString(any.value())) {
      // 0 to 24 h (found in review: a huge delay overflowed, a negative one
      // went through; the server gives one when an in-doubt hold just ended).
      constexpr std::int64_t day_s = std::int64_t{24} * 3600;
      const std::int64_t secs = std::clamp<std::int64_t>(retry.retry_delay().seconds(), 0, day_s);
      const std::int64_t ms =
          secs * 1000 + std::clamp(retry.retry_delay().nanos(), 0, 999'999'999) / 1'000'000;
      return std::chrono::milliseconds(std::min(ms, day_s * 1000));
    }
  }
  return std::nullopt;
}

std::string bytes_of(const google::protobuf::MessageLite& message) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    if (!message.SerializeToCodedStream(&coded)) {
      // A proto2 message with a required field unset: never recorded as empty.
      throw std::invalid_argument("orpheus::grpc: the message does not serialise (" +
                                  message.GetTypeName() + ", a required field unset?)");
    }
  }
  return out;
}

std::string recorded_reply_bytes(const google::protobuf::MessageLite& reply) {
  std::string bytes = bytes_of(reply);
  const std::unique_ptr<google::protobuf::MessageLite> back(reply.New());
  if (!back->ParseFromString(bytes)) {
    throw std::logic_error("orpheus::grpc: the reply (" + reply.GetTypeName() +
                           ") does not read back as its own type (a string field that is not "
                           "UTF-8?); not recorded");
  }
  return bytes;
}

idempotent_unary::idempotent_unary(manager& m, work_pool& pool, unary_options options)
    : manager_(m), pool_(pool), options_(std::move(options)) {
  if (!options_.scope) throw config_error("orpheus::grpc: a scope function is required");
  const bool lower_case_key =
      !options_.key_metadata.empty() &&
      std::all_of(options_.key_metadata.begin(), options_.key_metadata.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
      });
  if (!lower_case_key || options_.key_metadata.ends_with("-bin")) {
    throw config_error("orpheus::grpc: key_metadata must be a lower-case ASCII metadata key");
  }
}

::grpc::ServerUnaryReactor* idempotent_unary::start(std::string_view method,
                                                    ::grpc::CallbackServerContext* ctx,
                                                    const google::protobuf::MessageLite& request,
                                                    google::protobuf::MessageLite* reply,
                                                    runner run) {
  ::grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  // Who calls, under which key: on gRPC's thread, before any job. What
  // throws here (the scope function, a request that does not serialise)
  // finishes the call (found in review: it left the reactor unfinished and
  // went into gRPC's handler).
  std::optional<request_id> identified;
  try {
    const std::string body = bytes_of(request);
    const request_text text{"POST", method, "application/x-protobuf", body, {}};
    // Two entries are two keys, whatever they hold (found in review: '"ab'
    // and 'cd"', joined, read as the one quoted key 'ab, cd').
    const auto [first_key, after_keys] = ctx->client_metadata().equal_range(
        ::grpc::string_ref(options_.key_metadata.data(), options_.key_metadata.size()));
    if (std::distance(first_key, after_keys) > 1) {
      reactor->Finish(status_of(error_info::of(
          error_class::invalid_input, codes::invalid_key,
          "the " + options_.key_metadata + " metadata was sent more than once: send one key")));
      return reactor;
    }
    std::optional<std::string> key;
    if (first_key != after_keys) key.emplace(first_key->second.data(), first_key->second.size());
    // Read as an HTTP header's value, which drops the white space around it,
    // "k1 " was the key "k1" (found in review: two orders sent under "k1 "
    // and "k1" were one payment). gRPC keeps a metadata value as sent, and
    // HTTP/2 allows none around a field value (RFC 9113, 8.2.1): refused.
    if (key && !key->empty() &&
        (key->front() == ' ' || key->front() == '\t' || key->back() == ' ' ||
         key->back() == '\t')) {
      reactor->Finish(status_of(
          error_info::of(error_class::invalid_input, codes::invalid_key,
                         "the " + options_.key_metadata +
                             " metadata has white space around the key: send the key alone")));
      return reactor;
    }
    auto who = identify(
        text, key, [&] { return options_.scope(*ctx); },
        identify_options{options_.key_metadata, true, 64});
    if (auto* refused = std::get_if<error_info>(&who)) {
      reactor->Finish(status_of(*refused));
      return reactor;
    }
    identified = std::get<identity>(std::move(who)).id;
  } catch (...) {
    // Nothing has run yet: retryable, as over HTTP (middleware::admit()).
    const error_info e = classify(std::current_exception(), unclassified_policy::retryable);
    log(log_level::error, "orpheus::grpc: " + std::string(method) + ": " + e.code + ": " +
                              (e.internal.empty() ? e.message : e.internal));
    reactor->Finish(status_of(e));
    return reactor;
  }
  const request_id id = std::move(*identified);
  const bool queued =
      pool_.try_submit([&pool = pool_, ctx, reactor, reply, id, run = std::move(run)] {
        try {
          // Queued when the pool began to drain (a graceful stop): nothing of it
          // has run, and a stop does not wait for new downstream calls (as over
          // HTTP: beast::middleware).
          if (pool.draining()) return reactor->Finish(status_of(work_pool::draining_refusal()));
          // Found in review: a call whose deadline passed, or whose client
          // cancelled it, while it waited for a worker still ran when one
          // took it: a charge its client had already been told may not
          // have happened, made with nobody waiting for the answer. Nothing
          // of it has run; the client already has its own status. The
          // deadline is compared as gRPC keeps it, in its own clock (from
          // review: deadline() converts it to a system_clock time, which
          // cannot hold one past the year 2262, and would read as passed).
          const gpr_timespec deadline = ctx->raw_deadline();
          if (ctx->IsCancelled() || gpr_time_cmp(gpr_now(deadline.clock_type), deadline) >= 0) {
            return reactor->Finish(status_of(error_info::of(
                error_class::unavailable, codes::deadline_exceeded,
                "the call's deadline passed, or it was cancelled, while it waited for a "
                "worker; nothing of it was started; retry with the same key")));
          }
          answer(ctx, reactor, reply, id, run(id, process_options{}));
        } catch (...) {  // the pool swallows what a job throws: finish the call anyway
          // The request may have run (an allocation failed after it): a
          // retry with the same key replays or takes over, never a final
          // answer (found in review: non-retryable, so a client could pay
          // again under a new key; the HTTP middleware already retried).
          const error_info e = classify(std::current_exception(), unclassified_policy::retryable);
          reactor->Finish(status_of(e));
        }
      });
  if (!queued) {
    reactor->Finish(status_of(pool_.draining()
                                  ? work_pool::draining_refusal()
                                  : error_info::of(error_class::unavailable, codes::overloaded,
                                                   "the server is busy; retry with "
                                                   "the same key")));
  }
  return reactor;
}

void idempotent_unary::answer(::grpc::CallbackServerContext* ctx,
                              ::grpc::ServerUnaryReactor* reactor,
                              google::protobuf::MessageLite* reply, const request_id& id,
                              const outcome<response>& out) {
  if (!out.ok()) {
    const error_info& e = out.error();
    if (!e.internal.empty()) {
      log(log_level::error,
          "orpheus::grpc: " + e.code + " scope=" + id.scope + " key=" + id.key + ": " + e.internal);
    }
    return reactor->Finish(status_of(e));
  }
  const response& r = out.value();
  if (r.replayed) ctx->AddInitialMetadata("idempotent-replayed", "true");
  if (r.status < 200 || r.status >= 300) return reactor->Finish(status_of_recorded(r));
  // Only what is_recorded_reply() takes is a reply (found in review: an
  // operator's resolve with 201 and no body parsed as an empty reply, and
  // the client got OK with no payment in it).
  if (!is_recorded_reply(r) || !reply->ParseFromString(r.body)) {
    // Found in review: answered as a final failure, a payment that was
    // made could be re-issued by its client under a new key.
    return reactor->Finish(status_of(
        error_info::of(error_class::unavailable, codes::reply_unreadable,
                       "the request was done, but its recorded reply does not read as this "
                       "method's reply; retry with the same key")));
  }
  reactor->Finish(::grpc::Status::OK);
}

}  // namespace orpheus::grpc
