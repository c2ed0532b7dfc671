// orpheus::steps — a request made of several RPCs (docs/steps.md).
//
// A card payment is not one call: authorise, then capture, then tell the
// ledger. Each step is an RPC plus, optionally, its own Post-RPC SQL; when a
// step succeeds, its result and the step's SQL commit together with the
// record's recovery point (and the lease is renewed). A retry, by the client
// or by a completer, resumes at the first unfinished step; the finished
// steps' results are read back from the record.
//
// One step is the pivot (the last one unless pivot() says otherwise):
//   - a non-retryable failure of a step up to and including the pivot runs
//     the compensations of the finished steps, last first, then records the
//     failure (replayed from then on);
//   - after the pivot the request only goes forward: a non-retryable failure
//     of a later step is retried (codes::step_failed_after_pivot) until it
//     finishes or, out of attempts, is parked for a person.
// A compensation that fails in a way safe to retry is retried; one that
// fails for good (a void the bank refuses because the payment was captured)
// parks the request (codes::compensation_failed). A compensation must be
// idempotent: pass attempt::downstream_key() downstream.
//
// A step_ref (what step() returns) names its own step, also when kept and
// used after later steps were added.
//
//   orpheus::steps<payment> pay;
//   pay.step("authorise", [&](const orpheus::attempt& a, const payment& p,
//                             const orpheus::step_results&) { return bank.authorise(a, p); })
//       .compensate([&](const orpheus::attempt& a, const payment& p, const authorisation& au) {
//         bank.void_authorisation(a, au);  // throws a classified error to fail
//       })
//       .step("capture", [&](const orpheus::attempt& a, const payment& p,
//                            const orpheus::step_results& done) {
//         return bank.capture(a, done.get<authorisation>("authorise"));
//       })
//       .pivot()
//       .step("notify", ...)
//       .respond([](orpheus::tx& t, const orpheus::attempt&, const payment& p,
//                   const orpheus::step_results& done) { return orpheus::response{...}; });
//   m.process(id, pre, pay);   // or m.register_handler("create_payment", 1, pay)
//
// Phases (each a concept-checked signature; T is the step's result, which
// nlohmann::json must serialise both ways):
//   step RPC     rpc(const attempt&, const PreState&, const step_results&) -> T or outcome<T>
//   step SQL     post(tx&, const attempt&, const PreState&, const T&)   (optional)
//   compensation compensate(const attempt&, const PreState&, const T&)   (optional)
//   response     respond(tx&, const attempt&, const PreState&, const step_results&) -> response,
//                in the last step's transaction
//   failure      on_failure(tx&, const attempt&, const PreState&, const error_info&) -> response
//                (optional; default problem_response), in the transaction that
//                records the failure, after the compensations
//
// Building a steps<> is not thread-safe; once built, process() may use it
// from any number of threads (it is only read).
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "orpheus/error.hpp"
#include "orpheus/problem.hpp"
#include "orpheus/request.hpp"
#include "orpheus/tx.hpp"

namespace orpheus {

template <class T>
class outcome;

/// The results of the steps a request has finished, by step name, as read
/// back from the record (the same values on a first attempt and a retry).
class step_results {
 public:
  step_results() = default;
  explicit step_results(std::vector<std::pair<std::string, nlohmann::json>> done)
      : done_(std::move(done)) {}

  [[nodiscard]] bool has(std::string_view step) const { return find(step) != nullptr; }
  /// The result of `step` as T. Throws std::out_of_range when the step has
  /// not finished, and detail::unreadable_result() (pre_state_unreadable,
  /// retryable: never a failure for good) when the stored result does not
  /// read as a T (another deploy's type).
  template <class T>
  [[nodiscard]] T get(std::string_view step) const {
    const nlohmann::json* j = find(step);
    if (j == nullptr) throw std::out_of_range("step '" + std::string(step) + "' has not finished");
    return read_as<T>(*j, step);
  }

