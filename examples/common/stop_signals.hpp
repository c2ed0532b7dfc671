// SIGTERM / SIGINT handling for the example servers, without Asio: block the
// signals in every thread (construct this before starting any), then wait
// for one in main.
#pragma once

#include <pthread.h>

#include <csignal>

namespace examples {

class stop_signals {
 public:
  stop_signals() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGTERM);
    sigaddset(&set_, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);  // threads started later inherit it
  }
  /// Blocks until SIGTERM or SIGINT arrives.
  void wait() const {
    int sig = 0;
    sigwait(&set_, &sig);
  }

 private:
  sigset_t set_{};
};

}  // namespace examples
