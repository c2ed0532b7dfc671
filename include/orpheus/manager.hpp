// orpheus::manager — makes a handler idempotent.
//
// A request is split in three phases (docs/contract.md):
//   Pre-RPC   database only, in transaction 1 with the library's lease row;
//             its result is serialised (nlohmann::json) and stored, and it
//             runs at most once per key: a retry gets the stored result.
//   RPC       network only, no transaction, with a deadline before the lease
//             ends and an Attempt (is_retry, number, downstream_key).
//   Post-RPC  database only, in transaction 2 with the recorded response;
//             it commits only if this attempt still holds the lease. Two
//             kinds, each with or without the Pre-RPC result:
//               post(tx, attempt, const T& value)                success only
//               post(tx, attempt, const PreState&, const T& value)
//             is called only when the RPC succeeded. For a non-retryable
//             failure the library records problem_response(error) itself;
//             for a retryable one it records nothing final and Post-RPC is
//             not called. This is the form to use unless you write on failure.
//               post(tx, attempt, const outcome<T>&)             every outcome
//               post(tx, attempt, const PreState&, const outcome<T>&)
//             is called for every outcome and must handle failures itself
//             (`if (!o.ok()) return problem_response(o.error());`). On a
//             retryable outcome its SQL commits with the released lease, but
//             the response it returns is discarded: the caller gets the
//             retryable error, and the retry runs Post-RPC again.
//             When a Post-RPC fits both kinds (a generic lambda), it is
//             called as the outcome kind.
//
// Each phase's signature is a concept (pre_rpc_phase, rpc_phase,
// post_rpc_phase); a handler that does not fit names the phase in the
// compiler's message.
//
// A complete call, compiled and run by the tests: examples/1_quickstart/main.cpp
// (the code README.md quotes). Behind HTTP, with a real bank call as the RPC:
// examples/payments_server/create_payment.cpp.
//
// What process() returns: the response to send — produced now, or replayed
// from the record (response::replayed), including recorded failures.
// try_process() is the same call without exceptions, for adapters: it
// returns the error_info that process() would throw (an outcome<response>).
// What process() throws: orpheus::error, whose retryable() says whether the
// client may retry with the same key (see error.hpp):
//   bad_input_error (400)   invalid key/scope/fingerprint; nothing touched
//   422 fingerprint_mismatch  key re-used with another payload; nothing changed
//   409 in_progress         another attempt holds the lease; retryable, with
//                           retry_after = time left on the lease
//   409 lease_lost          this attempt's lease was taken over; retryable
//   503 storage_unavailable / commit_in_doubt   database trouble; retryable
//   503 post_rpc_failed     the RPC ran but recording failed; retryable
//   503 pre_state_unreadable  a retry's stored Pre-RPC result no longer reads
//                           as the handler's type (a rolling deploy); nothing
//                           was asked downstream; retryable, reason recorded
//                           in the record's last_error and logged
//   503 deadline_exceeded   transaction 1 used up the RPC's time; the RPC was
//                           not started; retryable
//   an error from Pre-RPC   as classified; nothing was recorded
//   a retryable RPC outcome the key is left retryable; retryable. When the
//                           outcome also says in_doubt (the call may still be
//                           running downstream: a timeout after sending), the
//                           lease is kept until the attempt's deadline, so no
//                           retry overlaps the first call.
//
// Pre-RPC and Post-RPC get a `tx` on the library's transaction; statements that
// would end or escape it (BEGIN, COMMIT, ROLLBACK, SET autocommit, LOCK TABLES,
// DDL, MySQL's /*! */ comments, ...) are refused with a non-retryable
// storage_error. Details of failures (SQL, hosts, exception text) are logged
// (orpheus/log.hpp) and kept in the record's last_error, never put in the
// message clients see.
//
// Thread safety: process() may be called from any number of threads at once.
// The store must outlive the manager. Pre-RPC (of a new key), Post-RPC and a
// step's SQL run inside the store's transaction, which a backend may run on
// a thread of its own (store_backend::transact): the SQLite store runs them
// on its writer thread while the caller's thread waits. So they must not
// rely on the caller's thread (thread-locals, a lock the caller holds) and
// must not begin another transaction on the same store (a non-retryable
// storage_error). Nor may they block (a network call, a wait on something
// outside the database): on SQLite every write of the process, and the
// file's write lock for other processes, waits for them (found in review).
// They may run again after a failure that undid them, as a retry would
// (store_backend::transact). The RPC always runs on the caller's thread.
// Threads that call process() must not be cancelled (pthread_cancel) while
// they wait in it.
#pragma once

