// The library's observer (orpheus/observer.hpp) as Prometheus metrics, in a
// prometheus::Registry of yours (prometheus-cpp). Serve them with text_of():
//
//   auto registry = std::make_shared<::prometheus::Registry>();
//   orpheus::config cfg;
//   cfg.observer = std::make_shared<orpheus::prometheus::observer>(*registry,
//                                                                  store.shard_count());
//   orpheus::manager manager(store, cfg);
//   // GET /metrics:
//   respond(200, orpheus::prometheus::text_of(*registry), orpheus::prometheus::content_type);
//
// The series (docs/metrics.md), each with a `shard` label:
//   orpheus_requests_total{outcome}        counter: how each request ended
//                                          (request_outcome: recorded, replayed,
//                                          in_progress, mismatch, retry_later,
//                                          lease_lost, in_doubt,
//                                          storage_unavailable, parked, refused)
//   orpheus_key_events_total{event}        counter: new_key, takeover, retry,
//                                          attempts_exhausted, parked
//   orpheus_phase_duration_seconds{phase}  histogram: read, acquire, rpc, record
// Every series of shards 0 .. shards-1 exists from the start (at 0), so a
// rate() sees the first event.
//
// Thread safety: the observer is called from every request's thread at once;
// counters are atomic, each histogram has prometheus-cpp's own lock. The
// registry must outlive the observer.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "orpheus/observer.hpp"

namespace prometheus {
class Counter;
class Histogram;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace orpheus::prometheus {

/// The Content-Type of text_of()'s answer (Prometheus text format 0.0.4).
inline constexpr std::string_view content_type = "text/plain; version=0.0.4; charset=utf-8";

/// Every metric in `registry` in the Prometheus text format, by
/// prometheus-cpp's TextSerializer.
[[nodiscard]] std::string text_of(const ::prometheus::Registry& registry);

/// The bucket bounds of orpheus_phase_duration_seconds by default: 0.5 ms
/// to 10 s.
[[nodiscard]] std::vector<double> default_phase_buckets();

class observer final : public orpheus::observer {
 public:
  /// Registers the three families in `registry` and makes their series for
  /// shards 0 .. shards-1 (a request on a higher shard adds its series then).
  /// Throws config_error when `shards` is 0 or `phase_buckets` is empty or
  /// not increasing.
  observer(::prometheus::Registry& registry, std::size_t shards,
           std::vector<double> phase_buckets = default_phase_buckets());

  void on_request(std::size_t shard, request_outcome outcome) noexcept override;
  void on_event(std::size_t shard, request_event event) noexcept override;
  void on_phase(std::size_t shard, request_phase phase,
                std::chrono::nanoseconds took) noexcept override;

 private:
  static constexpr std::size_t outcomes = std::size(all_request_outcomes);
  static constexpr std::size_t events = std::size(all_request_events);
  static constexpr std::size_t phases = std::size(all_request_phases);
  ::prometheus::Counter& request_counter(std::size_t shard, request_outcome o);
  ::prometheus::Counter& event_counter(std::size_t shard, request_event e);
  ::prometheus::Histogram& phase_histogram(std::size_t shard, request_phase p);

  ::prometheus::Family<::prometheus::Counter>& requests_;
  ::prometheus::Family<::prometheus::Counter>& events_;
  ::prometheus::Family<::prometheus::Histogram>& phases_;
  const std::vector<double> buckets_;
  // The series of shards 0 .. shards-1, made once: no lock on the way.
  std::vector<std::array<::prometheus::Counter*, outcomes>> request_series_;
  std::vector<std::array<::prometheus::Counter*, events>> event_series_;
  std::vector<std::array<::prometheus::Histogram*, phases>> phase_series_;
};

}  // namespace orpheus::prometheus
