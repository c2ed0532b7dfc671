// Multi-step requests: the checks of a flow, and its recovery point's form.
#include "orpheus/steps.hpp"
#include "orpheus/detail/ascii.hpp"

#include <algorithm>
#include <set>
#include <utility>

#include "pre_state.hpp"
#include "progress.hpp"

namespace orpheus {

void detail::validate_steps(const std::vector<std::string>& names, bool has_respond) {
  if (names.empty()) throw config_error("a multi-step request needs at least one step");
  std::set<std::string, std::less<>> seen;
  for (const auto& n : names) {
    if (n.empty() || n.size() > 64 || !std::all_of(n.begin(), n.end(), [](char c) {
          return detail::is_ascii_alnum(c) || c == '_' || c == '-' || c == '.';
        })) {
      throw config_error("a step name is 1 to 64 characters of A-Z a-z 0-9 _ - .");
    }
    if (!seen.insert(n).second) throw config_error("step '" + n + "' is declared twice");
  }
  if (!has_respond) throw config_error("a multi-step request needs respond()");
}

void step_results::throw_unreadable(std::string_view step, const char* why) {
  throw error(error_info::of(error_class::unavailable, codes::pre_state_unreadable,
                             "the stored request state cannot be read by this server version; "
                             "retry later")
                  .with_internal("the stored result of step " + std::string(step) +
                                 " does not read: " + why));
}

namespace detail {
namespace {

constexpr int format_version = 1;

std::optional<error_class> class_named(std::string_view name) {
  using enum error_class;
  for (const error_class c : {invalid_input, conflict, unavailable, in_doubt, rejected, internal}) {
    if (to_string(c) == name) return c;
  }
  return std::nullopt;
}

}  // namespace

std::string encode_progress(const progress& p) {
  nlohmann::json done = nlohmann::json::array();
  for (const auto& [name, result] : p.done) done.push_back({name, result});
  nlohmann::json j = {
      {"v", format_version}, {"steps", p.names}, {"pivot", p.pivot}, {"done", std::move(done)}};
  if (p.compensating) {
    const error_info& e = *p.compensating;
    j["failure"] = {{"class", to_string(e.kind)},
                    {"code", e.code},
                    {"message", e.message},
                    {"internal", e.internal},
                    {"step", p.failed_step}};
    if (e.http_status) j["failure"]["status"] = *e.http_status;
  }
  return encode_pre_state(j);
}

std::optional<progress> decode_progress(std::string_view stored) {
  try {
    const std::optional<nlohmann::json> j = decode_pre_state(stored);
    if (!j || !j->is_object() || j->value("v", 0) != format_version) return std::nullopt;
    progress p;
    p.names = j->at("steps").get<std::vector<std::string>>();
    p.pivot = j->at("pivot").get<std::size_t>();
    for (const auto& d : j->at("done")) {
      p.done.emplace_back(d.at(0).get<std::string>(), d.at(1));
    }
    if (p.names.empty() || p.pivot >= p.names.size() || p.done.size() > p.names.size()) {
      return std::nullopt;
    }
    for (std::size_t i = 0; i < p.done.size(); ++i) {
      if (p.done[i].first != p.names[i]) return std::nullopt;
    }
    if (j->contains("failure")) {
      const auto& f = j->at("failure");
      const auto kind = class_named(f.at("class").get<std::string>());
      if (!kind) return std::nullopt;
      error_info e = error_info::of(*kind, f.at("code").get<std::string>(),
                                    f.at("message").get<std::string>());
      e.retry_after.reset();
      if (f.contains("status")) e.http_status = f.at("status").get<int>();
      e.internal = f.value("internal", std::string());
      p.failed_step = f.value("step", std::string());
      p.compensating = std::move(e);
    }
    return p;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

}  // namespace detail
}  // namespace orpheus