#include <chrono>
#include <concepts>
#include <cstddef>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeindex>
#include <typeinfo>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "orpheus/error.hpp"
#include "orpheus/observer.hpp"
#include "orpheus/problem.hpp"
#include "orpheus/request.hpp"
#include "orpheus/steps.hpp"
#include "orpheus/store.hpp"
#include "orpheus/tx.hpp"

namespace orpheus {

/// What config::on_parked is told about a request that was parked.
struct parked_event {
  std::string scope;
  std::string key;
  int attempts = 0;
  /// codes::attempts_exhausted or codes::retry_window_exhausted.
  std::string reason;
  /// The last attempt's error, as recorded.
  std::string last_error;
  /// The parking's COMMIT was in doubt: it may not have landed. If it did
  /// not, a later request for the key parks it again and alerts again.
  bool in_doubt = false;
};

struct config {
  /// How long an attempt holds a key. A crashed attempt blocks its key this
  /// long, then the next retry takes over.
  std::chrono::milliseconds lease = std::chrono::seconds{30};
  /// Deadline of the RPC phase; must be shorter than the lease so that
  /// Post-RPC still runs under a live lease.
  std::chrono::milliseconds rpc_timeout = std::chrono::seconds{20};
  /// After this long since the first attempt, a key that has not finished is
  /// parked (record_state::parked) instead of being retried.
  std::chrono::milliseconds retry_window = std::chrono::hours{24};
  /// Attempts (first one included) before the key is parked. A requeue
  /// (orpheus/admin.hpp) gives it this many again.
  int max_attempts = 10;
  /// Called once each time this manager parks a request, after the parking
  /// committed (see parked_event::in_doubt), on the thread of the request
  /// that parked it: keep it short (queue an alert, page someone). What it
  /// throws is logged and dropped.
  std::function<void(const parked_event&)> on_parked{};
  /// Told how each request ended, what happened to its key and how long
  /// each phase took, per shard (orpheus/observer.hpp); none by default. The
  /// Prometheus adapter's is orpheus::prometheus::observer.
  std::shared_ptr<orpheus::observer> observer{};
  /// The Retry-After of the answer to a parked key (codes::request_parked).
  std::chrono::milliseconds parked_retry_after = std::chrono::seconds{60};
  /// How long a completer waits before it retries a request that failed in a
  /// way safe to retry: retry_backoff(attempts, base, max, random).
  std::chrono::milliseconds retry_backoff_base = std::chrono::seconds{1};
  std::chrono::milliseconds retry_backoff_max = std::chrono::minutes{5};
  /// How long after an attempt's lease a downstream call of it whose outcome
  /// is unknown (an in-doubt answer, a timeout, an attempt that never
  /// finished) may still land: until then a spent budget does not park the
  /// key, and admin::resolve and admin::cancel refuse it
  /// (record::in_doubt_until_us). Set it to how late the downstream service
  /// can still act on a request it received.
  std::chrono::milliseconds in_doubt_window = std::chrono::minutes{5};
  /// How long terminal records are kept (and replayed) before purge.
  std::chrono::milliseconds retention = std::chrono::hours{24 * 7};
  /// How exceptions that are not orpheus::error are classified.
  unclassified_policy unclassified = unclassified_policy::non_retryable;
  /// Replays answered from memory: about this many bytes (an estimate per
  /// entry: its strings and a fixed allowance) of terminal records
  /// read by this manager are kept in the process, so that a replay of one
  /// of them needs no database round trip. 0 (the default): off, every
  /// replay reads the key's master. A terminal record never changes until it
  /// is purged, so a remembered one answers as the database would. It is
  /// forgotten at its own expiry (from then any process may purge it), a row
  /// deleted by hand is seen after at most replay_cache_ttl, and a
  /// purge_expired() that deleted rows (or failed) empties this manager's
  /// memory.
  std::size_t replay_cache_bytes = 0;
  /// How long a remembered record answers before the database is read
  /// again. With the cache on: positive, and not longer than retention.
  std::chrono::milliseconds replay_cache_ttl = std::chrono::seconds{60};
};

/// The completer's wait before the next attempt of a request that has made
/// `attempts` attempts: base * 2^(attempts - 1), at most `max`, half of it
/// fixed and half scaled by `random01` (in [0, 1]; "equal jitter"), so that
/// it grows with every attempt and many keys do not come back at once.
[[nodiscard]] std::chrono::milliseconds retry_backoff(int attempts, std::chrono::milliseconds base,
                                                      std::chrono::milliseconds max,
                                                      double random01) noexcept;

/// Throws config_error for a configuration the library refuses: non-positive
/// durations, rpc_timeout not shorter than the lease, max_attempts < 1, a
/// replay cache whose ttl is longer than the retention.
void validate(const config& c);

struct process_options {
  /// When another attempt holds the lease, wait up to this long for it to
  /// finish and answer with its recorded response (0: answer 409 at once).
  /// At most 24 hours (config_error otherwise, nothing written).
  std::chrono::milliseconds wait_for{0};
  /// How long this request's terminal record is kept, when not the manager's
  /// config::retention. For requests nobody can replay (a key the server
  /// made up for a request that came without one): 0ms, purged next time.
  /// Not shorter than config::retry_window for a key a client sent: a retry
  /// that finds the record purged runs as a new request (is_retry() false),
  /// which config::retention's own check refuses for the same reason.
  /// At most 100 years (config_error otherwise, nothing written).
  std::optional<std::chrono::milliseconds> retention{};
};

/// Throws config_error for process_options out of range (the bounds above).
/// process() checks them before any database work.
void validate(const process_options& o);

/// The result of the RPC phase as Post-RPC sees it: a value, or a classified
/// error. The RPC may return T, return outcome<T>, or throw.
template <class T>
class outcome {
 public:
  using value_type = T;
  outcome(T value) : v_(std::move(value)) {}   // NOLINT(google-explicit-constructor)
  outcome(error_info e) : v_(std::move(e)) {}  // NOLINT(google-explicit-constructor)

