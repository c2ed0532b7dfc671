// Idempotent unary gRPC methods, on gRPC C++'s callback API.
//
//   orpheus::grpc::idempotent_unary idem(manager, pool, {.scope =
//   orpheus::grpc::bearer_scope(keys)});
//
//   class payments final : public Payments::CallbackService {
//     grpc::ServerUnaryReactor* CreatePayment(grpc::CallbackServerContext* ctx,
//                                             const PaymentRequest* req, Payment* reply) override {
//       return idem.handle("/payments.v1.Payments/CreatePayment", ctx, req, reply,
//           [](orpheus::tx& tx, const PaymentRequest& r) { return record_payment(tx, r); },
//           [](const orpheus::attempt& a, const payment& p) { return charge(a, p); },
//           [](orpheus::tx& tx, const orpheus::attempt&, const charge& c) {
//             return payment_reply(tx, c); });  // a Payment; failures are recorded for you
//     }
//   };
//
// The same phases as the HTTP middleware (orpheus/manager.hpp, docs/grpc.md):
//  1. the key from the call's metadata `idempotency-key` (required; the key
//     rule of orpheus/request.hpp): missing or invalid is INVALID_ARGUMENT;
//  2. the caller from `scope` (a bearer token in `authorization` metadata,
//     the authenticated peer, ...): none is UNAUTHENTICATED; one caller never
//     sees, replays or blocks another's keys;
//  3. the fingerprint: the method's full name (handle()'s first argument: a
//     key sent to another method is another request) and the request's
//     deterministic serialisation; the same key with another request is
//     FAILED_PRECONDITION;
//  4. the phases run on the bounded work_pool, never on gRPC's threads; a
//     full queue is UNAVAILABLE (retryable);
//  5. the answer: the reply as recorded, byte for byte (initial metadata
//     `idempotent-replayed: true` on a replay), or a status (status_of()):
//       in progress, lease lost      UNAVAILABLE, with google.rpc.RetryInfo
//                                    (retry with the same key)
//       key re-used with another request  FAILED_PRECONDITION
//       unavailable, in doubt        UNAVAILABLE (retry with the same key)
//       invalid key or request       INVALID_ARGUMENT
//       no caller                    UNAUTHENTICATED
//       refused for good (recorded)  FAILED_PRECONDITION, or the code the
//                                    recorded failure's HTTP status maps to
//       internal                     INTERNAL
//     every failure carries google.rpc.ErrorInfo (reason: the Orpheus code,
//     domain "orpheus", metadata retryable and in_doubt) in
//     `grpc-status-details-bin`.
//
// Thread safety: handle() may be called from any gRPC thread at once.
// Lifetime: the pool's jobs use this object, the manager and the store. To
// stop: drain the pool first (work_pool::drain(): a call still queued is
// answered UNAVAILABLE and never runs), then shut the gRPC server down, and
// only then destroy them (docs/grpc.md; shutting down first ran every queued
// call, each a new downstream call).
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "orpheus/api_keys.hpp"
#include "orpheus/manager.hpp"
#include "orpheus/problem.hpp"
#include "orpheus/work_pool.hpp"

namespace google::protobuf {
class MessageLite;
}

