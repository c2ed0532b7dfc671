// A tiny flag parser for the example programs: --name=value or --name value,
// --help. Unknown flags and bad numbers are errors, reported by name.
#pragma once

#include <cstdlib>
#include <iostream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace examples {

class flags {
 public:
  flags(int argc, char** argv, std::string usage) : usage_(std::move(usage)) {
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      if (a == "--help" || a == "-h") {
        std::cout << usage_;
        std::exit(0);
      }
      if (a.rfind("--", 0) != 0) fail("unexpected argument " + a);
      const auto eq = a.find('=');
      if (eq != std::string::npos) {
        values_[a.substr(2, eq - 2)].push_back(a.substr(eq + 1));
      } else if (i + 1 < argc) {
        values_[a.substr(2)].push_back(argv[++i]);
      } else {
        fail("flag " + a + " needs a value");
      }
    }
  }

  std::string str(const std::string& name, const std::string& fallback) {
    used_.push_back(name);
    auto it = values_.find(name);
    return it == values_.end() ? fallback : it->second.back();
  }
  std::vector<std::string> all(const std::string& name) {
    used_.push_back(name);
    auto it = values_.find(name);
    return it == values_.end() ? std::vector<std::string>{} : it->second;
  }
  long num(const std::string& name, long fallback) {
    const auto v = str(name, "");
    if (v.empty()) return fallback;
    char* end = nullptr;
    const long n = std::strtol(v.c_str(), &end, 10);
    if (*end != '\0') fail("--" + name + " wants a whole number, got " + v);
    return n;
  }
  double real(const std::string& name, double fallback) {
    const auto v = str(name, "");
    if (v.empty()) return fallback;
    char* end = nullptr;
    const double d = std::strtod(v.c_str(), &end);
    if (*end != '\0' || d < 0 || d > 1) fail("--" + name + " wants a rate in [0, 1], got " + v);
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
  std::map<std::string, std::vector<std::string>> values_;
  std::vector<std::string> used_;
};

}  // namespace examples
