// Child processes for crash tests: start, read stdout lines, SIGKILL, wait;
// and servers under test that say when they listen.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

extern char** environ;

namespace orpheus::test {

class child_process {
 public:
  /// With `with_stderr`, read_line() reads the child's stderr too.
  explicit child_process(std::vector<std::string> argv, bool with_stderr = false) {
    int fds[2];
    if (::pipe(fds) != 0) throw std::runtime_error("pipe");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    if (with_stderr) posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    const int rc = posix_spawn(&pid_, args[0], &fa, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    ::close(fds[1]);
    out_ = fds[0];
    if (rc != 0) throw std::runtime_error("posix_spawn " + argv[0]);
  }
  child_process(const child_process&) = delete;
  child_process& operator=(const child_process&) = delete;
  ~child_process() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    ::close(out_);
  }

  /// The next line of the child's stdout, or nullopt at EOF or timeout.
  std::optional<std::string> read_line(std::chrono::milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      const auto nl = buffer_.find('\n');
      if (nl != std::string::npos) {
        std::string line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        return line;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          until - std::chrono::steady_clock::now());
      if (left.count() <= 0) return std::nullopt;
      pollfd p{out_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char buf[512];
      const auto n = ::read(out_, buf, sizeof buf);
      if (n <= 0) return std::nullopt;
      buffer_.append(buf, static_cast<std::size_t>(n));
    }
  }

  void signal(int sig) { ::kill(pid_, sig); }
  [[nodiscard]] pid_t pid() const { return pid_; }

  void kill_hard() {
    ::kill(pid_, SIGKILL);
    wait();
  }

  /// Waits for exit; returns the exit code (or 128 + signal).
  int wait() {
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    return 128 + WTERMSIG(status);
  }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
  std::string buffer_;
};

/// A child program that prints "listening on PORT" when ready.
struct listening_process {
  std::unique_ptr<child_process> proc;
  unsigned short port = 0;

  /// Starts it and reads its port; a gtest failure if it does not say it
  /// listens within 30 s.
  void start(std::vector<std::string> argv) {
    proc = std::make_unique<child_process>(std::move(argv));
    const auto line = proc->read_line(std::chrono::seconds(30)).value_or("");
    ASSERT_EQ(line.rfind("listening on ", 0), 0U) << "got: " << line;
    port = static_cast<unsigned short>(std::stoi(line.substr(13)));
  }
};

/// A TCP port on loopback that nothing listens on (as a bind found it free a
/// moment ago), below the kernel's ephemeral range: a server restarted on it
/// later cannot find it taken by a client's own connection (whose source
/// port the kernel picks from that range; connecting to a port nothing
/// listens on can even connect a socket to itself). On a host whose range
/// starts at 11000 or below, the kernel's choice, without that guarantee.
inline int free_port() {
  int ephemeral_low = 32768;
  if (std::FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%d", &ephemeral_low) != 1) ephemeral_low = 32768;
    std::fclose(f);
  }
  constexpr int low = 10000;
  if (ephemeral_low <= low + 1000) {
    // A host whose ephemeral range starts low ("1024 65535"): the kernel's
    // choice, as before (found in review: this threw, and every test failed).
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      if (fd >= 0) ::close(fd);
      throw std::runtime_error("no free port");
    }
    ::close(fd);
    return ntohs(a.sin_port);
  }
  std::random_device seed;
  std::mt19937 pick(seed());
  std::uniform_int_distribution<int> port(low, ephemeral_low - 1);
  for (int tries = 0; tries < 200; ++tries) {
    const int candidate = port(pick);
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) throw std::runtime_error("socket");
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<std::uint16_t>(candidate));
    const bool bound = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    if (bound) return candidate;
  }
  throw std::runtime_error("no free port");
}

/// Runs `scripts/mariadb VERB DIR [PORT]`: start (a server of the test's
/// own, database d, user u, password p), stop, kill, ...
inline void mariadb(const std::string& verb, const std::filesystem::path& dir, int port = 0) {
  std::string cmd = std::string(ORPHEUS_SOURCE_DIR "/scripts/mariadb ") + verb + " " + dir.string();
  if (port != 0) cmd += " " + std::to_string(port);
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

}  // namespace orpheus::test
