#include <utility>  // before Asio: Boost 1.74's awaitable.hpp needs std::exchange

#include "orpheus/beast/client.hpp"

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <charconv>

namespace orpheus::beast {

namespace net = boost::asio;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;

http_endpoint parse_http_url(std::string_view url) {
  constexpr std::string_view scheme = "http://";
  if (url.substr(0, scheme.size()) != scheme) {
    throw std::invalid_argument("expected http://host:port, got " + std::string(url));
  }
  url.remove_prefix(scheme.size());
  url = url.substr(0, url.find('/'));
  const auto colon = url.rfind(':');
  http_endpoint ep;
  ep.host = std::string(url.substr(0, colon));
  if (colon != std::string_view::npos) {
    const auto p = url.substr(colon + 1);
    unsigned port = 0;
    const auto [ptr, ec] = std::from_chars(p.data(), p.data() + p.size(), port);
    if (ec != std::errc{} || ptr != p.data() + p.size() || port == 0 || port > 65535) {
      throw std::invalid_argument("bad port in " + std::string(url));
    }
    ep.port = static_cast<unsigned short>(port);
  }
  if (ep.host.empty()) throw std::invalid_argument("no host in URL");
  return ep;
}

http_response send(const http_endpoint& to, http_request req, std::chrono::milliseconds timeout) {
  net::io_context ioc;
  boost::beast::tcp_stream stream(ioc);
  boost::beast::flat_buffer buffer;
  http_response res;
  boost::beast::error_code result;
  bool connected = false;
  req.set(http::field::host, to.host + ":" + std::to_string(to.port));
  req.prepare_payload();

  stream.expires_after(timeout);  // one deadline for the whole exchange
  tcp::resolver resolver(ioc);
  boost::beast::error_code ec;
  const auto endpoints = resolver.resolve(to.host, std::to_string(to.port), ec);
  if (ec)
    throw transport_error(transport_error::kind::connect,
                          "resolve " + to.host + ": " + ec.message());
  stream.async_connect(endpoints, [&](boost::beast::error_code e, const tcp::endpoint&) {
    if (e) {
      result = e;
      return;
    }
    connected = true;
    http::async_write(stream, req, [&](boost::beast::error_code we, std::size_t) {
      if (we) {
        result = we;
        return;
      }
      http::async_read(stream, buffer, res,
                       [&](boost::beast::error_code re, std::size_t) { result = re; });
    });
  });
  ioc.run();
  if (!result) return res;
  const std::string what =
      "http://" + to.host + ":" + std::to_string(to.port) + ": " + result.message();
  if (result == boost::beast::error::timeout)
    throw transport_error(transport_error::kind::timeout, what);
  if (!connected) throw transport_error(transport_error::kind::connect, what);
  throw transport_error(transport_error::kind::closed, what);
}

}  // namespace orpheus::beast
