// The payments server's GET /metrics, on prometheus-cpp: the library's own
// series (orpheus_requests_total, orpheus_key_events_total,
// orpheus_phase_duration_seconds, from orpheus::prometheus::observer) and
// the server's (requests by method and HTTP outcome, their latency, purged
// records), in one registry, rendered by prometheus-cpp's text serialiser.
// Thread-safe.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "orpheus/beast/server.hpp"
#include "orpheus/prometheus/observer.hpp"

namespace prometheus {
class Registry;
}

namespace examples::payments_server {

class metrics {
 public:
  /// The library's series for shards 0 .. shards-1.
  explicit metrics(std::size_t shards);
  metrics(const metrics&) = delete;
  metrics& operator=(const metrics&) = delete;
  ~metrics();

  /// What the manager reports to (orpheus::config::observer).
  [[nodiscard]] std::shared_ptr<orpheus::observer> library_observer() const { return library_; }
  /// One answered request (the middleware's `observe` hook).
  void observe(const orpheus::beast::http_request& req, const orpheus::beast::http_response& res,
               std::chrono::microseconds took);
  /// Expired idempotency records deleted.
  void purged(std::size_t n);
  /// Everything, in the Prometheus text format (orpheus::prometheus::content_type).
  [[nodiscard]] std::string text() const;

 private:
  // Methods GET, POST, other; outcomes 1xx .. 5xx, replayed, conflict.
  static constexpr std::size_t methods = 3;
  static constexpr std::size_t outcomes = 7;

  std::unique_ptr<::prometheus::Registry> registry_;
  std::shared_ptr<orpheus::prometheus::observer> library_;
  std::array<std::array<::prometheus::Counter*, outcomes>, methods> requests_{};
  ::prometheus::Histogram* duration_ = nullptr;
  ::prometheus::Counter* purged_ = nullptr;
};

}  // namespace examples::payments_server