  [[nodiscard]] bool ok() const noexcept { return v_.index() == 0; }
  [[nodiscard]] const T& value() const { return std::get<0>(v_); }
  [[nodiscard]] const error_info& error() const { return std::get<1>(v_); }
  [[nodiscard]] bool retryable() const noexcept { return !ok() && std::get<1>(v_).retryable(); }

 private:
  std::variant<T, error_info> v_;
};

namespace detail {
class replay_cache;

template <class R>
struct outcome_of {
  using type = outcome<R>;
};
template <class T>
struct outcome_of<outcome<T>> {
  using type = outcome<T>;
};

template <class Pre>
using pre_state_of = std::decay_t<std::invoke_result_t<Pre&, tx&>>;
template <class Rpc, class PreState>
using outcome_of_rpc = typename outcome_of<
    std::decay_t<std::invoke_result_t<Rpc&, const attempt&, const PreState&>>>::type;

template <class Post, class PreState, class Outcome>
concept post_on_outcome_with_state =
    std::is_invocable_r_v<response, Post&, tx&, const attempt&, const PreState&, const Outcome&>;
template <class Post, class Outcome>
concept post_on_outcome =
    std::is_invocable_r_v<response, Post&, tx&, const attempt&, const Outcome&>;
template <class Post, class PreState, class T>
concept post_on_success_with_state =
    std::is_invocable_r_v<response, Post&, tx&, const attempt&, const PreState&, const T&>;
template <class Post, class T>
concept post_on_success = std::is_invocable_r_v<response, Post&, tx&, const attempt&, const T&>;

/// The longest duration the library takes (config, process_options): every
/// one ends up in microseconds added to the database clock, and sums of
/// them stay far from int64's end.
inline constexpr std::chrono::milliseconds longest_duration =
    std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::hours{24 * 366 * 100});

/// The lease, retry window and retention of `c`, in microseconds.
lease_terms terms_of(const config& c);

/// Who runs a request and for which registered handler (empty: none).
struct run_context {
  std::string_view handler;
  int handler_version = 0;
  std::string_view runner = "client";  ///< "client" or "completer", for the history
  /// The key's shard, for config::observer: found once per call by run().
  std::size_t shard = 0;
  /// A client's retry that run() hands to the handler its record was begun
  /// through: it is handed on no further.
  bool resumed = false;
};

/// A front end's Pre-RPC in either of its two forms, `pre(tx&, const
/// Request&)` or with the request id as a third argument (the Beast
/// middleware's and the gRPC adapter's handle()).
template <class Pre, class Request>
auto call_pre(const Pre& pre, tx& t, const Request& r, const request_id& id) {
  if constexpr (std::is_invocable_v<const Pre&, tx&, const Request&, const request_id&>) {
    return pre(t, r, id);
  } else {
    return pre(t, r);
  }
}

/// One step of a multi-step request with its types erased and the
/// request's Pre-RPC result bound (manager::process_flow).
struct step_phase {
  std::string_view name;
  std::function<std::optional<error_info>(const attempt&, const step_results&, nlohmann::json&)>
      rpc;
  std::function<void(tx&, const attempt&, const nlohmann::json&)> post;  ///< may be empty
  std::function<std::optional<error_info>(const attempt&, const nlohmann::json&)>
      compensate;  ///< may be empty
};

/// A multi-step request (orpheus/steps.hpp) as the core runs it.
struct flow_phases {
  std::vector<step_phase> steps;
  std::size_t pivot = 0;
  std::function<response(tx&, const attempt&, const step_results&)> respond;
  std::function<response(tx&, const attempt&, const error_info&)> failed;
};

/// The three phases with their types erased; see manager::process().
struct phases {
  std::function<nlohmann::json(tx&)> pre;
  /// Reads the stored Pre-RPC result into the handler's type, for the RPC and
  /// Post-RPC of this attempt; throws when it does not fit that type.
  std::function<void(const nlohmann::json&)> load;
  /// Runs the RPC; returns nullopt on success, or the classified error.
  std::function<std::optional<error_info>(const attempt&)> rpc;
  std::function<response(tx&, const attempt&)> post;
  /// Set for a multi-step request: then `rpc` and `post` are not used.
  const flow_phases* flow = nullptr;
};
}  // namespace detail

