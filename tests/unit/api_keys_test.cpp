// Bearer tokens and the API key table (orpheus/api_keys.hpp).
#include "orpheus/api_keys.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "../support/backends.hpp"
#include "orpheus/error.hpp"

namespace orpheus {
namespace {

constexpr std::string_view kKeyA = "sk_live_0123456789abcdef";
constexpr std::string_view kKeyB = "sk_live_fedcba9876543210==";

TEST(BearerToken, ReadsTheTokenOfTheBearerSchemeInAnyCase) {
  EXPECT_EQ(bearer_token("Bearer abc.DEF-ghi_~+/=="), "abc.DEF-ghi_~+/==");
  EXPECT_EQ(bearer_token("bearer abc"), "abc");
  EXPECT_EQ(bearer_token("BEARER   abc  "), "abc");
  EXPECT_EQ(bearer_token("Bearer\tabc"), "abc");
}

TEST(BearerToken, RefusesOtherSchemesAndMalformedTokens) {
  for (const std::string_view bad :
       {"", "Bearer", "Bearer ", "Bearerabc", "Basic YWxhZGRpbjpvcGVuc2VzYW1l", "Bearer a b",
        "Bearer a=b", "Bearer =abc", "Bearer abc,def", "Bearer \"abc\"", "Token abc",
        "Bearer abc\r\nX-Other: 1", "Bear abc"}) {
    EXPECT_EQ(bearer_token(bad), std::nullopt) << bad;
  }
}

TEST(ApiKeys, MapsEachKeyToItsClient) {
  const auto keys =
      api_keys::parse("# the shop's keys\n" + std::string(kKeyA) + " shop-1\r\n\n  \t\n" +
                      std::string(kKeyB) + "\tshop-2\n" + "sk_live_rotated_000000 shop-1");
  EXPECT_EQ(keys.size(), 3U);
  EXPECT_EQ(keys.client_of("Bearer " + std::string(kKeyA)), "shop-1");
  EXPECT_EQ(keys.client_of("bearer " + std::string(kKeyB)), "shop-2");
  EXPECT_EQ(keys.client_of("Bearer sk_live_rotated_000000"), "shop-1");
}

TEST(ApiKeys, KnowsNoOtherCaller) {
  const auto keys = api_keys::parse(std::string(kKeyA) + " shop-1\n");
  EXPECT_EQ(keys.client_of(""), std::nullopt);
  EXPECT_EQ(keys.client_of(std::string(kKeyA)), std::nullopt);  // no scheme
  EXPECT_EQ(keys.client_of("Basic " + std::string(kKeyA)), std::nullopt);
  EXPECT_EQ(keys.client_of("Bearer " + std::string(kKeyA) + "x"), std::nullopt);
  EXPECT_EQ(keys.client_of("Bearer " + std::string(kKeyA.substr(1))), std::nullopt);
  EXPECT_EQ(keys.client_of("Bearer " + std::string(100000, 'a')), std::nullopt);
}

// A bad table is refused whole, at start-up, naming the line; the message
// never carries a key (it ends up in logs).
TEST(ApiKeys, RefusesABadTableNamingTheLineNotTheKey) {
  const std::string a(kKeyA);
  struct bad_table {
    std::string text;
    std::string says;
  };
  for (const auto& [text, says] : {
           bad_table{"", "no keys"},
           bad_table{"# only a comment\n\n", "no keys"},
           bad_table{a + "\n", "line 1: want `<key> <client>`"},
           bad_table{a + " shop-1 extra\n", "line 1: want"},
           bad_table{"\n" + a + "\"x shop-1\n", "line 2: the key has a character"},
           bad_table{"short_key shop-1\n", "line 1: the key must be 16 to 512"},
           // Found in review: the padding counted toward the minimum.
           bad_table{"a=============== shop-1\n", "'=' padding not counted"},
           bad_table{"short_key_12345=== shop-1\n", "line 1: the key must be 16 to 512"},
           bad_table{std::string(513, 'k') + " shop-1\n", "line 1: the key must be"},
           bad_table{a + " shop/1\n", "line 1: the client must be"},
           bad_table{a + " " + std::string(129, 'c') + "\n", "line 1: the client must be"},
           bad_table{a + " shop-1\n#\n" + a + " shop-2\n", "line 3: the same key as line 1"},
           // Found in review: one secret to a base64 reader, two callers here.
           bad_table{a + " shop-1\n" + a + "== shop-2\n",
                     "line 2: the same key as line 1 but for its '=' padding"},
           bad_table{a + "= shop-1\n" + a + " shop-2\n",
                     "line 2: the same key as line 1 but for its '=' padding"},
       }) {
    try {
      (void)api_keys::parse(text);
      ADD_FAILURE() << "accepted: " << says;
    } catch (const config_error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(says), std::string::npos) << what;
      // The line's first field, whatever it is, is never in the message.
      const auto start = text.find_first_not_of("#\n");
      const std::string key = start == std::string::npos
                                  ? ""
                                  : text.substr(start, text.find_first_of(" \n", start) - start);
      if (!key.empty()) {
        EXPECT_EQ(what.find(key), std::string::npos) << what;
      }
      EXPECT_FALSE(e.retryable());
    }
  }
}

TEST(ApiKeys, RefusesADirectoryAsTheFile) {
  const auto dir = std::filesystem::temp_directory_path() / ("api-keys-dir-" + test::random_hex());
  std::filesystem::create_directories(dir);
  try {
    (void)api_keys::load(dir.string());
    ADD_FAILURE() << "loaded a directory";
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot read " + dir.string()), std::string::npos)
        << e.what();
  }
  std::filesystem::remove_all(dir);
}

TEST(ApiKeys, LoadsAFileAndNamesOneItCannotRead) {
  const auto dir = std::filesystem::temp_directory_path() / ("api-keys-" + test::random_hex());
  std::filesystem::create_directories(dir);
  const auto path = (dir / "keys").string();
  std::ofstream(path) << kKeyA << " shop-1\n";
  EXPECT_EQ(api_keys::load(path).client_of("Bearer " + std::string(kKeyA)), "shop-1");
  std::filesystem::remove_all(dir);
  try {
    (void)api_keys::load(path);
    ADD_FAILURE() << "loaded a file that is gone";
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot read " + path), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace orpheus
