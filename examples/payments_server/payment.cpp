#include "payment.hpp"

#include <algorithm>
#include <boost/beast/http.hpp>

#include "orpheus/detail/hex.hpp"
#include "orpheus/error.hpp"

namespace examples::payments_server {

namespace http = boost::beast::http;
using orpheus::beast::http_request;

void to_json(nlohmann::json& j, const payment& p) {
  j = {{"id", p.id}, {"amount", p.amount}, {"currency", p.currency}, {"customer", p.customer}};
}
void from_json(const nlohmann::json& j, payment& p) {
  j.at("id").get_to(p.id);
  j.at("amount").get_to(p.amount);
  j.at("currency").get_to(p.currency);
  j.at("customer").get_to(p.customer);
}

std::string url_decode(std::string_view s) {
  using orpheus::detail::hex_digit_value;
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+') {
      out += ' ';
    } else if (s[i] == '%' && i + 2 < s.size() && hex_digit_value(s[i + 1]) >= 0 &&
               hex_digit_value(s[i + 2]) >= 0) {
      out += static_cast<char>(hex_digit_value(s[i + 1]) * 16 + hex_digit_value(s[i + 2]));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

namespace {

[[noreturn]] void bad_request(const std::string& why) {
  throw orpheus::non_retryable_error("invalid_request", why, 400);
}

bool three_letters(const std::string& s) {
  return s.size() == 3 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z');
         });
}

// Whether JSON can carry `s`: json::dump() refuses bytes that are not UTF-8.
bool json_can_carry(const std::string& s) {
  try {
    (void)nlohmann::json(s).dump();
    return true;
  } catch (const nlohmann::json::type_error&) {
    return false;
  }
}

}  // namespace

// The request body as a payment (JSON or form-encoded); 400 otherwise.
payment parse_payment(const http_request& req) {
  nlohmann::json j;
  const std::string type(req[http::field::content_type]);
  if (type.rfind("application/x-www-form-urlencoded", 0) == 0) {
    std::string_view body = req.body();
    while (!body.empty()) {
      const auto amp = body.find('&');
      const auto field = body.substr(0, amp);
      body = amp == std::string_view::npos ? std::string_view{} : body.substr(amp + 1);
      const auto eq = field.find('=');
      if (eq == std::string_view::npos) bad_request("form field without '='");
      const std::string name = url_decode(field.substr(0, eq));
      // Issue 7, defect 2: "amount=100&...&amount=5" has no one meaning; the
      // last value used to win silently. Refused before anything is recorded.
      if (j.contains(name)) bad_request("form field '" + name + "' appears more than once");
      j[name] = url_decode(field.substr(eq + 1));
    }
    if (j.contains("amount") && j["amount"].is_string()) {
      const std::string a = j["amount"];
      if (a.empty() || a.size() > 15 || a.find_first_not_of("0123456789") != std::string::npos) {
        bad_request("amount must be a positive whole number of minor units");
      }
      j["amount"] = std::stoll(a);
    }
  } else if (type.rfind("application/json", 0) == 0) {
    j = nlohmann::json::parse(req.body(), nullptr, false);
    if (j.is_discarded() || !j.is_object()) bad_request("body is not a JSON object");
  } else {
    bad_request("Content-Type must be application/json or application/x-www-form-urlencoded");
  }
  payment p;
  if (!j.contains("amount") || !j["amount"].is_number_integer() ||
      j["amount"].get<std::int64_t>() <= 0) {
    bad_request("amount must be a positive whole number of minor units");
  }
  p.amount = j["amount"];
  // Issue 9 (fuzzing): a form's fields decode to any bytes. A currency was
  // any three ("%FF%FE%FD", "123"), and a customer that is not UTF-8 made
  // the 201 answer (JSON) fail after the bank had charged: the payment was
  // retried until its attempts ran out. Both are refused up front.
  if (!j.contains("currency") || !j["currency"].is_string() ||
      !three_letters(j["currency"].get<std::string>())) {
    bad_request("currency must be a three-letter code");
  }
  p.currency = j["currency"];
  if (!j.contains("customer") || !j["customer"].is_string() ||
      j["customer"].get<std::string>().empty() || j["customer"].get<std::string>().size() > 64) {
    bad_request("customer must be 1 to 64 characters");
  }
  p.customer = j["customer"];
  if (!json_can_carry(p.customer)) bad_request("customer must be UTF-8");
  return p;
}

}  // namespace examples::payments_server
