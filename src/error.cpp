#include "orpheus/error.hpp"

#include <exception>

namespace orpheus {

error_info classify(std::exception_ptr e, unclassified_policy policy) {
  const bool retry = policy == unclassified_policy::retryable;
  // The exception's text may name hosts, files or SQL: it is internal.
  auto unclassified = [&](std::string what) {
    return error_info{retry ? 503 : 500,
                      std::string(codes::unclassified),
                      "the request failed with an unexpected error",
                      retry,
                      false,
                      std::nullopt,
                      std::move(what)};
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