namespace orpheus::grpc {

/// The caller's identity (the scope of its keys) from a call; nullopt when
/// the call does not authenticate one.
using scope_function =
    std::function<std::optional<std::string>(const ::grpc::CallbackServerContext&)>;

/// A scope for callers with API keys: `prefix` + the client whose key the
/// call's `authorization` metadata carries as `Bearer <key>`, or nullopt.
[[nodiscard]] scope_function bearer_scope(api_keys keys, std::string prefix = "client:");

struct unary_options {
  /// The caller's identity; required.
  scope_function scope;
  /// The metadata key of the idempotency key (gRPC metadata keys are lower
  /// case).
  std::string key_metadata = "idempotency-key";
};

/// The gRPC status for `e`, with google.rpc.ErrorInfo (and RetryInfo when
/// retry_after is set) in its details. The one place that maps an Orpheus
/// error to gRPC.
[[nodiscard]] ::grpc::Status status_of(const error_info& e);

/// The gRPC status for a failure the library recorded in its HTTP form
/// (problem+json: status, code, detail, retryable), as replayed. For a
/// recorded success (2xx) whose body is not this method's reply (an
/// operator's resolve, another front end's record), and for a recorded 3xx
/// (succeeded, with no reply): UNAVAILABLE
/// reply_unreadable, retryable with the same key, never a final failure.
[[nodiscard]] ::grpc::Status status_of_recorded(const response& recorded);

/// `message` serialised deterministically (map fields in key order): what
/// is fingerprinted and what is recorded. Fields this server's .proto does
/// not know are kept, raw, in the order they came, after the known ones:
/// so a server that knows a newly added scalar or string field, or message
/// field without maps (numbered last), and one that does not yet
/// fingerprint a request alike during a rolling deploy. Not alike: an
/// unknown map's entries sent in another order, a repeated scalar sent
/// unpacked where the .proto packs it, a new value of a closed (proto2)
/// enum, a field dropped from the server's .proto that clients still send
/// (docs/grpc.md).
[[nodiscard]] std::string bytes_of(const google::protobuf::MessageLite& message);

/// bytes_of(reply), checked to read back as its own type: a reply that
/// serialises but does not parse (a proto3 string that is not UTF-8) throws
/// std::logic_error, a handler's mistake, so that it is never recorded as a
/// success no server can then answer (found in review).
[[nodiscard]] std::string recorded_reply_bytes(const google::protobuf::MessageLite& reply);

/// The content type of a recorded reply: handle() records a method's reply
/// as status 200, this type and its bytes. A recorded success is answered as
/// the reply only with status 200 and this content type, or none and a
/// body (records an operator resolved with `--status 200` and the bytes);
/// anything else that succeeded is UNAVAILABLE reply_unreadable, retryable
/// with the same key.
inline constexpr const char* reply_content_type = "application/x-protobuf";

/// For clients: whether a failed call may be sent again with the same key.
/// An Orpheus server says so in the status's google.rpc.ErrorInfo (domain
/// "orpheus", metadata retryable). A status without it comes from the
/// transport or a proxy, and the request may have run: UNAVAILABLE, ABORTED,
/// DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, INTERNAL (a stream reset), UNKNOWN
/// (a proxy's 500), CANCELLED and DATA_LOSS may be retried with the same key;
/// the others (UNIMPLEMENTED, UNAUTHENTICATED, INVALID_ARGUMENT, ...) are
/// final.
[[nodiscard]] bool may_retry(const ::grpc::Status& s);

/// For clients: the delay the status's google.rpc.RetryInfo asks for.
[[nodiscard]] std::optional<std::chrono::milliseconds> retry_delay_of(const ::grpc::Status& s);

class idempotent_unary {
 public:
  /// Throws config_error when options.scope is empty or key_metadata is not
  /// a lower-case metadata key.
  idempotent_unary(manager& m, work_pool& pool, unary_options options);

  /// Answers the call through the returned reactor, exactly once. `method`
  /// is the method's full name ("/package.Service/Method"), part of the
  /// fingerprint. `pre(tx&, const Request&) -> PreState` (or with a third
  /// argument, the call's `const request_id&`), `rpc(const attempt&, const
  /// PreState&) -> T` (or `-> outcome<T>`, or throwing), and Post-RPC:
  /// `post(tx&, const attempt&, const T&) -> Reply` or `post(tx&, const
  /// attempt&, const PreState&, const T&) -> Reply` (called on success only;
  /// a non-retryable failure is recorded by the library, a retryable one
  /// leaves the key retryable), or `post(tx&, const attempt&, [const
  /// PreState&,] const outcome<T>&) -> Reply`, called for every outcome so
  /// that it can write the application's rows on a failure too (its reply
  /// is then ignored: the failure is recorded, or left retryable, as
  /// above). As in the core (manager.hpp), the outcome forms are tried
  /// first: a generic lambda (`const auto&` last) is the every-outcome form,
  /// so give the success form's value its type. The method's name is yours to give: a name copied
  /// from another method would let one key replay that method's reply.
  template <class Request, class Reply, class Pre, class Rpc, class Post>
  ::grpc::ServerUnaryReactor* handle(std::string_view method, ::grpc::CallbackServerContext* ctx,
                                     const Request* request, Reply* reply, Pre pre, Rpc rpc,
                                     Post post);

 private:
  /// One call's run of the manager, type-erased.
  using runner = std::function<outcome<response>(const request_id&, const process_options&)>;
  /// Identifies the call, and runs `run` on the pool, parses the answer into
  /// `reply` and finishes the reactor; never blocks the calling thread.
  ::grpc::ServerUnaryReactor* start(std::string_view method, ::grpc::CallbackServerContext* ctx,
                                    const google::protobuf::MessageLite& request,
                                    google::protobuf::MessageLite* reply, runner run);

