// The payments server's GET /metrics: requests by method and outcome, lease
// take-overs, purged records and a latency histogram, in the Prometheus text
// format. Thread-safe: every method takes one mutex.
#pragma once

#include <chrono>
#include <cstddef>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "orpheus/beast/server.hpp"

namespace examples::payments_server {

class metrics {
 public:
  /// One answered request (the middleware's `observe` hook).
  void observe(const orpheus::beast::http_request& req, const orpheus::beast::http_response& res,
               std::chrono::microseconds took);
  /// An attempt that took over an expired or retryable key.
  void takeover();
  /// Expired idempotency records deleted.
  void purged(std::size_t n);
  /// Everything counted so far, as GET /metrics answers it.
  [[nodiscard]] std::string text();

 private:
  std::mutex m_;
  std::map<std::string, long> requests_;
  const std::vector<double> bounds_{0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5};
  std::vector<long> buckets_ = std::vector<long>(8);
  long count_ = 0, takeovers_ = 0, purged_ = 0;
  double sum_ = 0;
};

}  // namespace examples::payments_server
