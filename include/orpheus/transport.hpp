// How a call to another service can end without an answer. One vocabulary
// for every part that makes such calls: beast::http_client reports it
// (transport_error::kind), orpheus::client retries on it, and the payment
// wrapper turns it into an unknown outcome or a plain retry.
//
//   connect  nothing of the request was sent (no connection could be
//            opened): safe to send again as it is;
//   timeout  no complete answer before the deadline: in doubt once anything
//            may have been sent;
//   closed   the connection broke before a complete answer: in doubt.
//
// "In doubt" means the other side may have received the request and acted on
// it: only a retry with the same idempotency key is safe, and it must find
// out what happened rather than assume nothing did.
#pragma once

#include <string_view>

namespace orpheus {

enum class transport_failure {
  connect,  ///< nothing was sent
  timeout,  ///< no complete answer in time: in doubt
  closed,   ///< the connection broke before a complete answer: in doubt
};

/// False only for `connect`: the request may have reached the other side.
[[nodiscard]] constexpr bool may_have_arrived(transport_failure f) noexcept {
  return f != transport_failure::connect;
}

/// "connect", "timeout" or "closed", for logs and metrics labels.
[[nodiscard]] constexpr std::string_view to_string(transport_failure f) noexcept {
  switch (f) {
    case transport_failure::connect:
      return "connect";
    case transport_failure::timeout:
      return "timeout";
    case transport_failure::closed:
      return "closed";
  }
  return "closed";
}

}  // namespace orpheus
