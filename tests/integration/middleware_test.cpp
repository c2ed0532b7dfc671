// The Beast middleware without a network: key parsing, fingerprints, scope,
// and the bounded queue. Runs on a real SQLite file.
#include <gtest/gtest.h>

#include <boost/beast/http.hpp>
#include <future>
#include <latch>
#include <nlohmann/json.hpp>

#include "orpheus/beast/client.hpp"
#include "orpheus/beast/middleware.hpp"
#include "support/backends.hpp"

namespace orpheus::beast {
namespace {

namespace http = boost::beast::http;

class Middleware : public testing::Test {
 protected:
  void SetUp() override { store_ = test::make_store("sqlite"); }

  middleware make(work_pool& pool) {
    middleware_options o;
    o.scope = [](const http_request& r) -> std::optional<std::string> {
      if (r["X-Client-Id"].empty()) return std::nullopt;
      return std::string(r["X-Client-Id"]);
    };
    return middleware(*m_, pool, std::move(o));
  }

  static http_request post(const std::string& key, const std::string& body,
                           const std::string& type = "application/json") {
    http_request r{http::verb::post, "/v1/things", 11};
    r.set("X-Client-Id", "c1");
    if (!key.empty()) r.set("Idempotency-Key", key);
    r.set(http::field::content_type, type);
    r.body() = body;
    return r;
  }

  // Runs one request through the middleware and waits for the answer.
  http_response call(middleware& mw, http_request req, int* rpc_calls) {
    std::promise<http_response> answer;
    mw.handle(
        std::move(req), [&](http_response r) { answer.set_value(std::move(r)); },
        [](tx&, const http_request& r) { return std::string(r.body()); },
        [rpc_calls](const attempt&, const std::string& body) {
          ++*rpc_calls;
          return body;
        },
        [](tx&, const attempt&, const outcome<std::string>& o) {
          return response{201, {{"Content-Type", "text/plain"}}, o.value()};
        });
    return answer.get_future().get();
  }

