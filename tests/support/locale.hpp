// A locale built for a test with localedef (Debian package locales, which
// scripts/test installs), so that a test can show the library reads the same
// under a locale the application may set (a decimal comma, Turkish case).
//
//   bool set = false;
//   test::under_locale(LC_CTYPE, "tr_TR", "UTF-8", [&] { set = true; ...; });
//   ASSERT_TRUE(set) << "no tr_TR.UTF-8: install the package locales";
//
// Thread safety: none; setlocale() and LOCPATH are the process's. Run it
// where no other thread reads them.
#pragma once

#include <clocale>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <optional>
#include <random>
#include <string>

namespace orpheus::test {

/// Builds `input`.`charmap` (as "tr_TR", "ISO-8859-9") in a directory of its
/// own named by LOCPATH, sets `category` to it and runs `body`; then the "C"
/// locale and the caller's LOCPATH again, whatever `body` did. `body` does not
/// run when the locale cannot be set (no localedef, no such source).
inline void under_locale(int category, const std::string& input, const std::string& charmap,
                         const std::function<void()>& body) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("orpheus-locale-" + std::to_string(std::random_device{}()));
  std::filesystem::create_directories(dir);
  const std::string name = input + "." + charmap;
  const std::string build = "localedef -i " + input + " -f " + charmap + " '" +
                            (dir / name).string() + "' >/dev/null 2>&1";
  (void)std::system(build.c_str());  // its warnings set the exit code; setlocale() tells
  const char* callers = std::getenv("LOCPATH");
  const std::optional<std::string> saved =
      callers != nullptr ? std::optional<std::string>(callers) : std::nullopt;
  struct restore {
    int category;
    const std::optional<std::string>& saved;
    const std::filesystem::path& dir;
    ~restore() {
      std::setlocale(category, "C");
      if (saved) {
        setenv("LOCPATH", saved->c_str(), 1);
      } else {
        unsetenv("LOCPATH");
      }
      std::error_code ignored;
      std::filesystem::remove_all(dir, ignored);
    }
  } restored{category, saved, dir};
  if (setenv("LOCPATH", dir.c_str(), 1) != 0) return;
  if (std::setlocale(category, name.c_str()) == nullptr) return;
  body();
}

}  // namespace orpheus::test
