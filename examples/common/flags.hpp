// A tiny flag parser for the example programs: --name=value or --name value,
// switches (--name alone), --help. Unknown flags, bad numbers, numbers out of
// range, empty values and a flag given twice (except one read with all())
// are errors, reported by name, before the program does anything.
#pragma once

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <iostream>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace examples {

class flags {
 public:
  /// `switches` name the flags that take no value (--name alone).
  flags(int argc, char** argv, std::string usage, std::set<std::string> switches = {})
      : usage_(std::move(usage)), switches_(std::move(switches)) {
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      if (a == "--help" || a == "-h") {
        std::cout << usage_;
        std::exit(0);
      }
      if (a.rfind("--", 0) != 0) fail("unexpected argument " + a);
      if (switches_.count(a.substr(2)) != 0) {
        values_[a.substr(2)].emplace_back();
        continue;
      }
      const auto eq = a.find('=');
      if (eq != std::string::npos && switches_.count(a.substr(2, eq - 2)) != 0) {
        fail("--" + a.substr(2, eq - 2) + " takes no value");
      }
      if (eq != std::string::npos) {
        values_[a.substr(2, eq - 2)].push_back(a.substr(eq + 1));
      } else if (i + 1 < argc) {
        values_[a.substr(2)].push_back(argv[++i]);
      } else {
        fail("flag " + a + " needs a value");
      }
    }
  }

  /// The flag's value, or `fallback` when it is not given. Given empty
  /// (`--store ""`, `--store=`, an unset variable in a script) or twice is an
  /// error: found in review, an empty --store silently opened a new SQLite
  /// file, and a repeated flag silently took its last value.
  std::string str(const std::string& name, const std::string& fallback) {
    used_.push_back(name);
    auto it = values_.find(name);
    if (it == values_.end()) return fallback;
    if (it->second.size() != 1) fail("--" + name + " is given more than once");
    if (it->second.back().empty()) fail("--" + name + " is given an empty value");
    return it->second.back();
  }
  /// Whether the switch `name` was given.
  bool on(const std::string& name) {
    if (switches_.count(name) == 0) fail("--" + name + " is not a switch");
    used_.push_back(name);
    return values_.count(name) != 0;
  }
  /// Every value of a flag that may be given more than once; none empty.
  std::vector<std::string> all(const std::string& name) {
    used_.push_back(name);
    auto it = values_.find(name);
    if (it == values_.end()) return {};
    for (const auto& v : it->second) {
      if (v.empty()) fail("--" + name + " is given an empty value");
    }
    return it->second;
  }
  /// A whole number from `lo` to `hi`. Found in review: 99999999999999999999
  /// was read as LONG_MAX (a payment of that many minor units was sent).
  long num(const std::string& name, long fallback, long lo = LONG_MIN, long hi = LONG_MAX) {
    const auto v = str(name, "");
    if (v.empty()) return fallback;
    char* end = nullptr;
    errno = 0;
    const long n = std::strtol(v.c_str(), &end, 10);
    if (*end != '\0' || end == v.c_str()) fail("--" + name + " wants a whole number, got " + v);
    if (errno == ERANGE || n < lo || n > hi) {
      fail("--" + name + " wants a number from " + std::to_string(lo) + " to " +
           std::to_string(hi) + ", got " + v);
    }
    return n;
  }
  /// A duration in milliseconds, from `lo` to 100 years (the library's own
  /// bound). Found in review: 10000000000000 (317 years) overflowed the
  /// nanoseconds of Beast's timers (every connection was closed at once) and
  /// of condition_variable::wait_for.
  long millis(const std::string& name, long fallback, long lo = 0) {
    return num(name, fallback, lo, 100L * 365 * 24 * 3600 * 1000);
  }
  /// A rate in [0, 1]; NaN is refused (found in review: `nan` passed).
  double real(const std::string& name, double fallback) {
    const auto v = str(name, "");
    if (v.empty()) return fallback;
    char* end = nullptr;
    const double d = std::strtod(v.c_str(), &end);
    if (*end != '\0' || end == v.c_str() || !(d >= 0 && d <= 1))
      fail("--" + name + " wants a rate in [0, 1], got " + v);
    return d;
  }
  /// Call after reading every flag: refuses flags nobody asked for.
  void done() {
    for (const auto& [name, v] : values_) {
      bool known = false;
      for (const auto& u : used_) known = known || u == name;
      if (!known) fail("unknown flag --" + name);
    }
  }
  [[noreturn]] void fail(const std::string& why) {
    std::cerr << "error: " << why << "\n\n" << usage_;
    std::exit(2);
  }

 private:
  std::string usage_;
  std::set<std::string> switches_;
  std::map<std::string, std::vector<std::string>> values_;
  std::vector<std::string> used_;
};

}  // namespace examples
