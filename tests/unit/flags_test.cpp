// The example programs' flag parser (examples/common/flags.hpp): what it
// refuses it refuses with exit 2 and a message, before the program acts.
#include "../../examples/common/flags.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace {

using testing::ExitedWithCode;

// A parser over `args` (the program's name first).
examples::flags parse(std::vector<std::string> args) {
  args.insert(args.begin(), "prog");
  std::vector<char*> argv;
  argv.reserve(args.size());
  for (auto& a : args) argv.push_back(a.data());
  return {static_cast<int>(argv.size()), argv.data(), "usage\n"};
}

TEST(ExampleFlags, ANumberTooLargeForItsTypeIsRefusedNotClamped) {
  // Found in review: strtol's LONG_MAX was taken, and pay_client sent a
  // payment of 9223372036854775807 minor units.
  EXPECT_EXIT(parse({"--amount", "99999999999999999999"}).num("amount", 0), ExitedWithCode(2),
              "--amount wants a number from");
  EXPECT_EXIT(parse({"--attempts", "0"}).num("attempts", 8, 1, 1000), ExitedWithCode(2),
              "--attempts wants a number from 1 to 1000, got 0");
  EXPECT_EQ(parse({"--attempts", "1000"}).num("attempts", 8, 1, 1000), 1000);
  EXPECT_EQ(parse({}).num("attempts", 8, 1, 1000), 8);
}

TEST(ExampleFlags, AnEmptyOrRepeatedValueIsRefused) {
  // Found in review: an empty --store opened a new SQLite file in the
  // working directory, and --lease-ms= took the default.
  EXPECT_EXIT(parse({"--store", ""}).str("store", "x"), ExitedWithCode(2),
              "--store is given an empty value");
  EXPECT_EXIT(parse({"--lease-ms="}).millis("lease-ms", 10000), ExitedWithCode(2),
              "--lease-ms is given an empty value");
  EXPECT_EXIT(parse({"--store", "a", "--store", ""}).all("store"), ExitedWithCode(2),
              "--store is given an empty value");
  // The last of two used to win silently.
  EXPECT_EXIT(parse({"--note", "a", "--note", "b"}).str("note", ""), ExitedWithCode(2),
              "--note is given more than once");
  EXPECT_EQ(parse({"--store", "a", "--store", "b"}).all("store"),
            (std::vector<std::string>{"a", "b"}));
}

TEST(ExampleFlags, ADurationBeyondAHundredYearsIsRefused) {
  // Found in review: 10000000000000 ms overflowed Beast's nanosecond timers
  // (every connection closed at once) and the completer's wait_for.
  EXPECT_EXIT(parse({"--idle-timeout-ms", "10000000000000"}).millis("idle-timeout-ms", 1, 1),
              ExitedWithCode(2), "--idle-timeout-ms wants a number from 1 to 3153600000000");
  EXPECT_EXIT(parse({"--wait-ms", "-1"}).millis("wait-ms", 0), ExitedWithCode(2),
              "--wait-ms wants a number from 0");
  EXPECT_EQ(parse({"--wait-ms", "3153600000000"}).millis("wait-ms", 0), 3'153'600'000'000L);
}

TEST(ExampleFlags, ARateThatIsNotANumberIsRefused) {
  EXPECT_EXIT(parse({"--fail-rate", "nan"}).real("fail-rate", 0), ExitedWithCode(2),
              "--fail-rate wants a rate in \\[0, 1\\], got nan");
  EXPECT_EXIT(parse({"--fail-rate", "1.5"}).real("fail-rate", 0), ExitedWithCode(2), "rate");
  EXPECT_DOUBLE_EQ(parse({"--fail-rate", "0.25"}).real("fail-rate", 0), 0.25);
}

}  // namespace
