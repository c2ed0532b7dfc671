#include "metrics.hpp"

#include <sstream>

namespace examples::payments_server {

void metrics::observe(const orpheus::beast::http_request& req,
                      const orpheus::beast::http_response& res, std::chrono::microseconds took) {
  std::lock_guard lock(m_);
  const bool replay = res.find("Idempotent-Replayed") != res.end();
  std::string outcome = replay ? "replayed" : std::to_string(res.result_int() / 100) + "xx";
  if (res.result_int() == 409) outcome = "conflict";
  ++requests_[std::string(req.method_string()) + "\",outcome=\"" + outcome];
  const double s = static_cast<double>(took.count()) / 1e6;
  for (std::size_t i = 0; i < bounds_.size(); ++i) {
    if (s <= bounds_[i]) ++buckets_[i];
  }
  ++count_;
  sum_ += s;
}

void metrics::takeover() {
  std::lock_guard lock(m_);
  ++takeovers_;
}

void metrics::purged(std::size_t n) {
  std::lock_guard lock(m_);
  purged_ += static_cast<long>(n);
}

std::string metrics::text() {
  std::lock_guard lock(m_);
  std::ostringstream o;
  o << "# HELP payments_requests_total Requests answered, by method and outcome.\n"
       "# TYPE payments_requests_total counter\n";
  for (const auto& [k, n] : requests_)
    o << "payments_requests_total{method=\"" << k << "\"} " << n << "\n";
  o << "# HELP payments_lease_takeovers_total Attempts that took over an expired or retryable "
       "key.\n"
       "# TYPE payments_lease_takeovers_total counter\n"
       "payments_lease_takeovers_total "
    << takeovers_
    << "\n"
       "# HELP payments_records_purged_total Expired idempotency records deleted.\n"
       "# TYPE payments_records_purged_total counter\n"
       "payments_records_purged_total "
    << purged_
    << "\n"
       "# HELP payments_request_duration_seconds Time to answer a request.\n"
       "# TYPE payments_request_duration_seconds histogram\n";
  for (std::size_t i = 0; i < bounds_.size(); ++i) {
    o << "payments_request_duration_seconds_bucket{le=\"" << bounds_[i] << "\"} " << buckets_[i]
      << "\n";
  }
  o << "payments_request_duration_seconds_bucket{le=\"+Inf\"} " << count_ << "\n"
    << "payments_request_duration_seconds_sum " << sum_ << "\n"
    << "payments_request_duration_seconds_count " << count_ << "\n";
  return o.str();
}

}  // namespace examples::payments_server
