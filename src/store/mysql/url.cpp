// "mysql://user:password@host:port[,host:port...]/database", parsed once, here.
#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <charconv>

#include "orpheus/detail/ascii.hpp"
#include "orpheus/store/mysql.hpp"

namespace orpheus {

mysql_shard parse_mysql_url(std::string_view url) {
  constexpr std::string_view scheme = "mysql://";
  auto bad = [&](const char* why) {
    return config_error(std::string("bad MySQL URL (") + why +
                        "); expected mysql://user:password@host:port/database");
  };
  if (url.substr(0, scheme.size()) != scheme) throw bad("scheme");
  // Found in review: a space, a query ("?ssl-mode=REQUIRED") or a second URL
  // glued on became part of the password or the database's name, and the
  // server then waited for ever on a refusal it took for an outage.
  if (std::any_of(url.begin(), url.end(), [](unsigned char c) { return c < ' ' || c == 0x7f; })) {
    throw bad("a control character");
  }
  url.remove_prefix(scheme.size());
  const auto at = url.rfind('@');
  if (at == std::string_view::npos) throw bad("no user");
  const auto creds = url.substr(0, at);
  url.remove_prefix(at + 1);
  mysql_shard s;
  const auto colon = creds.find(':');
  s.user = std::string(creds.substr(0, colon));
  if (colon != std::string_view::npos) s.password = std::string(creds.substr(colon + 1));
  const auto slash = url.find('/');
  if (slash == std::string_view::npos) throw bad("no database");
  std::string_view hosts = url.substr(0, slash);
  s.database = std::string(url.substr(slash + 1));
  if (s.database.find_first_of("/?#,@ ") != std::string::npos) {
    throw bad("the database name has '/', '?', '#', ',', '@' or a space: no parameters are read");
  }
  // host[:port], or several separated by commas: the nodes of one shard.
  const auto host_of = [&](std::string_view hostport) {
    mysql_host h;
    if (hostport.empty()) throw bad("empty part");
    // The port's colon: after the ']' of a bracketed IPv6 address (found in
    // review: "[::1]" without a port was split at its last colon), else the
    // last one.
    auto pc = hostport.rfind(':');
    if (hostport.front() == '[') {
      const auto close = hostport.find(']');
      if (close == std::string_view::npos) throw bad("an IPv6 address without its ']'");
      pc = close + 1 == hostport.size() ? std::string_view::npos : close + 1;
      if (pc != std::string_view::npos && hostport[pc] != ':') throw bad("junk after ']'");
    }
    h.host = std::string(hostport.substr(0, pc));
    if (pc != std::string_view::npos) {
      const auto p = hostport.substr(pc + 1);
      int port = 0;
      const auto [ptr, ec] = std::from_chars(p.data(), p.data() + p.size(), port);
      if (ec != std::errc{} || ptr != p.data() + p.size() || port <= 0 || port > 65535) {
        throw bad("port");
      }
      h.port = port;
    }
    if (h.host.empty()) throw bad("empty part");
    // A name or an IPv4 address, or an IPv6 one in brackets, as inet_pton
    // reads it, with a zone after '%' ("[fe80::1%eth0]"); a name or an IPv4
    // address in brackets is taken too, as the connector takes it. Found in
    // review: anything in brackets was taken, "[]" and "[db 1]" too, and
    // failed only at connect, as an outage, retried for ever.
    const auto name_like = [](std::string_view n) {
      return !n.empty() && std::all_of(n.begin(), n.end(), [](char c) {
        return detail::is_ascii_alnum(c) || c == '.' || c == '-' || c == '_';
      });
    };
    if (h.host.front() == '[') {
      const std::string inner = h.host.substr(1, h.host.size() - 2);
      const auto zone = inner.find('%');
      const std::string address = inner.substr(0, zone);
      in6_addr ignored{};
      const bool ipv6 = inet_pton(AF_INET6, address.c_str(), &ignored) == 1 &&
                        (zone == std::string::npos || name_like(inner.substr(zone + 1)));
      if (!ipv6 && !name_like(inner)) throw bad("not an address or a name in brackets");
    } else if (!name_like(h.host)) {
      throw bad("a host is not a name or an address");
    }
    return h;
  };
  for (bool first = true;; first = false) {
    const auto comma = hosts.find(',');
    mysql_host h = host_of(hosts.substr(0, comma));
    if (first) {
      s.host = std::move(h.host);
      s.port = h.port;
    } else {
      s.failover.push_back(std::move(h));
    }
    if (comma == std::string_view::npos) break;
    hosts.remove_prefix(comma + 1);
  }
  if (s.user.empty() || s.database.empty()) throw bad("empty part");
  return s;
}

}  // namespace orpheus