  /// `stored` as T, or the error above.
  template <class T>
  [[nodiscard]] static T read_as(const nlohmann::json& stored, std::string_view step) {
    try {
      return stored.get<T>();
    } catch (const std::exception& e) {
      // Not only nlohmann's: a type's own from_json may throw anything
      // (found in review: std::invalid_argument failed the step for good,
      // and the request went backwards).
      throw_unreadable(step, e.what());
    }
  }
  [[nodiscard]] const std::vector<std::pair<std::string, nlohmann::json>>& entries() const {
    return done_;
  }

 private:
  [[noreturn]] static void throw_unreadable(std::string_view step, const char* why);
  [[nodiscard]] const nlohmann::json* find(std::string_view step) const {
    const auto it =
        std::find_if(done_.begin(), done_.end(), [&](const auto& d) { return d.first == step; });
    return it == done_.end() ? nullptr : &it->second;
  }
  std::vector<std::pair<std::string, nlohmann::json>> done_;
};

namespace detail {
template <class R>
struct step_value {
  using type = R;
};
template <class T>
struct step_value<outcome<T>> {
  using type = T;
};
/// One step with its Pre-RPC type bound; see steps<PreState>.
template <class PreState>
struct step_def {
  std::string name;
  /// Runs the RPC; on success writes the result as JSON to `out` and returns
  /// nullopt, else returns the classified error.
  std::function<std::optional<error_info>(const attempt&, const PreState&, const step_results&,
                                          nlohmann::json& out, unclassified_policy)>
      rpc;
  std::function<void(tx&, const attempt&, const PreState&, const nlohmann::json&)> post{};
  std::function<std::optional<error_info>(const attempt&, const PreState&, const nlohmann::json&,
                                          unclassified_policy)>
      compensate{};
};
/// Throws config_error when a flow cannot run: no step, no respond(), or a
/// step name that is not 1 to 64 characters of A-Z a-z 0-9 _ - . or is used
/// twice.
void validate_steps(const std::vector<std::string>& names, bool has_respond);
}  // namespace detail

/// Step RPC: `rpc(const attempt&, const PreState&, const step_results&) -> T or outcome<T>`.
template <class Rpc, class PreState>
concept step_rpc_phase =
    std::invocable<Rpc&, const attempt&, const PreState&, const step_results&> && !std::is_void_v<
        std::invoke_result_t<Rpc&, const attempt&, const PreState&, const step_results&>>;

template <class PreState>
class steps;

/// The step just added to a steps<PreState>, whose result type T is known:
/// what can be said about it (post, compensate, pivot), then the next step.
template <class PreState, class T>
class step_ref {
 public:
  step_ref(steps<PreState>& s, std::size_t index) : steps_(&s), index_(index) {}

  /// The step's own SQL, on its success, in the transaction that records it:
  /// post(tx&, const attempt&, const PreState&, const T&).
  template <class Post>
  requires std::invocable<Post&, tx&, const attempt&, const PreState&, const T&> step_ref& post(
      Post p) {
    def().post = [p = std::move(p)](tx& t, const attempt& a, const PreState& s,
                                    const nlohmann::json& r) mutable {
      std::invoke(p, t, a, s, step_results::read_as<T>(r, a.step()));
    };
    return *this;
  }

  /// How to undo the step: compensate(const attempt&, const PreState&, const
  /// T&). It fails by throwing (classified like an RPC's error).
  template <class Compensate>
  requires std::invocable<Compensate&, const attempt&, const PreState&, const T&> step_ref&
  compensate(Compensate c) {
    def().compensate = [c = std::move(c)](
                           const attempt& a, const PreState& s, const nlohmann::json& r,
                           unclassified_policy policy) mutable -> std::optional<error_info> {
      try {
        std::invoke(c, a, s, step_results::read_as<T>(r, a.step()));
        return std::nullopt;
      } catch (...) {
        return classify(std::current_exception(), policy);
      }
    };
    return *this;
  }

  /// Makes this step the pivot (default: the last step).
  step_ref& pivot() {
    steps_->pivot_ = index_;
    return *this;
  }

