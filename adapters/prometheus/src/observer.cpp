#include "orpheus/prometheus/observer.hpp"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "orpheus/error.hpp"

namespace orpheus::prometheus {
namespace {

// The arrays of the series are indexed by the enumerators' values.
template <class E, std::size_t N>
constexpr bool indexes_in_order(const E (&all)[N]) {
  for (std::size_t i = 0; i < N; ++i) {
    if (static_cast<std::size_t>(all[i]) != i) return false;
  }
  return true;
}
static_assert(indexes_in_order(all_request_outcomes));
static_assert(indexes_in_order(all_request_events));
static_assert(indexes_in_order(all_request_phases));

std::vector<double> checked(std::vector<double> buckets) {
  // Finite too (found in review: NaN passed both checks, and +Inf is the
  // bucket every histogram has already).
  if (buckets.empty() ||
      !std::all_of(buckets.begin(), buckets.end(), [](double b) { return std::isfinite(b); }) ||
      !std::is_sorted(buckets.begin(), buckets.end()) ||
      std::adjacent_find(buckets.begin(), buckets.end()) != buckets.end()) {
    throw config_error(
        "prometheus observer: the phase buckets must be finite and increasing, at least one");
  }
  return buckets;
}

::prometheus::Labels labels(std::string_view name, std::string_view value, std::size_t shard) {
  return {{std::string(name), std::string(value)}, {"shard", std::to_string(shard)}};
}

}  // namespace

std::string text_of(const ::prometheus::Registry& registry) {
  return ::prometheus::TextSerializer().Serialize(registry.Collect());
}

std::vector<double> default_phase_buckets() {
  return {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
}

observer::observer(::prometheus::Registry& registry, std::size_t shards,
                   std::vector<double> phase_buckets)
    : requests_(::prometheus::BuildCounter()
                    .Name("orpheus_requests_total")
                    .Help("Idempotent requests by how they ended (one per call)")
                    .Register(registry)),
      events_(::prometheus::BuildCounter()
                  .Name("orpheus_key_events_total")
                  .Help("What happened to keys: new ones, take-overs, retries, parkings")
                  .Register(registry)),
      phases_(::prometheus::BuildHistogram()
                  .Name("orpheus_phase_duration_seconds")
                  .Help("Time in each phase of an attempt: read, acquire (transaction 1 with "
                        "Pre-RPC), rpc, record (transaction 2 with Post-RPC)")
                  .Register(registry)),
      buckets_(checked(std::move(phase_buckets))) {
  if (shards == 0) throw config_error("prometheus observer: shards must be at least 1");
  request_series_.resize(shards);
  event_series_.resize(shards);
  phase_series_.resize(shards);
  for (std::size_t s = 0; s < shards; ++s) {
    for (const auto o : all_request_outcomes) {
      request_series_[s][static_cast<std::size_t>(o)] = &request_counter(s, o);
    }
    for (const auto e : all_request_events) {
      event_series_[s][static_cast<std::size_t>(e)] = &event_counter(s, e);
    }
    for (const auto p : all_request_phases) {
      phase_series_[s][static_cast<std::size_t>(p)] = &phase_histogram(s, p);
    }
  }
}

::prometheus::Counter& observer::request_counter(std::size_t shard, request_outcome o) {
  return requests_.Add(labels("outcome", to_string(o), shard));
}

::prometheus::Counter& observer::event_counter(std::size_t shard, request_event e) {
  return events_.Add(labels("event", to_string(e), shard));
}

::prometheus::Histogram& observer::phase_histogram(std::size_t shard, request_phase p) {
  return phases_.Add(labels("phase", to_string(p), shard), buckets_);
}

// A shard past the ones made at start-up goes through Family::Add (a lock
// and a lookup); nothing it throws (out of memory) reaches the request.
void observer::on_request(std::size_t shard, request_outcome outcome) noexcept {
  try {
    (shard < request_series_.size() ? *request_series_[shard][static_cast<std::size_t>(outcome)]
                                    : request_counter(shard, outcome))
        .Increment();
  } catch (...) {  // NOLINT(bugprone-empty-catch): metrics never fail a request
  }
}

void observer::on_event(std::size_t shard, request_event event) noexcept {
  try {
    (shard < event_series_.size() ? *event_series_[shard][static_cast<std::size_t>(event)]
                                  : event_counter(shard, event))
        .Increment();
  } catch (...) {  // NOLINT(bugprone-empty-catch): metrics never fail a request
  }
}

void observer::on_phase(std::size_t shard, request_phase phase,
                        std::chrono::nanoseconds took) noexcept {
  try {
    (shard < phase_series_.size() ? *phase_series_[shard][static_cast<std::size_t>(phase)]
                                  : phase_histogram(shard, phase))
        .Observe(std::chrono::duration<double>(took).count());
  } catch (...) {  // NOLINT(bugprone-empty-catch): metrics never fail a request
  }
}

}  // namespace orpheus::prometheus