  /// Finishes the call with what the manager answered.
  static void answer(::grpc::CallbackServerContext* ctx, ::grpc::ServerUnaryReactor* reactor,
                     google::protobuf::MessageLite* reply, const request_id& id,
                     const outcome<response>& out);

  manager& manager_;
  work_pool& pool_;
  unary_options options_;
};

template <class Request, class Reply, class Pre, class Rpc, class Post>
::grpc::ServerUnaryReactor* idempotent_unary::handle(std::string_view method,
                                                     ::grpc::CallbackServerContext* ctx,
                                                     const Request* request, Reply* reply, Pre pre,
                                                     Rpc rpc, Post post) {
  using pre_state = std::decay_t<decltype(orpheus::detail::call_pre(
      pre, std::declval<tx&>(), *request, std::declval<const request_id&>()))>;
  // What Post-RPC sees of the RPC, as the core derives it: T for an RPC
  // that returns T or outcome<T> (found in review: an RPC that returned
  // outcome<T> made value_t outcome<T>, an every-outcome Post-RPC was taken
  // for the success-only form, and a decline was recorded as a 200 OK).
  using value_t = typename orpheus::detail::outcome_of_rpc<Rpc, pre_state>::value_type;
  // Post-RPC in one of four forms: on success or on every outcome (to write
  // the application's rows on a failure too; its reply is then ignored and
  // the failure recorded), each with or without the Pre-RPC result.
  constexpr bool post_on_outcome =
      std::is_invocable_v<Post&, tx&, const attempt&, const pre_state&, const outcome<value_t>&>;
  // The same without the Pre-RPC result. Tried before the success forms, in
  // the core's order (manager.hpp): a Post-RPC of outcome<T> can be called
  // with a T too, and was, on success only, so a failure never reached it.
  constexpr bool post_on_outcome_stateless =
      !post_on_outcome && std::is_invocable_v<Post&, tx&, const attempt&, const outcome<value_t>&>;
  constexpr bool post_takes_state =
      std::is_invocable_v<Post&, tx&, const attempt&, const pre_state&, const value_t&>;
  if constexpr (post_on_outcome) {
    static_assert(
        std::is_same_v<std::decay_t<std::invoke_result_t<
                           Post&, tx&, const attempt&, const pre_state&, const outcome<value_t>&>>,
                       Reply>,
        "Post-RPC must return the method's reply type");
  } else if constexpr (post_on_outcome_stateless) {
    static_assert(
        std::is_same_v<
            std::decay_t<std::invoke_result_t<Post&, tx&, const attempt&, const outcome<value_t>&>>,
            Reply>,
        "Post-RPC must return the method's reply type");
  } else if constexpr (post_takes_state) {
    static_assert(
        std::is_same_v<std::decay_t<std::invoke_result_t<Post&, tx&, const attempt&,
                                                         const pre_state&, const value_t&>>,
                       Reply>,
        "Post-RPC must return the method's reply type");
  } else {
    static_assert(
        std::is_same_v<
            std::decay_t<std::invoke_result_t<Post&, tx&, const attempt&, const value_t&>>, Reply>,
        "Post-RPC must return the method's reply type");
  }
  // The request outlives the call's reactor, which outlives the job.
  return start(
      method, ctx, *request, reply,
      [this, request, pre = std::move(pre), rpc = std::move(rpc), post = std::move(post)](
          const request_id& id, const process_options& o) {
        const auto pre_phase = [&](tx& t) {
          return orpheus::detail::call_pre(pre, t, *request, id);
        };
        const auto recorded = [](const Reply& r) {
          return response{200, {{"content-type", reply_content_type}}, recorded_reply_bytes(r)};
        };
        if constexpr (post_on_outcome || post_on_outcome_stateless) {
          return manager_.try_process(
              id, pre_phase, rpc,
              [&](tx& t, const attempt& a, const pre_state& s, const outcome<value_t>& out) {
                const Reply r = [&] {
                  if constexpr (post_on_outcome) {
                    return post(t, a, s, out);
                  } else {
                    return post(t, a, out);
                  }
                }();
                if (!out.ok()) return problem_response(out.error());
                return recorded(r);
              },
              o);
        } else {
          return manager_.try_process(
              id, pre_phase, rpc,
              [&](tx& t, const attempt& a, const pre_state& s, const value_t& v) {
                if constexpr (post_takes_state) {
                  return recorded(post(t, a, s, v));
                } else {
                  return recorded(post(t, a, v));
                }
              },
              o);
        }
      });
}

}  // namespace orpheus::grpc