  /// The next step, the response, the failure response: as on steps<PreState>.
  template <step_rpc_phase<PreState> Rpc>
  auto step(std::string_view name, Rpc rpc) {
    return steps_->step(name, std::move(rpc));
  }
  template <class Respond>
  steps<PreState>& respond(Respond r) {
    return steps_->respond(std::move(r));
  }
  template <class OnFailure>
  steps<PreState>& on_failure(OnFailure f) {
    return steps_->on_failure(std::move(f));
  }

 private:
  detail::step_def<PreState>& def() { return steps_->steps_.at(index_); }
  steps<PreState>* steps_;
  std::size_t index_;
};

template <class PreState>
class steps {
 public:
  /// Adds a step after the others. `name` names it in the recovery point,
  /// the history and step_results (1 to 64 characters of A-Z a-z 0-9 _ - .).
  template <step_rpc_phase<PreState> Rpc>
  auto step(std::string_view name, Rpc rpc) {
    using returned = std::decay_t<
        std::invoke_result_t<Rpc&, const attempt&, const PreState&, const step_results&>>;
    using value = typename detail::step_value<returned>::type;
    detail::step_def<PreState> d;
    d.name = std::string(name);
    d.rpc = [rpc = std::move(rpc)](
                const attempt& a, const PreState& p, const step_results& done, nlohmann::json& out,
                unclassified_policy policy) mutable -> std::optional<error_info> {
      try {
        returned r = std::invoke(rpc, a, p, done);
        if constexpr (std::is_same_v<returned, value>) {
          out = nlohmann::json(std::move(r));
        } else {
          if (!r.ok()) return r.error();
          out = nlohmann::json(r.value());
        }
        return std::nullopt;
      } catch (...) {
        return classify(std::current_exception(), policy);
      }
    };
    steps_.push_back(std::move(d));
    return step_ref<PreState, value>(*this, steps_.size() - 1);
  }

  /// The response, from the finished steps' results, in the last step's
  /// transaction (after that step's own SQL).
  template <class Respond>
  requires std::is_invocable_r_v<response, Respond&, tx&, const attempt&, const PreState&,
                                 const step_results&>
      steps& respond(Respond r) {
    respond_ = std::move(r);
    return *this;
  }

  /// The response recorded for a failure (after the compensations), in the
  /// transaction that records it. Default: problem_response(error).
  template <class OnFailure>
  requires std::is_invocable_r_v<response, OnFailure&, tx&, const attempt&, const PreState&,
                                 const error_info&>
      steps& on_failure(OnFailure f) {
    on_failure_ = std::move(f);
    return *this;
  }

  /// How exceptions that are not orpheus::error are classified in this
  /// flow's steps and compensations (default: the manager's
  /// config::unclassified).
  steps& unclassified(unclassified_policy p) {
    policy_ = p;
    return *this;
  }
  [[nodiscard]] const std::optional<unclassified_policy>& unclassified_policy_set() const {
    return policy_;
  }

  /// Throws config_error when this flow cannot run (see detail::validate_steps).
  void validate() const {
    std::vector<std::string> names;
    names.reserve(steps_.size());
    for (const auto& s : steps_) names.push_back(s.name);
    detail::validate_steps(names, static_cast<bool>(respond_));
  }

  [[nodiscard]] const std::vector<detail::step_def<PreState>>& defs() const { return steps_; }
  /// The pivot's index (default: the last step).
  [[nodiscard]] std::size_t pivot_index() const {
    return pivot_.value_or(steps_.empty() ? 0 : steps_.size() - 1);
  }
  [[nodiscard]] const std::function<response(tx&, const attempt&, const PreState&,
                                             const step_results&)>&
  responder() const {
    return respond_;
  }
  [[nodiscard]] const std::function<response(tx&, const attempt&, const PreState&,
                                             const error_info&)>&
  failure_responder() const {
    return on_failure_;
  }

 private:
  template <class, class>
  friend class step_ref;

  std::vector<detail::step_def<PreState>> steps_;
  std::optional<std::size_t> pivot_;
  std::function<response(tx&, const attempt&, const PreState&, const step_results&)> respond_{};
  std::function<response(tx&, const attempt&, const PreState&, const error_info&)> on_failure_{};
  std::optional<unclassified_policy> policy_;
};

}  // namespace orpheus