/// Pre-RPC: `pre(tx&) -> PreState`, a value nlohmann::json can serialise.
template <class Pre>
concept pre_rpc_phase =
    std::invocable<Pre&, tx&> && !std::is_void_v<std::invoke_result_t<Pre&, tx&>>;

/// RPC: `rpc(const attempt&, const PreState&) -> T` or `-> outcome<T>`.
template <class Rpc, class PreState>
concept rpc_phase = std::invocable<Rpc&, const attempt&, const PreState&> &&
    !std::is_void_v<std::invoke_result_t<Rpc&, const attempt&, const PreState&>>;

/// Post-RPC: one of the four forms at the top of this file, returning a
/// response. `Outcome` is outcome<T> for the RPC's T.
template <class Post, class PreState, class Outcome>
concept post_rpc_phase = detail::post_on_outcome_with_state<Post, PreState, Outcome> ||
    detail::post_on_outcome<Post, Outcome> ||
    detail::post_on_success_with_state<Post, PreState, typename Outcome::value_type> ||
    detail::post_on_success<Post, typename Outcome::value_type>;

class manager {
 public:
  /// Throws config_error when `c` is refused (see validate()).
  explicit manager(store& s, config c = {});

  template <pre_rpc_phase Pre, rpc_phase<detail::pre_state_of<Pre>> Rpc, class Post>
  requires post_rpc_phase<Post, detail::pre_state_of<Pre>,
                          detail::outcome_of_rpc<Rpc, detail::pre_state_of<Pre>>>
      response process(const request_id& id, Pre&& pre, Rpc&& rpc, Post&& post,
                       const process_options& options = {});

  /// process() without exceptions: the response, or the error process()
  /// would have thrown (409 in_progress, 422 fingerprint_mismatch, a
  /// retryable RPC failure, ...). An exception that is not an orpheus::error
  /// is classified with config::unclassified.
  template <pre_rpc_phase Pre, rpc_phase<detail::pre_state_of<Pre>> Rpc, class Post>
  requires post_rpc_phase<Post, detail::pre_state_of<Pre>,
                          detail::outcome_of_rpc<Rpc, detail::pre_state_of<Pre>>>
      outcome<response> try_process(const request_id& id, Pre&& pre, Rpc&& rpc, Post&& post,
                                    const process_options& options = {});

  /// A multi-step request (orpheus/steps.hpp): Pre-RPC as above, then the
  /// steps of `flow`, each recorded as it finishes, resumed by a retry at the
  /// first unfinished one. Throws what process() throws, and config_error
  /// when `flow` cannot run (steps::validate()). A retry of a key recorded
  /// with other steps (another deploy) is refused as pre_state_unreadable.
  template <pre_rpc_phase Pre>
  response process(const request_id& id, Pre&& pre, const steps<detail::pre_state_of<Pre>>& flow,
                   const process_options& options = {});

