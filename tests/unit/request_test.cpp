#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "../../src/pre_state.hpp"
#include "orpheus/detail/migration.hpp"
#include "orpheus/detail/record_row.hpp"
#include "orpheus/request.hpp"

namespace orpheus {
namespace {

request_id good() { return {"tenant-1/payments", "key-1", fingerprint_of("body")}; }

void expect_bad(const request_id& id, std::string_view code) {
  try {
    validate(id);
    ADD_FAILURE() << "accepted a bad request id";
  } catch (const bad_input_error& e) {
    EXPECT_EQ(e.code(), code);
    EXPECT_EQ(e.http_status(), 400);
    EXPECT_FALSE(e.retryable());
  }
}

TEST(RequestId, AcceptsPrintableAsciiUpTo255Bytes) {
  EXPECT_NO_THROW(validate(good()));
  auto id = good();
  id.key = std::string(255, 'k');
  EXPECT_NO_THROW(validate(id));
  id.key = "a b~!@#$%^&*()_+{}|:\"<>?";
  EXPECT_NO_THROW(validate(id));
}

TEST(RequestId, RejectsBadKeys) {
  auto id = good();
  id.key = "";
  expect_bad(id, codes::invalid_key);
  id.key = std::string(256, 'k');
  expect_bad(id, codes::invalid_key);
  id.key = std::string("a\0b", 3);
  expect_bad(id, codes::invalid_key);
  id.key = "tab\there";
  expect_bad(id, codes::invalid_key);
  id.key = "caf\xC3\xA9";
  expect_bad(id, codes::invalid_key);
  id.key = " padded";
  expect_bad(id, codes::invalid_key);
  id.key = "\x7F";
  expect_bad(id, codes::invalid_key);
}

TEST(RequestId, RejectsBadScopesAndFingerprints) {
  auto id = good();
  id.scope = std::string(256, 's');
  expect_bad(id, codes::invalid_scope);
  id.scope = "";
  expect_bad(id, codes::invalid_scope);
  id = good();
  id.fingerprint = "abc";
  expect_bad(id, codes::invalid_fingerprint);
  id.fingerprint = std::string(64, 'G');
  expect_bad(id, codes::invalid_fingerprint);
}

TEST(Fingerprint, IsSha256Hex) {
  EXPECT_EQ(fingerprint_of(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(fingerprint_of("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

// Issue 9 (fuzzing): a stored binary form whose CBOR announces more elements
// than a vector can hold made decode_pre_state() throw nlohmann's
// out_of_range instead of answering nullopt (corrupt text).
TEST(PreState, CorruptTextReadsAsNothingAndNeverThrows) {
  for (const auto* stored : {"cbor:m7uAAAAAAAAA", "cbor:u7uAAAAAAAAA", "cbor:e7uAAAAAAAAA",
                             "cbor:!!!!", "cbor:YWJj=", "{not json"}) {
    std::optional<nlohmann::json> value;
    EXPECT_NO_THROW(value = detail::decode_pre_state(stored)) << stored;
    EXPECT_FALSE(value) << stored;
  }
  const nlohmann::json bytes = {{"body", std::string("\xff\x00\xfe", 3)}, {"amount", 5}};
  EXPECT_EQ(detail::decode_pre_state(detail::encode_pre_state(bytes)), bytes);
}

// A fast read's row (state, fingerprint, attempts, lease_owner,
// lease_expires_us, status, headers, body, now) of a succeeded record.
sql_row stored_row(const std::string& headers) {
  const std::string fingerprint = fingerprint_of("body");
  return {{std::int64_t{3}, fingerprint, std::int64_t{1}, nullptr, nullptr, std::int64_t{201},
           headers, std::string("body"), std::int64_t{1}}};
}

// Issue 9 (fuzzing): a headers column that is not the JSON the backends write
// made record_from_row() throw nlohmann's exceptions out of store::read().
TEST(RecordRow, UnreadableHeadersAreANonRetryableStorageError) {
  for (const auto* headers : {R"([["a"]])", R"({"a":"b"})", R"([["a",1]])", "[[", "\xff"}) {
    try {
      (void)detail::record_from_row(stored_row(headers), false);
      ADD_FAILURE() << "read headers " << headers;
    } catch (const storage_error& e) {
      EXPECT_FALSE(e.retryable()) << headers;
      EXPECT_EQ(e.code(), codes::storage_error) << headers;
    }
  }
  const auto r = detail::record_from_row(stored_row(R"([["Content-Type","text/plain"]])"), false);
  ASSERT_EQ(r.recorded.headers.size(), 1U);
  EXPECT_EQ(r.recorded.headers[0].second, "text/plain");
}

TEST(Attempt, DownstreamKeyIsStableAndSeparatesFields) {
  const request_id a{"s", "k", fingerprint_of("x")};
  const request_id b{"s", "k", fingerprint_of("y")};  // fingerprint plays no part
  const auto now = std::chrono::steady_clock::now();
  EXPECT_EQ(attempt(a, 1, now).downstream_key("charge"),
            attempt(b, 7, now).downstream_key("charge"));
  EXPECT_NE(attempt(a, 1, now).downstream_key("charge"),
            attempt(a, 1, now).downstream_key("refund"));
  const request_id c{"s:k", "", fingerprint_of("x")};
  const request_id d{"s", ":k", fingerprint_of("x")};
  EXPECT_NE(attempt(c, 1, now).downstream_key("n"), attempt(d, 1, now).downstream_key("n"));
  EXPECT_EQ(attempt(a, 1, now).downstream_key("charge").rfind("ork_", 0), 0U);
  EXPECT_FALSE(attempt(a, 1, now).is_retry());
  EXPECT_TRUE(attempt(a, 2, now).is_retry());
}

TEST(Problem, CarriesTheRetryableFlag) {
  const auto r = problem_response(error_info{409, "in_progress", "busy", true, false, {}});
  EXPECT_EQ(r.status, 409);
  ASSERT_EQ(r.headers.size(), 1U);
  EXPECT_EQ(r.headers[0].second, "application/problem+json");
  const auto j = nlohmann::json::parse(r.body);
  EXPECT_EQ(j["retryable"], true);
  EXPECT_EQ(j["code"], "in_progress");
  EXPECT_EQ(j["status"], 409);
}

TEST(Classify, KeepsOrpheusClassesAndAppliesThePolicyToOthers) {
  auto as_ptr = [](auto e) { return std::make_exception_ptr(e); };
  EXPECT_TRUE(
      classify(as_ptr(retryable_error("x", "y")), unclassified_policy::non_retryable).retryable);
  EXPECT_FALSE(
      classify(as_ptr(non_retryable_error("x", "y")), unclassified_policy::retryable).retryable);
  const auto plain =
      classify(as_ptr(std::runtime_error("boom")), unclassified_policy::non_retryable);
  EXPECT_FALSE(plain.retryable);
  EXPECT_EQ(plain.code, codes::unclassified);
  EXPECT_TRUE(
      classify(as_ptr(std::runtime_error("boom")), unclassified_policy::retryable).retryable);
  EXPECT_FALSE(classify(as_ptr(42), unclassified_policy::non_retryable).retryable);
}

TEST(Migrations, SplitStatementsAtLineEndSemicolons) {
  const auto s = detail::split_statements(
      "-- comment; here\nCREATE TABLE a (x INT);\n\nCREATE INDEX i\n  ON a (x);\n");
  ASSERT_EQ(s.size(), 2U);
  EXPECT_EQ(s[0], "CREATE TABLE a (x INT)");
  EXPECT_EQ(s[1], "CREATE INDEX i\n  ON a (x)");
}

}  // namespace
}  // namespace orpheus
