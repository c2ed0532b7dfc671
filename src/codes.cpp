#include "orpheus/codes.hpp"

#include <algorithm>
#include <array>

namespace orpheus {

namespace {

using enum error_class;

constexpr std::array registry{
    code_info{codes::invalid_key, invalid_input, "core"},
    code_info{codes::invalid_scope, invalid_input, "core"},
    code_info{codes::invalid_fingerprint, invalid_input, "core"},
    code_info{codes::missing_key, invalid_input, "core"},
    code_info{codes::invalid_request, invalid_input, "core"},
    code_info{codes::unauthenticated, invalid_input, "core"},
    code_info{codes::invalid_config, internal, "core"},
    code_info{codes::fingerprint_mismatch, invalid_input, "core"},
    code_info{codes::in_progress, conflict, "core"},
    code_info{codes::lease_lost, conflict, "core"},
    code_info{codes::storage_unavailable, unavailable, "core"},
    code_info{codes::commit_in_doubt, in_doubt, "core"},
    code_info{codes::attempts_exhausted, internal, "core"},
    code_info{codes::retry_window_exhausted, internal, "core"},
    code_info{codes::request_parked, unavailable, "core"},
    code_info{codes::handler_unknown, internal, "core"},
    code_info{codes::step_failed_after_pivot, unavailable, "core"},
    code_info{codes::compensation_failed, internal, "core"},
    code_info{codes::request_cancelled, rejected, "core"},
    code_info{codes::unclassified, internal, "core"},
    code_info{codes::post_rpc_failed, unavailable, "core"},
    code_info{codes::storage_error, internal, "core"},
    code_info{codes::nested_transaction, internal, "core"},
    code_info{codes::pre_state_unreadable, unavailable, "core"},
    code_info{codes::deadline_exceeded, unavailable, "core"},
    code_info{codes::no_randomness, unavailable, "core"},
    code_info{codes::overloaded, unavailable, "beast"},
    code_info{codes::server_stopping, unavailable, "beast"},
    code_info{codes::downstream_throttled, unavailable, "beast"},
    code_info{codes::downstream_failed, in_doubt, "beast"},
    code_info{codes::downstream_in_progress, in_doubt, "beast"},
    code_info{codes::downstream_unreachable, unavailable, "beast"},
    code_info{codes::downstream_timeout, in_doubt, "beast"},
    code_info{codes::downstream_closed, in_doubt, "beast"},
    code_info{codes::reply_unreadable, unavailable, "grpc"},
    code_info{codes::card_declined, rejected, "payment"},
    code_info{codes::invalid_payment, rejected, "payment"},
    code_info{codes::gateway_unreachable, unavailable, "payment"},
    code_info{codes::gateway_throttled, unavailable, "payment"},
    code_info{codes::gateway_unauthorized, in_doubt, "payment"},
    code_info{codes::gateway_in_progress, in_doubt, "payment"},
    code_info{codes::gateway_timeout, in_doubt, "payment"},
    code_info{codes::gateway_error, in_doubt, "payment"},
    code_info{codes::charge_status_unknown, in_doubt, "payment"},
    code_info{codes::earlier_charge_may_land, unavailable, "payment"},
};

}  // namespace

std::string_view to_string(error_class c) noexcept {
  switch (c) {
    case invalid_input:
      return "invalid_input";
    case conflict:
      return "conflict";
    case unavailable:
      return "unavailable";
    case in_doubt:
      return "in_doubt";
    case rejected:
      return "rejected";
    case internal:
      return "internal";
  }
  return "internal";
}

std::span<const code_info> known_codes() noexcept { return registry; }

const code_info* find_code(std::string_view code) noexcept {
  const auto it =
      std::find_if(registry.begin(), registry.end(), [&](const auto& c) { return c.code == code; });
  return it == registry.end() ? nullptr : &*it;
}

}  // namespace orpheus
