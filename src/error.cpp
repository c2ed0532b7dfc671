#include "orpheus/error.hpp"

#include <exception>

namespace orpheus {

error_info error_info::of(error_class c, std::string_view code, std::string message) {
  error_info e;
  e.code = std::string(code);
  e.message = std::move(message);
  e.retryable = orpheus::retryable(c);
  e.in_doubt = c == error_class::in_doubt;
  if (e.retryable) e.retry_after = std::chrono::milliseconds(1000);
  switch (c) {
    case error_class::invalid_input:
      e.http_status = 400;
      break;
    case error_class::conflict:
      e.http_status = 409;
      break;
    case error_class::unavailable:
    case error_class::in_doubt:
      e.http_status = 503;
      break;
    case error_class::rejected:
      e.http_status = 422;
      break;
    case error_class::internal:
      e.http_status = 500;
      break;
  }
  return e;
}

error_info classify(std::exception_ptr e, unclassified_policy policy) {
  const bool retry = policy == unclassified_policy::retryable;
  // The exception's text may name hosts, files or SQL: it is internal.
  auto unclassified = [&](std::string what) {
    return error_info::of(retry ? error_class::unavailable : error_class::internal,
                          codes::unclassified, "the request failed with an unexpected error")
        .with_retry_after(std::nullopt)
        .with_internal(std::move(what));
  };
  try {
    std::rethrow_exception(std::move(e));
  } catch (const error& err) {
    return err.info();
  } catch (const std::exception& ex) {
    return unclassified(ex.what());
  } catch (...) {
    return unclassified("unknown exception");
  }
}

}  // namespace orpheus
