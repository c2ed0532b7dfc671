// orpheus::split_store_list(): how orpheusctl and the example servers read
// --store.
#include "orpheus/store/list.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "orpheus/error.hpp"

namespace orpheus {
namespace {

using list = std::vector<std::string>;

TEST(StoreList, CommasSeparateStoresAndTheNodesOfOneShard) {
  EXPECT_EQ(split_store_list({}), list{});
  EXPECT_EQ(split_store_list({"sqlite:a.db"}), list{"sqlite:a.db"});
  EXPECT_EQ(split_store_list({"mysql://u:p@h1/d,mysql://u:p@h2/d", "mysql://u:p@h3/d"}),
            (list{"mysql://u:p@h1/d", "mysql://u:p@h2/d", "mysql://u:p@h3/d"}));
  // A shard's nodes, and a comma in a password, stay in their URL.
  EXPECT_EQ(split_store_list({"mysql://u:p@h1,h2:3307/d,mysql://u:p,q@h3/d"}),
            (list{"mysql://u:p@h1,h2:3307/d", "mysql://u:p,q@h3/d"}));
}

// Found in review: "" and "," were no store at all, so the example server
// opened a new payments.db in its working directory (every key recorded in
// the real store unknown there, paid again); a space after a comma made two
// shards one; orpheusctl split a shard's nodes into shards.
TEST(StoreList, EmptyPartsWhiteSpaceAndStrayTextAreRefused) {
  for (const list& bad :
       {list{""}, list{","}, list{"sqlite:a.db,"}, list{"mysql://u:p@h1/d,,mysql://u:p@h2/d"},
        list{"mysql://u:p@h1/d, mysql://u:p@h2/d"}, list{"mysql://u:p@h1/d,mysql:/u:p@h2/d"},
        list{"mysql://u:p@h1/d,h2/d"}, list{"mysql://u:p@h1,MYSQL://u:p@h2/d"}, list{"payments.db"},
        list{"sqlite:a.db,h2"}, list{"sqlite:a\tb.db"}, list{"sqlite:a.db "}}) {
    EXPECT_THROW((void)split_store_list(bad), config_error) << bad.front();
  }
  // The message leaves the password out (found in review: it was printed).
  try {
    (void)split_store_list({"mysql://u:secret@h1/d, mysql://u:secret@h2/d"});
    ADD_FAILURE() << "taken";
  } catch (const config_error& e) {
    EXPECT_EQ(std::string(e.what()).find("secret"), std::string::npos) << e.what();
  }
  // A space inside a path is taken (a review of the first version: it was not).
  EXPECT_EQ(split_store_list({"sqlite:/Users/Jo Doe/pay.db"}), list{"sqlite:/Users/Jo Doe/pay.db"});
}

}  // namespace
}  // namespace orpheus
