// The payments server's request parser (examples/payments_server/payment.cpp).
//
// Input: "<Content-Type>\n<body>"; an input without a newline is a
// form-encoded body.
//
// Properties:
//  - bad input is a 400 invalid_request (orpheus::non_retryable_error),
//    never another exception;
//  - an accepted payment is one the server can charge and record: amount > 0,
//    a three-letter currency, a customer of 1 to 64 bytes, and it can be
//    written as JSON (the bank request and the 201 answer are JSON: a value
//    json::dump() refuses would fail after the bank has charged);
//  - it is what the body says: a form's amount, currency and customer are
//    its fields, decoded, each sent once; a JSON body's are its members;
//  - the body and its canonical form (what the middleware fingerprints) are
//    the same payment: both accepted as equal payments, or both refused.
#include <boost/beast/http.hpp>
#include <map>
#include <nlohmann/json.hpp>

#include "../../examples/payments_server/payment.hpp"
#include "fuzz_support.hpp"
#include "orpheus/beast/middleware.hpp"
#include "orpheus/error.hpp"
#include "orpheus/problem.hpp"

namespace {

namespace http = boost::beast::http;
using examples::payments_server::payment;
using orpheus::fuzz::as;
using orpheus::fuzz::shown;

bool operator==(const payment& a, const payment& b) {
  return a.id == b.id && a.amount == b.amount && a.currency == b.currency &&
         a.customer == b.customer;
}

std::optional<payment> parsed(std::string_view type, std::string_view body) {
  orpheus::beast::http_request req{http::verb::post, "/v1/payments", 11};
  if (!type.empty()) req.set(http::field::content_type, as<boost::beast::string_view>(type));
  req.body() = std::string(body);
  try {
    return examples::payments_server::parse_payment(req);
  } catch (const orpheus::non_retryable_error& e) {
    FUZZ_CHECK(orpheus::http_status_of(e.info()) == 400 && e.code() == "invalid_request", e.what());
    return std::nullopt;
  }
}

// The body the middleware fingerprints for `body` (its canonical form), when
// that form is a body again (a JSON text or a form), else nullopt.
std::optional<std::string> canonical_body(std::string_view type, std::string_view body) {
  orpheus::beast::http_request req{http::verb::post, "/v1/payments", 11};
  if (!type.empty()) req.set(http::field::content_type, as<boost::beast::string_view>(type));
  req.body() = std::string(body);
  const std::string all = orpheus::beast::middleware::canonical_request(req, {}, 64);
  const std::string c = all.substr(all.find("\n\n") + 2);
  if (c.rfind("json:", 0) == 0 || c.rfind("form:", 0) == 0) return c.substr(5);
  return std::nullopt;
}

bool is_letter(char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); }

void check_accepted(const payment& p, std::string_view type, std::string_view body) {
  const std::string what = shown(type) + " / " + shown(body);
  FUZZ_CHECK(p.amount > 0, what);
  FUZZ_CHECK(p.currency.size() == 3 && is_letter(p.currency[0]) && is_letter(p.currency[1]) &&
                 is_letter(p.currency[2]),
             "currency " + shown(p.currency) + " from " + what);
  FUZZ_CHECK(!p.customer.empty() && p.customer.size() <= 64, what);
  FUZZ_CHECK(p.id.empty(), what);
  std::string json;
  try {
    json = nlohmann::json(p).dump();
  } catch (const nlohmann::json::type_error& e) {
    FUZZ_CHECK(false,
               "accepted a payment JSON cannot carry (" + std::string(e.what()) + "): " + what);
  }
  FUZZ_CHECK(nlohmann::json::parse(json).get<payment>() == p, "JSON round trip: " + what);
  if (std::string_view(type).rfind("application/json", 0) == 0) {
    const auto j = nlohmann::json::parse(body);  // it was accepted: an object
    FUZZ_CHECK(j.at("amount") == p.amount && j.at("currency") == p.currency &&
                   j.at("customer") == p.customer,
               what);
    return;
  }
  // A form: each field once, decoded.
  std::map<std::string, std::vector<std::string>> fields;
  std::string_view rest = body;
  while (!rest.empty()) {
    const auto amp = rest.find('&');
    const auto field = rest.substr(0, amp);
    rest = amp == std::string_view::npos ? std::string_view{} : rest.substr(amp + 1);
    const auto eq = field.find('=');
    fields[examples::payments_server::url_decode(field.substr(0, eq))].push_back(
        examples::payments_server::url_decode(field.substr(eq + 1)));
  }
  for (const auto* name : {"amount", "currency", "customer"}) {
    FUZZ_CHECK(fields[name].size() == 1, std::string(name) + " not sent once: " + what);
  }
  FUZZ_CHECK(std::stoll(fields["amount"][0]) == p.amount, what);
  FUZZ_CHECK(fields["currency"][0] == p.currency && fields["customer"][0] == p.customer, what);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto parts = orpheus::fuzz::split(orpheus::fuzz::text_of(data, size), "\n", 2);
  std::string_view type =
      parts.size() == 2 ? parts[0] : std::string_view("application/x-www-form-urlencoded");
  // Beast drops the white space around a field value, as any HTTP parser does.
  while (!type.empty() && (type.front() == ' ' || type.front() == '\t')) type.remove_prefix(1);
  while (!type.empty() && (type.back() == ' ' || type.back() == '\t')) type.remove_suffix(1);
  const std::string_view body = parts.back();
  const auto p = parsed(type, body);
  if (p) check_accepted(*p, type, body);
  if (const auto canonical = canonical_body(type, body)) {
    const auto q = parsed(type, *canonical);
    FUZZ_CHECK(
        p.has_value() == q.has_value() && (!p || *p == *q),
        shown(body) + " and its canonical form " + shown(*canonical) + " are different payments");
  }
  return 0;
}
