// URL parsing: beast::parse_http_url() (the bank, the payments server, the
// client's server) and parse_mysql_url() (the shards).
//
// Input: a URL; both parsers read it.
//
// Properties:
//  - bad input throws the documented exception (std::invalid_argument,
//    config_error), nothing else;
//  - an accepted URL has every part the store and the client need (a host, a
//    port in 1..65535, a MySQL user and database), and its parts, written out
//    again as a URL, parse to the same parts.
#include <stdexcept>

#include "fuzz_support.hpp"
#include "orpheus/beast/client.hpp"
#include "orpheus/error.hpp"
#include "orpheus/store/mysql.hpp"

namespace {

using orpheus::fuzz::shown;

bool same(const orpheus::mysql_shard& a, const orpheus::mysql_shard& b) {
  bool nodes = a.failover.size() == b.failover.size();
  for (std::size_t i = 0; nodes && i < a.failover.size(); ++i) {
    nodes = a.failover[i].host == b.failover[i].host && a.failover[i].port == b.failover[i].port;
  }
  return a.host == b.host && a.port == b.port && a.user == b.user && a.password == b.password &&
         a.database == b.database && nodes;
}

void check_http(std::string_view url) {
  orpheus::beast::http_endpoint ep;
  try {
    ep = orpheus::beast::parse_http_url(url);
  } catch (const std::invalid_argument&) {
    return;
  }
  FUZZ_CHECK(!ep.host.empty() && ep.port != 0, shown(url));
  FUZZ_CHECK(ep.host.find('/') == std::string::npos, shown(url) + " -> host " + shown(ep.host));
  const std::string again = "http://" + ep.host + ":" + std::to_string(ep.port) + "/";
  orpheus::beast::http_endpoint ep2;
  try {
    ep2 = orpheus::beast::parse_http_url(again);
  } catch (const std::invalid_argument& e) {
    FUZZ_CHECK(false, shown(url) + " -> " + shown(again) + " refused: " + e.what());
  }
  FUZZ_CHECK(ep2.host == ep.host && ep2.port == ep.port, shown(url) + " -> " + shown(again));
}

void check_mysql(std::string_view url) {
  orpheus::mysql_shard s;
  try {
    s = orpheus::parse_mysql_url(url);
  } catch (const orpheus::config_error&) {
    return;
  }
  FUZZ_CHECK(!s.user.empty() && !s.host.empty() && !s.database.empty(), shown(url));
  FUZZ_CHECK(s.port > 0 && s.port <= 65535, shown(url));
  std::string again = "mysql://" + s.user;
  if (!s.password.empty()) again += ":" + s.password;
  again += "@" + s.host + ":" + std::to_string(s.port);
  for (const auto& node : s.failover) {  // the other nodes of the shard (Galera)
    FUZZ_CHECK(!node.host.empty() && node.port > 0 && node.port <= 65535, shown(url));
    again += "," + node.host + ":" + std::to_string(node.port);
  }
  again += "/" + s.database;
  orpheus::mysql_shard s2;
  try {
    s2 = orpheus::parse_mysql_url(again);
  } catch (const orpheus::config_error& e) {
    FUZZ_CHECK(false, shown(url) + " -> " + shown(again) + " refused: " + e.what());
  }
  FUZZ_CHECK(same(s, s2), shown(url) + " -> " + shown(again));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view url = orpheus::fuzz::text_of(data, size);
  check_http(url);
  check_mysql(url);
  return 0;
}
