#include "orpheus/error.hpp"

#include <exception>

namespace orpheus {

error_info error_info::of(error_class c, std::string_view code, std::string message) {
  error_info e;
  e.kind = c;
  e.code = std::string(code);
  e.message = std::move(message);
  if (e.retryable()) e.retry_after = default_retry_after;
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