  /// Purges one bounded batch of expired records and their history on every
  /// shard (store::purge_expired); returns how many rows were deleted. A
  /// shard that fails with an orpheus::error (down, not migrated yet) does
  /// not stop the others: after every shard was tried, the first such
  /// failure is rethrown (and the count is lost: a caller that wants both,
  /// or each shard's failure, uses purge_expired_on()). Any other exception
  /// is rethrown at once.
  std::size_t purge_expired(std::size_t batch_limit);
  /// The same on one shard. Throws what store::purge_expired throws. This
  /// manager's remembered replays (config::replay_cache_bytes) are forgotten
  /// when rows went or the purge failed (rows may have gone).
  std::size_t purge_expired_on(std::size_t shard, std::size_t batch_limit);

  [[nodiscard]] store& storage() noexcept { return store_; }
  [[nodiscard]] const config& settings() const noexcept { return config_; }

  /// Registers a request's RPC and Post-RPC under a name, so that the
  /// request can be finished without its client: its record keeps the name
  /// and version, and a completer (orpheus/completer.hpp) resumes it with
  /// these phases and the stored Pre-RPC result, read as `PreState`
  /// (docs/operations.md). Pre-RPC is not registered: it runs once, with the
  /// client's request, and is given to process(handler, id, pre).
  ///
  ///   m.register_handler<payment>("create_payment", 1, charge, record);
  ///   m.process("create_payment", id, [&](orpheus::tx& t) { ...; return payment{...}; });
  ///
  /// The phases are copied and called from any thread that calls process()
  /// or complete(); register every handler before serving (registration is
  /// not thread-safe). Throws config_error for a name that is not 1 to 64
  /// characters of A-Z a-z 0-9 _ - ., a version below 1, or a name
  /// registered already.
  template <class PreState, class Rpc, class Post>
  requires rpc_phase<Rpc, PreState> &&
      post_rpc_phase<Post, PreState, detail::outcome_of_rpc<Rpc, PreState>>
  void register_handler(std::string name, int version, Rpc rpc, Post post);

  /// A multi-step request registered under a name: the completer resumes it
  /// at its first unfinished step (or its compensations). `flow` is copied.
  template <class PreState>
  void register_handler(std::string name, int version, steps<PreState> flow);

  /// process() with the RPC and Post-RPC registered under `handler`, and
  /// this request's Pre-RPC. The record remembers the handler. Throws
  /// config_error when no handler has that name, or when `pre` returns
  /// another type than the one the handler was registered with.
  template <pre_rpc_phase Pre>
  response process(std::string_view handler, const request_id& id, Pre&& pre,
                   const process_options& options = {});

  /// process(handler, id, pre) without exceptions, as try_process() above.
  template <pre_rpc_phase Pre>
  outcome<response> try_process(std::string_view handler, const request_id& id, Pre&& pre,
                                const process_options& options = {});

  /// The registered handlers' names and versions.
  [[nodiscard]] std::vector<std::pair<std::string, int>> handlers() const;

  /// For the completer: resumes the claimed request `id` (its fingerprint as
  /// recorded) with the handler its record names, as a retry run by the
  /// completer. A handler this build does not have, or has only in an older
  /// version, parks the request (codes::handler_unknown), as does a stored
  /// Pre-RPC result the handler cannot read: never guessed at. Throws what
  /// process() throws (409 when someone else holds the key, request_parked,
  /// a retryable failure).
  response complete(const request_id& id, std::string_view handler, int version);

 private:
  using pre_function = std::function<nlohmann::json(tx&)>;
  struct registered_handler {
    int version = 0;
    std::type_index pre_state = typeid(void);
    std::function<response(manager&, const request_id&, const process_options&,
                           const detail::run_context&, const pre_function&)>
        run;
  };

