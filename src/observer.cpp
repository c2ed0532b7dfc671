#include "orpheus/observer.hpp"

namespace orpheus {

std::string_view to_string(request_outcome o) noexcept {
  switch (o) {
    case request_outcome::recorded:
      return "recorded";
    case request_outcome::replayed:
      return "replayed";
    case request_outcome::in_progress:
      return "in_progress";
    case request_outcome::mismatch:
      return "mismatch";
    case request_outcome::retry_later:
      return "retry_later";
    case request_outcome::lease_lost:
      return "lease_lost";
    case request_outcome::in_doubt:
      return "in_doubt";
    case request_outcome::storage_unavailable:
      return "storage_unavailable";
    case request_outcome::parked:
      return "parked";
    case request_outcome::refused:
      break;
  }
  return "refused";
}

std::string_view to_string(request_event e) noexcept {
  switch (e) {
    case request_event::new_key:
      return "new_key";
    case request_event::takeover:
      return "takeover";
    case request_event::retry:
      return "retry";
    case request_event::attempts_exhausted:
      return "attempts_exhausted";
    case request_event::parked:
      break;
  }
  return "parked";
}

std::string_view to_string(request_phase p) noexcept {
  switch (p) {
    case request_phase::read:
      return "read";
    case request_phase::acquire:
      return "acquire";
    case request_phase::rpc:
      return "rpc";
    case request_phase::record:
      break;
  }
  return "record";
}

request_outcome outcome_of(const error_info& e) noexcept {
  if (e.code == codes::in_progress) return request_outcome::in_progress;
  if (e.code == codes::fingerprint_mismatch) return request_outcome::mismatch;
  if (e.code == codes::request_parked) return request_outcome::parked;
  if (e.code == codes::lease_lost) return request_outcome::lease_lost;
  if (e.in_doubt()) return request_outcome::in_doubt;
  if (e.code == codes::storage_unavailable) return request_outcome::storage_unavailable;
  return e.retryable() ? request_outcome::retry_later : request_outcome::refused;
}

void observer::on_request(std::size_t /*shard*/, request_outcome /*outcome*/) noexcept {}
void observer::on_event(std::size_t /*shard*/, request_event /*event*/) noexcept {}
void observer::on_phase(std::size_t /*shard*/, request_phase /*phase*/,
                        std::chrono::nanoseconds /*took*/) noexcept {}

}  // namespace orpheus
