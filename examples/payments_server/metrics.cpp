#include "metrics.hpp"

#include <prometheus/counter.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

namespace examples::payments_server {
namespace {

constexpr const char* method_names[] = {"GET", "POST", "other"};
constexpr const char* outcome_names[] = {"1xx", "2xx", "3xx", "4xx", "5xx", "replayed", "conflict"};

}  // namespace

metrics::metrics(std::size_t shards)
    : registry_(std::make_unique<::prometheus::Registry>()),
      library_(std::make_shared<orpheus::prometheus::observer>(*registry_, shards)) {
  auto& requests = ::prometheus::BuildCounter()
                       .Name("payments_requests_total")
                       .Help("Requests answered, by method and outcome")
                       .Register(*registry_);
  for (std::size_t m = 0; m < methods; ++m) {
    for (std::size_t o = 0; o < outcomes; ++o) {
      requests_[m][o] = &requests.Add({{"method", method_names[m]}, {"outcome", outcome_names[o]}});
    }
  }
  duration_ = &::prometheus::BuildHistogram()
                   .Name("payments_request_duration_seconds")
                   .Help("Time to answer a request")
                   .Register(*registry_)
                   .Add({}, ::prometheus::Histogram::BucketBoundaries{0.001, 0.005, 0.01, 0.05, 0.1,
                                                                      0.5, 1, 5});
  purged_ = &::prometheus::BuildCounter()
                 .Name("payments_records_purged_total")
                 .Help("Expired idempotency records deleted")
                 .Register(*registry_)
                 .Add({});
}

metrics::~metrics() = default;

void metrics::observe(const orpheus::beast::http_request& req,
                      const orpheus::beast::http_response& res, std::chrono::microseconds took) {
  const auto method = req.method();
  const std::size_t m = method == boost::beast::http::verb::get    ? 0
                        : method == boost::beast::http::verb::post ? 1
                                                                   : 2;
  const unsigned status = res.result_int();
  std::size_t o = status >= 100 && status < 600 ? status / 100 - 1 : 4;  // odd ones as 5xx
  if (status == 409) o = 6;
  if (res.find("Idempotent-Replayed") != res.end()) o = 5;
  requests_[m][o]->Increment();
  duration_->Observe(std::chrono::duration<double>(took).count());
}

void metrics::purged(std::size_t n) { purged_->Increment(static_cast<double>(n)); }

std::string metrics::text() const { return orpheus::prometheus::text_of(*registry_); }

}  // namespace examples::payments_server