  // The phases of one call: `pre` gives the Pre-RPC result as JSON (a
  // completer's never runs: it only resumes records that exist).
  template <class PreState, class Rpc, class Post>
  response process_with(const detail::run_context& ctx, const request_id& id,
                        const pre_function& pre, Rpc& rpc, Post& post,
                        const process_options& options);
  template <class PreState>
  response process_flow(const detail::run_context& ctx, const request_id& id,
                        const pre_function& pre, const steps<PreState>& flow,
                        const process_options& options);
  const registered_handler& handler_named(std::string_view name) const;
  /// run_observed(); a record begun through another registered handler is
  /// handed on to that handler's phases (a client's retry through another).
  response run(const request_id& id, const detail::phases& p, const process_options& options,
               const detail::run_context& ctx);
  /// run_unobserved(), and config::observer told how it ended.
  response run_observed(const request_id& id, const detail::phases& p,
                        const process_options& options, const detail::run_context& ctx);
  response run_unobserved(const request_id& id, const detail::phases& p,
                          const process_options& options, const detail::run_context& ctx);
  struct flow_run;
  response run_flow(flow_run& f);
  response compensate_and_fail(flow_run& f, const attempt* failed_step,
                               const std::optional<error_info>& step_failure);
  void add_handler(std::string name, int version, registered_handler h);
  /// The completer's wait after `attempts` attempts, drawn with jitter.
  [[nodiscard]] std::int64_t backoff_us(int attempts) const;

  store& store_;
  config config_;
  std::map<std::string, registered_handler, std::less<>> handlers_;
  /// Null when config::replay_cache_bytes is 0. Copies of a manager share it.
  std::shared_ptr<detail::replay_cache> replay_cache_;
};

template <pre_rpc_phase Pre, rpc_phase<detail::pre_state_of<Pre>> Rpc, class Post>
requires post_rpc_phase<Post, detail::pre_state_of<Pre>,
                        detail::outcome_of_rpc<Rpc, detail::pre_state_of<Pre>>>
    response manager::process(const request_id& id, Pre&& pre, Rpc&& rpc, Post&& post,
                              const process_options& options) {
  return process_with<detail::pre_state_of<Pre>>(
      detail::run_context{}, id, [&](tx& t) { return nlohmann::json(std::invoke(pre, t)); }, rpc,
      post, options);
}

template <class PreState, class Rpc, class Post>
requires rpc_phase<Rpc, PreState> &&
    post_rpc_phase<Post, PreState, detail::outcome_of_rpc<Rpc, PreState>>
void manager::register_handler(std::string name, int version, Rpc rpc, Post post) {
  registered_handler h;
  h.pre_state = typeid(PreState);
  h.run = [rpc = std::move(rpc), post = std::move(post)](
              manager& m, const request_id& id, const process_options& options,
              const detail::run_context& ctx, const pre_function& pre) mutable {
    return m.process_with<PreState>(ctx, id, pre, rpc, post, options);
  };
  add_handler(std::move(name), version, std::move(h));
}

template <pre_rpc_phase Pre>
response manager::process(std::string_view handler, const request_id& id, Pre&& pre,
                          const process_options& options) {
  const registered_handler& h = handler_named(handler);
  if (h.pre_state != typeid(detail::pre_state_of<Pre>)) {
    throw config_error("handler '" + std::string(handler) +
                       "': Pre-RPC returns another type than the one it was registered with");
  }
  return h.run(*this, id, options, detail::run_context{handler, h.version, "client"},
               [&](tx& t) { return nlohmann::json(std::invoke(pre, t)); });
}

template <class PreState, class Rpc, class Post>
response manager::process_with(const detail::run_context& ctx, const request_id& id,
                               const pre_function& pre, Rpc& rpc, Post& post,
                               const process_options& options) {
  using pre_state = PreState;
  using outcome_t = detail::outcome_of_rpc<Rpc, pre_state>;
  using value_t = typename outcome_t::value_type;

  std::optional<pre_state> state;
  std::optional<outcome_t> result;
  const unclassified_policy policy = config_.unclassified;
  detail::phases p{
      pre, [&](const nlohmann::json& stored) { state.emplace(stored.get<pre_state>()); },
      [&](const attempt& a) -> std::optional<error_info> {
        try {
          result.emplace(std::invoke(rpc, a, std::as_const(*state)));
        } catch (...) {
          result.emplace(classify(std::current_exception(), policy));
        }
        if (result->ok()) return std::nullopt;
        return result->error();
      },
      [&](tx& t, const attempt& a) -> response {
        // The outcome kinds first: outcome<T> converts from T,
        // so they would also take the success kinds' argument.
        if constexpr (detail::post_on_outcome_with_state<Post, pre_state, outcome_t>) {
          return std::invoke(post, t, a, std::as_const(*state), std::as_const(*result));
        } else if constexpr (detail::post_on_outcome<Post, outcome_t>) {
          return std::invoke(post, t, a, std::as_const(*result));
        } else {
          // Success only: a failure is recorded (non-retryable)
          // or left retryable by the library, never by Post-RPC.
          if (!result->ok()) return problem_response(result->error());
          if constexpr (detail::post_on_success_with_state<Post, pre_state, value_t>) {
            return std::invoke(post, t, a, std::as_const(*state), result->value());
          } else {
            return std::invoke(post, t, a, result->value());
          }
        }
      },
      nullptr};
  return run(id, p, options, ctx);
}

