// The payments server's payment: what POST /v1/payments carries, and how the
// request body (JSON or form-encoded) becomes one. Apart from main.cpp so
// that the fuzz target tests/fuzz/payment_form.cpp can link it.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "orpheus/beast/server.hpp"

namespace examples::payments_server {

struct payment {
  std::string id;
  std::int64_t amount = 0;
  std::string currency;
  std::string customer;
};
void to_json(nlohmann::json& j, const payment& p);
void from_json(const nlohmann::json& j, payment& p);

/// application/x-www-form-urlencoded decoding: '+' is a space, %XX a byte;
/// a '%' not followed by two hex digits is kept as it is.
[[nodiscard]] std::string url_decode(std::string_view s);

/// The request body as a payment (JSON or form-encoded; the id is left
/// empty). Throws orpheus::non_retryable_error (400 invalid_request) on
/// anything else.
[[nodiscard]] payment parse_payment(const orpheus::beast::http_request& req);

}  // namespace examples::payments_server