  std::unique_ptr<store> store_;
  std::unique_ptr<manager> m_ = nullptr;
};

TEST_F(Middleware, AcceptsBareAndQuotedKeysAsTheSameKey) {
  m_ = std::make_unique<manager>(*store_);
  work_pool pool(2, 16);
  auto mw = make(pool);
  int rpc = 0;
  EXPECT_EQ(call(mw, post("abc-1", R"({"a":1})"), &rpc).result_int(), 201U);
  const auto quoted = call(mw, post(R"("abc-1")", R"({"a":1})"), &rpc);
  EXPECT_EQ(quoted["Idempotent-Replayed"], "true");
  const auto escaped = call(mw, post(R"("a\"b\\c")", R"({"a":1})"), &rpc);
  EXPECT_EQ(escaped.result_int(), 201U);
  EXPECT_EQ(escaped["Idempotency-Key"], R"(a"b\c)");
  EXPECT_EQ(rpc, 2);
  for (const auto* bad : {R"("unterminated)", R"("bad\escape")", R"("in"side")"}) {
    const auto r = call(mw, post(bad, "{}"), &rpc);
    EXPECT_EQ(r.result_int(), 400U) << bad;
    EXPECT_TRUE(r["Idempotency-Key"].empty()) << "an invalid key is never echoed";
  }
}

TEST_F(Middleware, FingerprintIgnoresJsonKeyOrderAndFormFieldOrder) {
  EXPECT_EQ(middleware::canonical_request(post("k", R"({"a":1,"b":[1,2]})"), {}),
            middleware::canonical_request(post("k", R"( { "b" : [1,2], "a" : 1 } )"), {}));
  EXPECT_NE(middleware::canonical_request(post("k", R"({"a":1})"), {}),
            middleware::canonical_request(post("k", R"({"a":2})"), {}));
  const auto form = "application/x-www-form-urlencoded";
  EXPECT_EQ(middleware::canonical_request(post("k", "a=1&b=2", form), {}),
            middleware::canonical_request(post("k", "b=2&a=1", form), {}));
  auto other_target = post("k", "{}");
  other_target.target("/v1/other");
  EXPECT_NE(middleware::canonical_request(post("k", "{}"), {}),
            middleware::canonical_request(other_target, {}));
  auto with_header = post("k", "{}");
  with_header.set("X-Currency", "EUR");
  EXPECT_NE(middleware::canonical_request(with_header, {"x-currency"}),
            middleware::canonical_request(post("k", "{}"), {"x-currency"}));
}

TEST_F(Middleware, NoCallerIdentityIs401AndRunsNothing) {
  m_ = std::make_unique<manager>(*store_);
  work_pool pool(1, 4);
  auto mw = make(pool);
  auto req = post("k", "{}");
  req.erase("X-Client-Id");
  int rpc = 0;
  EXPECT_EQ(call(mw, std::move(req), &rpc).result_int(), 401U);
  EXPECT_EQ(rpc, 0);
}

TEST_F(Middleware, AFullQueueAnswers503RetryableAtOnce) {
  m_ = std::make_unique<manager>(*store_);
  work_pool pool(1, 1);
  auto mw = make(pool);
  std::latch release(1);
  std::latch started(1);
  ASSERT_TRUE(pool.try_submit([&] {
    started.count_down();
    release.wait();  // the only worker is busy
  }));
  started.wait();
  ASSERT_TRUE(pool.try_submit([] {}));  // the queue (of 1) is now full
  int rpc = 0;
  const auto r = call(mw, post("k-full", "{}"), &rpc);
  release.count_down();
  EXPECT_EQ(r.result_int(), 503U);
  EXPECT_EQ(r[http::field::retry_after], "1");
  EXPECT_EQ(nlohmann::json::parse(r.body())["retryable"], true);
  EXPECT_EQ(rpc, 0);
  EXPECT_FALSE(store_->read({"c1", "k-full", std::string(64, '0')}));
}

TEST_F(Middleware, RecordOfKeepsStatusHeadersAndBody) {
  http_response res{http::status::accepted, 11};
  res.insert("Set-Cookie", "a=1");
  res.insert("Set-Cookie", "b=2");
  res.body() = std::string("\0bin", 4);
  res.prepare_payload();
  const auto r = record_of(res);
  EXPECT_EQ(r.status, 202);
  EXPECT_EQ(r.body, std::string("\0bin", 4));
  ASSERT_EQ(r.headers.size(), 2U);  // Content-Length is recomputed, not recorded
  EXPECT_EQ(r.headers[1].second, "b=2");
}

}  // namespace
}  // namespace orpheus::beast

namespace orpheus::beast {
namespace {

// A handler that throws on the io thread must not take the server down.
TEST(Server, AThrowingHandlerGets500AndTheServerCarriesOn) {
  std::atomic<int> calls{0};
  server s({}, [&](http_request&& req, responder respond) {
    if (calls++ == 0) throw std::runtime_error("bug in a handler");
    respond(make_response(200, std::string(req.target())));
  });
  s.start();
  const http_endpoint at{"127.0.0.1", s.port()};
  EXPECT_EQ(
      send(at, http_request{http::verb::get, "/first", 11}, std::chrono::seconds(5)).result_int(),
      500U);
  const auto second =
      send(at, http_request{http::verb::get, "/second", 11}, std::chrono::seconds(5));
  EXPECT_EQ(second.result_int(), 200U);
  EXPECT_EQ(second.body(), "/second");
}

TEST(Server, OnlyTheFirstAnswerIsWritten) {
  server s({}, [&](http_request&&, responder respond) {
    respond(make_response(201, "first"));
    respond(make_response(500, "second"));
    throw std::runtime_error("and then it throws");
  });
  s.start();
  const http_endpoint at{"127.0.0.1", s.port()};
  for (int i = 0; i < 2; ++i) {  // the connection stays in sync
    const auto r = send(at, http_request{http::verb::get, "/", 11}, std::chrono::seconds(5));
    EXPECT_EQ(r.result_int(), 201U);
    EXPECT_EQ(r.body(), "first");
  }
}

}  // namespace
}  // namespace orpheus::beast