template <pre_rpc_phase Pre>
response manager::process(const request_id& id, Pre&& pre,
                          const steps<detail::pre_state_of<Pre>>& flow,
                          const process_options& options) {
  flow.validate();  // a registered flow is checked once, at registration
  return process_flow<detail::pre_state_of<Pre>>(
      detail::run_context{}, id, [&](tx& t) { return nlohmann::json(std::invoke(pre, t)); }, flow,
      options);
}

template <class PreState>
void manager::register_handler(std::string name, int version, steps<PreState> flow) {
  flow.validate();
  registered_handler h;
  h.pre_state = typeid(PreState);
  h.run = [flow = std::move(flow)](manager& m, const request_id& id, const process_options& options,
                                   const detail::run_context& ctx, const pre_function& pre) {
    return m.process_flow<PreState>(ctx, id, pre, flow, options);
  };
  add_handler(std::move(name), version, std::move(h));
}

template <class PreState>
response manager::process_flow(const detail::run_context& ctx, const request_id& id,
                               const pre_function& pre, const steps<PreState>& flow,
                               const process_options& options) {
  const unclassified_policy policy = flow.unclassified_policy_set().value_or(config_.unclassified);
  std::optional<PreState> state;
  detail::flow_phases f;
  f.pivot = flow.pivot_index();
  for (const auto& d : flow.defs()) {
    detail::step_phase s;
    s.name = d.name;
    s.rpc = [&state, &d, policy](const attempt& a, const step_results& done, nlohmann::json& out) {
      return d.rpc(a, *state, done, out, policy);
    };
    if (d.post) {
      s.post = [&state, &d](tx& t, const attempt& a, const nlohmann::json& r) {
        d.post(t, a, *state, r);
      };
    }
    if (d.compensate) {
      s.compensate = [&state, &d, policy](const attempt& a, const nlohmann::json& r) {
        return d.compensate(a, *state, r, policy);
      };
    }
    f.steps.push_back(std::move(s));
  }
  f.respond = [&state, &flow](tx& t, const attempt& a, const step_results& done) {
    return flow.responder()(t, a, *state, done);
  };
  f.failed = [&state, &flow](tx& t, const attempt& a, const error_info& e) {
    if (flow.failure_responder()) return flow.failure_responder()(t, a, *state, e);
    return problem_response(e);
  };
  detail::phases p{pre,
                   [&](const nlohmann::json& stored) { state.emplace(stored.get<PreState>()); },
                   {},
                   {},
                   &f};
  return run(id, p, options, ctx);
}

template <pre_rpc_phase Pre, rpc_phase<detail::pre_state_of<Pre>> Rpc, class Post>
requires post_rpc_phase<Post, detail::pre_state_of<Pre>,
                        detail::outcome_of_rpc<Rpc, detail::pre_state_of<Pre>>>
    outcome<response> manager::try_process(const request_id& id, Pre&& pre, Rpc&& rpc, Post&& post,
                                           const process_options& options) {
  try {
    return process(id, std::forward<Pre>(pre), std::forward<Rpc>(rpc), std::forward<Post>(post),
                   options);
  } catch (const error& e) {
    return e.info();
  } catch (...) {
    return classify(std::current_exception(), config_.unclassified);
  }
}

template <pre_rpc_phase Pre>
outcome<response> manager::try_process(std::string_view handler, const request_id& id, Pre&& pre,
                                       const process_options& options) {
  try {
    return process(handler, id, std::forward<Pre>(pre), options);
  } catch (const error& e) {
    return e.info();
  } catch (...) {
    return classify(std::current_exception(), config_.unclassified);
  }
}

}  // namespace orpheus
