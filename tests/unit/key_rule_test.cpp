// One key rule (issue 10, point 10): the core's invalid_key_reason() is what
// validate(), the Beast middleware and the client helper apply, so a key the
// client accepts is exactly a key the server accepts, and it reaches the
// server as itself. Also the one hex encoding and the validate() contract of
// the client's retry_policy.
#include <gtest/gtest.h>

#include <boost/beast/http.hpp>
#include <filesystem>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "orpheus/beast/middleware.hpp"
#include "orpheus/client/client.hpp"
#include "orpheus/detail/hex.hpp"
#include "orpheus/manager.hpp"
#include "orpheus/request.hpp"
#include "orpheus/store/sqlite.hpp"
#include "orpheus/work_pool.hpp"

namespace orpheus {
namespace {

namespace http = boost::beast::http;
using beast::http_request;
using beast::http_response;

struct key_case {
  std::string name;
  std::string key;
  bool valid;
};

std::vector<key_case> key_table() {
  return {
      {"empty", "", false},
      {"one byte", "k", true},
      {"uuid", "0b6f2c5e-8c1a-4d7e-9a3b-2f4e6d8c0a1b", true},
      {"maximum length", std::string(max_key_bytes, 'k'), true},
      {"one byte too long", std::string(max_key_bytes + 1, 'k'), false},
      {"leading space", " k", false},
      {"trailing space", "k ", false},
      {"only a space", " ", false},
      {"inner space", "a b", true},
      {"tab", "tab\there", false},
      {"leading tab", "\tk", false},
      {"CR LF", "k\r\nX-Evil: 1", false},
      {"NUL", std::string("a\0b", 3), false},
      {"DEL", "k\x7F", false},
      {"non-ASCII (UTF-8)", "caf\xC3\xA9", false},
      {"Latin-1 byte", "caf\xE9", false},
      {"quoted", "\"k\"", true},
      {"leading quote", "\"k", true},
      {"only a quote", "\"", true},
      {"inner quote and backslash", "a\"b\\c", true},
      {"leading quote and backslash", "\"a\\b", true},
      {"maximum length, quoted on the wire", "\"" + std::string(max_key_bytes - 1, '\\'), true},
      {"punctuation", "~!@#$%^&*()_+{}|:<>?`-=[];',./", true},
      {"comma, quoted on the wire", "a,b", true},
      {"comma and space", "k1, k1", true},
  };
}

// A middleware whose store is never used: identify() reads only the request.
class key_rule : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("orpheus-key-rule-" + random_token(8));
    std::filesystem::create_directories(dir_);
    store_ = std::make_unique<sqlite_store>(sqlite_options{(dir_ / "orpheus.db").string()});
    manager_ = std::make_unique<manager>(*store_);
    beast::middleware_options o;
    o.scope = [](const http_request& r) -> std::optional<std::string> {
      return std::string(r["X-Scope"]);
    };
    middleware_ = std::make_unique<beast::middleware>(*manager_, pool_, std::move(o));
  }
  void TearDown() override {
    middleware_.reset();
    manager_.reset();
    store_.reset();
    std::filesystem::remove_all(dir_);
  }

  // The key the server reads from `req`, or nullopt for a refusal.
  [[nodiscard]] std::optional<std::string> server_reads(const http_request& req) const {
    const auto who = middleware_->identify(req);
    if (const auto* id = std::get_if<request_id>(&who)) return id->key;
    EXPECT_EQ(std::get<http_response>(who).result_int(), 400U);
    return std::nullopt;
  }

  static http_request with_header(const std::string& value, const std::string& scope = "s") {
    http_request r{http::verb::post, "/v1/payments", 11};
    r.set("X-Scope", scope);
    r.set("Idempotency-Key", value);
    return r;
  }

  std::filesystem::path dir_;
  std::unique_ptr<store> store_;
  std::unique_ptr<manager> manager_;
  orpheus::work_pool pool_{1, 1};
  std::unique_ptr<beast::middleware> middleware_;
};

TEST_F(key_rule, TheClientAcceptsExactlyTheKeysTheServerAccepts) {
  for (const auto& c : key_table()) {
    SCOPED_TRACE(c.name);
    // The rule itself.
    const auto why = invalid_key_reason(c.key);
    EXPECT_EQ(!why.has_value(), c.valid) << why.value_or("");
    // The core.
    bool core_accepts = true;
    try {
      validate(request_id{"s", c.key, fingerprint_of("body")});
    } catch (const bad_input_error& e) {
      core_accepts = false;
      EXPECT_EQ(e.code(), codes::invalid_key);
      EXPECT_EQ(e.info().message, why.value_or(""));
    }
    EXPECT_EQ(core_accepts, c.valid);
    // The client: it refuses before sending, with the core's reason.
    std::optional<client::prepared_request> sent;
    try {
      sent.emplace(http::verb::post, "/v1/payments", "{}",
                   std::vector<std::pair<std::string, std::string>>{{"X-Scope", "s"}}, c.key);
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(e.what(), why.value_or("")) << "the client's reason is the core's";
    }
    EXPECT_EQ(sent.has_value(), c.valid);
    if (sent) {
      // The server (middleware): the client's message arrives as this key.
      EXPECT_EQ(server_reads(sent->message("Idempotency-Key")), c.key);
    } else {
      // What the client refused, written by hand either way, never reaches
      // the server as itself: it is refused or becomes another key.
      EXPECT_NE(server_reads(with_header(c.key)), c.key);
      EXPECT_NE(server_reads(with_header(key_header_value(c.key))), c.key);
    }
  }
}

