#include "gateway.hpp"

#include <boost/beast/http/field.hpp>
#include <boost/beast/http/verb.hpp>
#include <nlohmann/json.hpp>
#include <utility>

#include "orpheus/log.hpp"

namespace examples::payments_server {

namespace http = boost::beast::http;
using orpheus::beast::http_request;
using orpheus::beast::http_response;
using orpheus::payment::gateway_answer;
using orpheus::payment::gateway_status;

// ---- the bank simulator, over HTTP -----------------------------------------

bank_gateway::bank_gateway(orpheus::beast::http_endpoint bank, std::size_t connections,
                           bool deduplicates)
    : bank_(std::move(bank)),
      http_(orpheus::beast::http_client_options{.max_connections_per_endpoint = connections}),
      deduplicates_(deduplicates) {}

gateway_answer bank_gateway::charge(const orpheus::payment::charge_request& r,
                                    const std::string& key, std::chrono::milliseconds timeout) {
  http_request req{http::verb::post, "/charges", 11};
  req.set("Idempotency-Key", key);
  req.set(http::field::content_type, "application/json");
  req.body() =
      nlohmann::json{{"amount", r.amount}, {"currency", r.currency}, {"reference", r.reference}}
          .dump();
  return call(std::move(req), timeout, orpheus::beast::delivery::at_most_once);
}

gateway_answer bank_gateway::status(const std::string& key, std::chrono::milliseconds timeout) {
  return call(http_request{http::verb::get, "/charges/" + key, 11}, timeout,
              orpheus::beast::delivery::idempotent);
}

gateway_answer bank_gateway::call(http_request req, std::chrono::milliseconds timeout,
                                  orpheus::beast::delivery d) {
  http_response res;
  try {
    res = http_.send(bank_, std::move(req), timeout, d);
  } catch (const orpheus::beast::transport_error& e) {
    // The detail reaches the client's answer: a fixed text, never what()
    // with the bank's host and port (issue 7, defect 13). what() is logged.
    orpheus::log(orpheus::log_level::warning, std::string("payments_server: bank: ") + e.what());
    using orpheus::transport_failure;
    const transport_failure f = e.error_kind();
    return {orpheus::payment::status_of_transport(f), "",
            f == transport_failure::connect   ? "no connection to the bank"
            : f == transport_failure::timeout ? "the bank did not answer in time"
                                              : "the connection to the bank broke"};
  }
  const unsigned status = res.result_int();
  const auto body = nlohmann::json::parse(res.body(), nullptr, false);
  // A member that is missing or not a string reads as "": a bank answer
  // of another shape must not throw out of the gateway (issue 7.14).
  auto text = [&](const char* name) -> std::string {
    if (!body.is_object()) return "";
    const auto it = body.find(name);
    return it != body.end() && it->is_string() ? it->get<std::string>() : "";
  };
  const std::string detail = "bank answered " + std::to_string(status);
  // "No charge under this key" only in the bank's own words: the bank
  // answers an unknown key 404 {"status":"unknown"}. A bare 404 may come
  // from a proxy, a load balancer or a bank mid-deploy that never looked,
  // and with a bank that charges a key again, not_found makes the retry
  // charge a second time (found in review). Unknown instead: in doubt.
  if (status == 404) {
    if (text("status") == "unknown") return {gateway_status::not_found, "", detail};
    return {gateway_status::server_error, "", detail + " without saying the key is unknown"};
  }
  if (text("status") == "charged") return {gateway_status::charged, text("charge_id"), detail};
  // A decline, too, only in the bank's own words (402 {"status":"declined"}).
  // A bare 402 may come from a proxy or a gateway's quota page that never
  // asked the bank; taken as a decline, a status query on a retry recorded
  // a charge that had gone through as a final card_declined (found in
  // review). Unknown instead: in doubt.
  if (text("status") == "declined") return {gateway_status::declined, "", detail};
  if (status == 402) {
    return {gateway_status::server_error, "", detail + " without saying the card was declined"};
  }
  // Everything else through the wrapper's one mapping: a 409 (the charge is
  // still running there) or a 429 is not a refusal (issue 7.5). A 2xx that
  // says neither charged nor declined carries no charge id: unknown.
  const auto mapped = orpheus::payment::status_of_http(status);
  return {mapped == gateway_status::charged ? gateway_status::server_error : mapped, "", detail};
}

std::string bank_gateway::authorise(const std::string& key,
                                    const orpheus::payment::charge_request& r,
                                    std::chrono::milliseconds timeout) {
  return step("/authorisations", key,
              {{"amount", r.amount}, {"currency", r.currency}, {"reference", r.reference}},
              "authorisation_id", "", timeout);
}

std::string bank_gateway::capture(const std::string& key, const std::string& authorisation,
                                  std::chrono::milliseconds timeout) {
  return step("/authorisations/" + authorisation + "/capture", key, nlohmann::json::object(),
              "charge_id", "voided", timeout);
}

std::string bank_gateway::void_authorisation(const std::string& key,
                                             const std::string& authorisation,
                                             std::chrono::milliseconds timeout) {
  return step("/authorisations/" + authorisation + "/void", key, nlohmann::json::object(), "status",
              "already_captured", timeout);
}

std::string bank_gateway::notify(const std::string& key, const std::string& reference,
                                 const std::string& charge_id, std::chrono::milliseconds timeout) {
  return step("/ledger/notifications", key, {{"reference", reference}, {"charge_id", charge_id}},
              "status", "", timeout);
}

std::string bank_gateway::step(const std::string& target, const std::string& key,
                               const nlohmann::json& body, const char* id_field,
                               std::string_view refused, std::chrono::milliseconds timeout) {
  http_request req{http::verb::post, target, 11};
  req.set("Idempotency-Key", key);
  req.set(http::field::content_type, "application/json");
  req.body() = body.dump();
  gateway_answer answer;
  try {
    // Never re-sent once written: a lost answer is an unknown outcome, and
    // the step's retry (same key) asks again.
    const http_response res =
        http_.send(bank_, std::move(req), timeout, orpheus::beast::delivery::at_most_once);
    const unsigned status = res.result_int();
    const auto j = nlohmann::json::parse(res.body(), nullptr, false);
    const auto text = [&](const char* name) -> std::string {
      if (!j.is_object()) return "";
      const auto it = j.find(name);
      return it != j.end() && it->is_string() ? it->get<std::string>() : "";
    };
    answer.detail = "bank answered " + std::to_string(status) + " to " + target;
    if (status >= 200 && status < 300 && !text(id_field).empty()) {
      answer = {gateway_status::charged, text(id_field), answer.detail};
    } else if (status == 402) {
      // Declined in the bank's words only, as in call().
      answer.status =
          text("status") == "declined" ? gateway_status::declined : gateway_status::server_error;
    } else if ((status == 404 && text("error") == "unknown authorisation") ||
               (status == 409 && !refused.empty() && text("error") == refused)) {
      // An unknown authorisation, or one voided (for a capture) or captured
      // (for a void): the bank will never do it. Only this step's own
      // refusal (found in review: a capture answered "already_captured",
      // the money taken, was a refusal too, and the payment turned back to
      // a void that could only fail). Any other 409 (a request with this
      // key still running there) is not a refusal, nor is a 404 without the
      // bank's words (a proxy's, or a bank mid-deploy's: found in review,
      // it turned a capture back into a void and a final failure): below,
      // unknown.
      answer.status = gateway_status::invalid;
      answer.detail += " (" + text("error") + ")";
    } else {
      const auto mapped = orpheus::payment::status_of_http(status);
      answer.status = mapped == gateway_status::charged ? gateway_status::server_error : mapped;
    }
  } catch (const orpheus::beast::transport_error& e) {
    orpheus::log(orpheus::log_level::warning, std::string("payments_server: bank: ") + e.what());
    answer = {orpheus::payment::status_of_transport(e.error_kind()), "",
              "no answer from the bank to " + target};
  }
  return orpheus::payment::charge_id_of(answer);
}

// ---- the in-process bank (--bank inproc) -----------------------------------

gateway_answer inproc_bank::charge(const orpheus::payment::charge_request& r,
                                   const std::string& key, std::chrono::milliseconds) {
  std::lock_guard lock(m_);
  auto [it, fresh] = by_key_.try_emplace(key);
  if (fresh) {
    it->second = "ch_" + std::to_string(++charges_);
    ++charged_refs_[r.reference];
  }
  return {gateway_status::charged, it->second, "charged in-process"};
}

gateway_answer inproc_bank::status(const std::string& key, std::chrono::milliseconds) {
  std::lock_guard lock(m_);
  const auto it = by_key_.find(key);
  if (it == by_key_.end()) return {gateway_status::not_found, "", "unknown"};
  return {gateway_status::charged, it->second, "charged in-process"};
}

std::string inproc_bank::ledger() {
  std::lock_guard lock(m_);
  int doubles = 0;
  for (const auto& [ref, n] : charged_refs_) doubles += n > 1 ? 1 : 0;
  return nlohmann::json{{"charges", charges_},
                        {"keys", by_key_.size()},
                        {"references", charged_refs_.size()},
                        {"double_charges", doubles}}
      .dump();
}

}  // namespace examples::payments_server
