// The completer (orpheus/completer.hpp): claim due records, then resume each
// through the manager, which decides everything as it does for a client.
#include "orpheus/completer.hpp"

#include <string>
#include <vector>

#include "orpheus/detail/record_row.hpp"
#include "orpheus/detail/records.hpp"
#include "orpheus/log.hpp"

namespace orpheus {
namespace {

struct claimed {
  request_id id;
  std::string handler;
  int version = 0;
};

std::string text(const sql_value& v) {
  const auto* s = std::get_if<std::string>(&v);
  return s ? *s : std::string{};
}

// One short transaction: the due rows, locked, each pushed a lease ahead so
// that other completers pass over them while this one works.
std::vector<claimed> claim(store& s, std::size_t shard, std::size_t batch, std::int64_t hold_us) {
  const auto& sql = s.statements();
  auto t = s.backend().begin(shard);
  const sql_value limit[] = {static_cast<std::int64_t>(batch)};
  std::vector<claimed> out;
  for (const auto& row : t->query_values(sql.claim, limit)) {
    const auto& v = row.values;
    out.push_back({{text(v.at(0)), text(v.at(1)), text(v.at(2))},
                   text(v.at(3)),
                   static_cast<int>(detail::int_or_zero(v.at(4)))});
  }
  for (const auto& c : out) {
    const sql_value p[] = {hold_us, c.id.scope, c.id.key};
    t->execute_values(sql.claim_hold, p);
  }
  t->commit();
  return out;
}

}  // namespace

completer::completer(manager& m, completer_options o) : manager_(m), options_(o) {
  if (options_.batch == 0) throw config_error("completer_options::batch is 0");
  if (options_.idle_wait.count() <= 0) {
    throw config_error("completer_options::idle_wait must be positive");
  }
}

completer::~completer() { stop(); }

completer_pass completer::run_once() {
  completer_pass pass;
  store& s = manager_.storage();
  const std::int64_t hold_us =
      std::chrono::duration_cast<std::chrono::microseconds>(manager_.settings().lease).count();
  for (std::size_t shard = 0; shard < s.shard_count(); ++shard) {
    std::vector<claimed> due;
    try {
      due = claim(s, shard, options_.batch, hold_us);
    } catch (const std::exception& e) {
      ++pass.shard_errors;
      log(log_level::warning,
          "completer: could not claim on shard " + std::to_string(shard) + ": " + e.what());
      continue;
    }
    pass.claimed += due.size();
    for (const auto& c : due) {
      try {
        (void)manager_.complete(c.id, c.handler, c.version);
        ++pass.finished;
      } catch (const error& e) {
        if (e.code() == codes::request_parked) {
          ++pass.parked;
        } else if (e.code() == codes::in_progress) {
          ++pass.skipped;
        } else if (e.retryable()) {
          ++pass.retrying;
        } else {
          ++pass.finished;  // a final failure, recorded by the manager
        }
      } catch (const std::exception& e) {
        ++pass.retrying;
        log(log_level::warning,
            "completer: scope " + c.id.scope + " key " + c.id.key + ": " + e.what());
      }
    }
  }
  return pass;
}

void completer::start() {
  const std::lock_guard lock(m_);
  if (thread_.joinable()) return;
  stopping_ = false;
  thread_ = std::thread([this] { loop(); });
}

void completer::stop() {
  {
    const std::lock_guard lock(m_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void completer::loop() {
  for (;;) {
    const completer_pass pass = run_once();
    std::unique_lock lock(m_);
    if (stopping_) return;
    // A full batch may mean more is due: go on at once.
    const bool more = pass.claimed >= options_.batch && pass.shard_errors == 0;
    if (!more) wake_.wait_for(lock, options_.idle_wait, [this] { return stopping_; });
    if (stopping_) return;
  }
}

}  // namespace orpheus
