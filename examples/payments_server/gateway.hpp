// The bank, as an orpheus::payment::gateway: the bank simulator over HTTP
// (--bank URL), or an in-process ledger (--bank inproc) for benchmarks.
// orpheus::payment::charge_once() does the rest (downstream key, status
// query first on retries, classification).
#pragma once

#include <chrono>
#include <cstddef>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>

#include "orpheus/beast/client.hpp"
#include "orpheus/payment/charge.hpp"

namespace examples::payments_server {

// The bank simulator's protocol: POST /charges, GET /charges/KEY.
//
// Every bank call goes through one http_client: kept-alive connections, at
// most one per worker (a worker makes one bank call at a time), instead of a
// new io_context, socket, epoll instance and timerfd per call (issue 8). A
// charge is never re-sent by the client once written (at_most_once): a lost
// answer is `reset`, and charge_once() asks the bank for the status. The
// status query is a read, so it may be re-sent (idempotent).
class bank_gateway final : public orpheus::payment::gateway {
 public:
  /// `deduplicates`: whether the bank answers a charge sent again under its
  /// key with the first one's outcome (orpheus::payment::gateway::
  /// deduplicates()).
  bank_gateway(orpheus::beast::http_endpoint bank, std::size_t connections, bool deduplicates);

  orpheus::payment::gateway_answer charge(const orpheus::payment::charge_request& r,
                                          const std::string& key,
                                          std::chrono::milliseconds timeout) override;
  orpheus::payment::gateway_answer status(const std::string& key,
                                          std::chrono::milliseconds timeout) override;
  [[nodiscard]] bool deduplicates() const noexcept override { return deduplicates_; }

  // The card payment in steps (the bank simulator's two-step API and its
  // ledger; create_payment.cpp). Each returns the id the bank answered
  // (authorisation, charge; "voided", "notified") or throws the classified
  // orpheus::error, as orpheus::payment::charge_id_of() classifies: a 404
  // "unknown authorisation", and a 409 "voided" to a capture or
  // "already_captured" to a void, are refusals for good; any other 404 or
  // 409 is in doubt.
  std::string authorise(const std::string& key, const orpheus::payment::charge_request& r,
                        std::chrono::milliseconds timeout);
  std::string capture(const std::string& key, const std::string& authorisation,
                      std::chrono::milliseconds timeout);
  std::string void_authorisation(const std::string& key, const std::string& authorisation,
                                 std::chrono::milliseconds timeout);
  std::string notify(const std::string& key, const std::string& reference,
                     const std::string& charge_id, std::chrono::milliseconds timeout);

 private:
  /// `refused`: the 409 error text that means the bank will never do this
  /// step ("" for none).
  std::string step(const std::string& target, const std::string& key, const nlohmann::json& body,
                   const char* id_field, std::string_view refused,
                   std::chrono::milliseconds timeout);
  orpheus::payment::gateway_answer call(orpheus::beast::http_request req,
                                        std::chrono::milliseconds timeout,
                                        orpheus::beast::delivery d);

  orpheus::beast::http_endpoint bank_;
  orpheus::beast::http_client http_;
  bool deduplicates_;
};

// The bank simulator's ledger without the HTTP: one charge per idempotency
// key, every later charge or status query with that key answers the first
// outcome, never a fault. Its maps grow with every key (about 150 bytes
// each): measure memory over long runs with the HTTP bank.
class inproc_bank final : public orpheus::payment::gateway {
 public:
  orpheus::payment::gateway_answer charge(const orpheus::payment::charge_request& r,
                                          const std::string& key,
                                          std::chrono::milliseconds) override;
  orpheus::payment::gateway_answer status(const std::string& key,
                                          std::chrono::milliseconds) override;

  /// The bank simulator's GET /ledger.
  [[nodiscard]] std::string ledger();

 private:
  std::mutex m_;
  std::unordered_map<std::string, std::string> by_key_;
  std::unordered_map<std::string, int> charged_refs_;
  long charges_ = 0;
};

}  // namespace examples::payments_server