TEST_F(key_rule, TheHeaderValueReadsBackAsTheKey) {
  for (const auto& c : key_table()) {
    if (!c.valid) continue;
    SCOPED_TRACE(c.name);
    EXPECT_EQ(key_of_header_value(key_header_value(c.key)), c.key);
    EXPECT_EQ(key_header_value(c.key) != c.key,
              c.key.front() == '"' || c.key.find(',') != std::string::npos)
        << "only a leading quote or a comma";
  }
  // A bare comma separates a list's values: the header sent twice, joined.
  EXPECT_EQ(key_of_header_value("k1, k1"), std::nullopt);
  EXPECT_EQ(key_of_header_value("a,b"), std::nullopt);
  EXPECT_EQ(key_of_header_value(R"("a,b")"), "a,b");
  EXPECT_EQ(key_of_header_value("  k\t"), "k");
  EXPECT_EQ(key_of_header_value(R"( "a\"b" )"), "a\"b");
  EXPECT_EQ(key_of_header_value(R"("k)"), std::nullopt);
  EXPECT_EQ(key_of_header_value(R"("a"b")"), std::nullopt);
  EXPECT_EQ(key_of_header_value(R"("a\b")"), std::nullopt) << R"(only \" and \\ escape)";
}

TEST_F(key_rule, TheScopeFollowsTheSameRule) {
  for (const auto& c : key_table()) {
    SCOPED_TRACE(c.name);
    const auto why = invalid_scope_reason(c.key);
    EXPECT_EQ(!why.has_value(), c.valid);
    if (why) {
      EXPECT_EQ(why->rfind("scope ", 0), 0U) << *why;
    }
  }
  // A scope extractor's bad answer is a 400 from the middleware.
  EXPECT_EQ(server_reads(with_header("k", std::string(max_scope_bytes + 1, 's'))), std::nullopt);
  EXPECT_EQ(server_reads(with_header("k", "caf\xC3\xA9")), std::nullopt);
  EXPECT_EQ(server_reads(with_header("k", std::string(max_scope_bytes, 's'))), "k");
}

TEST(KeyRule, EntityKeysKeepTheRule) {
  EXPECT_EQ(client::entity_key("payment", "1234", "refund"), "payment-1234-refund");
  EXPECT_FALSE(invalid_key_reason(client::entity_key("p", std::string(251, 'x'), "r")));
  EXPECT_THROW((void)client::entity_key("p", std::string(252, 'x'), "r"), std::invalid_argument);
  EXPECT_THROW((void)client::entity_key("p", "a b", "r"), std::invalid_argument);
}

TEST(Hex, OneEncoding) {
  const std::vector<unsigned char> bytes{0x00, 0x09, 0x9f, 0xa0, 0xff};
  EXPECT_EQ(detail::lowercase_hex(bytes), "00099fa0ff");
  EXPECT_EQ(detail::lowercase_hex(std::string_view("\x01z", 2)), "017a");
  EXPECT_EQ(detail::lowercase_hex(std::vector<unsigned char>{}), "");
  EXPECT_TRUE(detail::is_lowercase_hex(fingerprint_of("x"), 64));
  EXPECT_FALSE(detail::is_lowercase_hex(std::string(63, 'a'), 64));
  EXPECT_FALSE(detail::is_lowercase_hex(std::string(64, 'A'), 64));
  EXPECT_EQ(random_token(10).size(), 20U);
  EXPECT_TRUE(detail::is_lowercase_hex(random_token(10), 20));
  const std::string digits = "0123456789abcdefABCDEF";
  for (std::size_t i = 0; i < digits.size(); ++i) {
    EXPECT_EQ(detail::hex_digit_value(digits[i]),
              i < 16 ? static_cast<int>(i) : static_cast<int>(i) - 6);
  }
  for (const char c : {'g', 'G', ' ', '/', ':', '@', '`', '\0'})
    EXPECT_EQ(detail::hex_digit_value(c), -1);
}

TEST(Hex, NewIdempotencyKeysAreUuidV4) {
  const std::string k = client::new_idempotency_key();
  ASSERT_EQ(k.size(), 36U);
  for (const std::size_t dash : {8U, 13U, 18U, 23U}) EXPECT_EQ(k[dash], '-') << k;
  std::string digits = k;
  std::erase(digits, '-');
  EXPECT_TRUE(detail::is_lowercase_hex(digits, 32)) << k;
  EXPECT_EQ(k[14], '4') << k;
  EXPECT_NE(std::string("89ab").find(k[19]), std::string::npos) << k;
  EXPECT_FALSE(invalid_key_reason(k));
}

TEST(Validate, RetryPolicyThrowsConfigErrorLikeConfig) {
  EXPECT_NO_THROW(client::validate(client::retry_policy{}));
  client::retry_policy p;
  p.max_attempts = 0;
  EXPECT_THROW(client::validate(p), config_error);
  p = {};
  p.max_delay = p.base_delay / 2;
  EXPECT_THROW(client::validate(p), config_error);
  p = {};
  p.deadline = std::chrono::milliseconds(0);
  try {
    client::validate(p);
    ADD_FAILURE() << "accepted a policy without a deadline";
  } catch (const config_error& e) {
    EXPECT_EQ(e.code(), codes::invalid_config);
    EXPECT_FALSE(e.retryable());
  }
  // Found in review: milliseconds::max() overflowed now + deadline.
  for (auto client::retry_policy::*field :
       {&client::retry_policy::deadline, &client::retry_policy::attempt_timeout,
        &client::retry_policy::max_delay}) {
    p = {};
    p.*field = std::chrono::milliseconds::max();
    EXPECT_THROW(client::validate(p), config_error);
    p.*field = std::chrono::hours(24 * 7);
    EXPECT_NO_THROW(client::validate(p));
  }
}

}  // namespace
}  // namespace orpheus
