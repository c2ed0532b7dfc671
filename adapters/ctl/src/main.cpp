// orpheusctl: look at and act on the records of an Orpheus store, from a
// shell or a script (docs/operations.md). Everything it does goes through
// orpheus::admin (include/orpheus/admin.hpp); this file is flags, output and
// exit codes.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <sqlite3.h>
#include <nlohmann/json.hpp>

#include "orpheus/admin.hpp"
#include "orpheus/detail/ascii.hpp"
#include "orpheus/store/list.hpp"
#include "orpheus/store/sqlite.hpp"
#if ORPHEUSCTL_WITH_MYSQL  // set by adapters/ctl/CMakeLists.txt from ORPHEUS_WITH_MYSQL
#include "orpheus/store/mysql.hpp"
#endif

namespace {

using json = nlohmann::json;

constexpr const char* usage =
    R"(orpheusctl: the records of an Orpheus store, for operators and scripts

Usage: orpheusctl --store S [--store S ...] [--json] COMMAND [ARGS] [FLAGS]

  --store S             sqlite:PATH (an existing file), or a MySQL shard URL
                        mysql://user:pass@host:port/db; repeat the flag (or
                        separate with commas) for every shard, in the servers'
                        order
  --json                machine-readable output on stdout (one JSON document)
  --retry-window-ms N   the servers' retry window: what a requeue grants
                        (default 86400000)
  --retention-ms N      the servers' retention: how long a resolved record is
                        kept (default 604800000)
  --                    every argument after it is positional: for a scope
                        or key that starts with '-' (... show -- SCOPE -KEY)

Commands
  show SCOPE KEY        the record, its response and its history
  list --state S [--older-than DURATION] [--limit N]
                        records in state S (parked, in-progress, retryable,
                        succeeded, failed) unchanged for DURATION (a number
                        and its unit: 500ms, 90s, 10m, 2h, 1d; default 0),
                        least recently changed first;
                        at most N (default 100)
  stats                 records per state, per shard
  requeue SCOPE KEY --note TEXT
                        a parked request becomes retryable with a fresh
                        budget; it resumes at its next retry
  cancel SCOPE KEY --note TEXT
                        a parked or retryable multi-step request before its
                        pivot: its next attempt undoes the finished steps
                        (last first) and records request_cancelled; refused
                        past the pivot and for a request of a single RPC
  resolve SCOPE KEY --status N [--body TEXT] [--content-type T] --note TEXT
                        record what really happened (checked downstream by
                        hand): replayed from now on; succeeded when N < 400,
                        failed otherwise
  purge [--batch N]     delete expired records and their history (never a
                        parked one), N rows per statement (default 1000)
  migrate               apply the schema migrations this version ships, and
                        record the --store shard map in each shard (refused,
                        nothing changed, when a shard records another map)
  adopt-shard-map       migrate, and record the --store shard map in each
                        shard in place of the one recorded: only for a
                        planned change of the map, after every server of the
                        old map has stopped (docs/sharding.md)

Exit codes
  0  done
  1  no record for this scope and key
  2  bad usage or input (nothing was changed)
  3  refused: the record is not in a state that allows it (nothing changed)
  4  the database failed or is out of date; the message says whether to retry
)";

enum exit_code { ok = 0, not_found = 1, usage_error = 2, refused = 3, storage_failed = 4 };

struct usage_failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// --name value / --name=value anywhere; everything else is positional.
struct arguments {
  std::map<std::string, std::vector<std::string>> flags;
  std::vector<std::string> positional;
  bool json = false;

  arguments(int argc, char** argv) {
    static const std::map<std::string, bool> known = {
        {"store", true},  {"json", false},      {"retry-window-ms", true}, {"retention-ms", true},
        {"state", true},  {"older-than", true}, {"limit", true},           {"note", true},
        {"status", true}, {"body", true},       {"content-type", true},    {"batch", true},
        {"help", false}};
    bool options_end = false;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      // After "--" every argument is positional: a key may start with '-'
      // (found in review: a key "-h" printed the usage and exited 0, having
      // done nothing, and a key "--note" was read as the flag).
      if (options_end) {
        positional.push_back(a);
        continue;
      }
      if (a == "--") {
        options_end = true;
        continue;
      }
      // Help only when asked alone (found in review: "-h" among a
      // command's arguments, a key, printed the usage and exited 0, and a
      // script took the command as done).
      if (a == "-h" || a == "--help") {
        if (argc == 2) throw usage_failure("");
        throw usage_failure(a + " is given alone; a key that begins with '-' goes after --");
      }
      if (a.rfind("--", 0) != 0) {
        positional.push_back(a);
        continue;
      }
      const auto eq = a.find('=');
      const std::string name = a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
      const auto k = known.find(name);
      if (k == known.end()) throw usage_failure("unknown flag --" + name);
      if (!k->second) {
        if (eq != std::string::npos) throw usage_failure("--" + name + " takes no value");
        json = json || name == "json";
        continue;
      }
      if (eq != std::string::npos) {
        flags[name].push_back(a.substr(eq + 1));
      } else if (i + 1 < argc) {
        flags[name].push_back(argv[++i]);
      } else {
        throw usage_failure("--" + name + " needs a value");
      }
    }
  }

  [[nodiscard]] std::optional<std::string> get(const std::string& name) const {
    const auto it = flags.find(name);
    if (it == flags.end()) return std::nullopt;
    return it->second.back();
  }
  [[nodiscard]] std::string need(const std::string& name) const {
    auto v = get(name);
    if (!v || v->empty()) throw usage_failure("--" + name + " is required");
    return *v;
  }
  [[nodiscard]] std::int64_t number(const std::string& name, std::int64_t fallback,
                                    std::int64_t min) const {
    const auto v = get(name);
    if (!v) return fallback;
    char* end = nullptr;
    errno = 0;
    const long long n = std::strtoll(v->c_str(), &end, 10);
    if (v->empty() || *end != '\0' || errno != 0 || n < min) {
      throw usage_failure("--" + name + " wants a whole number >= " + std::to_string(min) +
                          ", got '" + *v + "'");
    }
    return n;
  }
};

// Whether a Content-Type names JSON: application/json, or a +json type
// (application/problem+json), with any parameters, in any case.
bool names_json(std::string_view content_type) {
  std::string type = orpheus::detail::ascii_lower(content_type.substr(0, content_type.find(';')));
  while (!type.empty() && (type.back() == ' ' || type.back() == '\t')) type.pop_back();
  return type == "application/json" || type.ends_with("+json");
}

// 90s, 10m, 2h, 1d or 500ms, or 0: a unit is required (found in review: a
// bare "10" was 10 milliseconds, where the usage shows 10m).
std::chrono::milliseconds duration_of(const std::string& text) {
  if (text == "0") return std::chrono::milliseconds(0);
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(text.c_str(), &end, 10);
  const std::string unit(end);
  static const std::map<std::string, long long> per = {
      {"ms", 1}, {"s", 1000}, {"m", 60'000}, {"h", 3'600'000}, {"d", 86'400'000}};
  const auto u = per.find(unit);
  if (text.empty() || end == text.c_str() || errno != 0 || n < 0 || u == per.end() ||
      n > 100LL * 366 * 86'400'000 / u->second) {
    throw usage_failure("a duration is a whole number with ms, s, m, h or d, got '" + text + "'");
  }
  return std::chrono::milliseconds(n * u->second);
}

std::optional<orpheus::record_state> state_of(const std::string& s) {
  using orpheus::record_state;
  if (s == "parked") return record_state::parked;
  if (s == "in-progress" || s == "in_progress") return record_state::in_progress;
  if (s == "retryable") return record_state::retryable;
  if (s == "succeeded") return record_state::succeeded;
  if (s == "failed") return record_state::failed;
  return std::nullopt;
}

std::string iso_time(std::int64_t us) {
  if (us <= 0) return "-";
  const auto secs = static_cast<std::time_t>(us / 1'000'000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  char frac[16];
  std::snprintf(frac, sizeof frac, ".%03dZ", static_cast<int>((us / 1000) % 1000));
  return std::string(buf) + frac;
}

std::string dump(const json& j) { return j.dump(2, ' ', false, json::error_handler_t::replace); }

std::vector<std::string> store_parts(const arguments& args) {
  const auto it = args.flags.find("store");
  // The servers' reading of a list: a comma not before a URL separates the
  // nodes of one shard (found in review: orpheusctl split at every comma).
  std::vector<std::string> parts;
  try {
    parts =
        orpheus::split_store_list(it == args.flags.end() ? std::vector<std::string>{} : it->second);
  } catch (const orpheus::config_error& e) {
    throw usage_failure(e.what());
  }
  if (parts.empty()) throw usage_failure("--store is required (sqlite:PATH or mysql:// URLs)");
  return parts;
}

// Whether the SQLite file at `path` has Orpheus's schema table, read
// without writing: opening it as a store would switch it to WAL for good
// (found in review: `orpheusctl stats` on another application's database
// changed its journal mode, and only then said it was not Orpheus's).
bool has_orpheus_schema(const std::string& path) {
  sqlite3* db = nullptr;
  const int rc = sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr);
  // As the store would: a server's checkpoint or recovery holds the file
  // for a moment (found in review: without it, a busy file failed at once).
  if (rc == SQLITE_OK) sqlite3_busy_timeout(db, 5000);
  bool found = false;
  sqlite3_stmt* st = nullptr;
  if (rc == SQLITE_OK &&
      sqlite3_prepare_v2(db,
                         "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = "
                         "'orpheus_schema_version'",
                         -1, &st, nullptr) == SQLITE_OK) {
    found = sqlite3_step(st) == SQLITE_ROW;
  }
  const std::string why = rc == SQLITE_OK && st == nullptr ? sqlite3_errmsg(db) : "";
  sqlite3_finalize(st);
  sqlite3_close(db);
  if (rc != SQLITE_OK || !why.empty()) {
    throw orpheus::storage_error::permanent("sqlite: cannot read " + path + ": " +
                                            (why.empty() ? sqlite3_errstr(rc) : why));
  }
  return found;
}

std::unique_ptr<orpheus::store> open_store(const std::vector<std::string>& parts, bool may_create) {
  if (parts.size() == 1 && parts[0].rfind("sqlite:", 0) == 0) {
    const std::string path = parts[0].substr(7);
    struct stat st {};
    if (!may_create && ::stat(path.c_str(), &st) != 0) {
      throw usage_failure("no SQLite file at '" + path + "' (only migrate creates one)");
    }
    if (!may_create && !has_orpheus_schema(path)) {
      throw orpheus::storage_error::permanent("'" + path +
                                              "' is not an Orpheus database (it has no "
                                              "orpheus_schema_version table): `orpheusctl "
                                              "migrate` makes it one");
    }
    return std::make_unique<orpheus::sqlite_store>(orpheus::sqlite_options{path});
  }
  for (const auto& p : parts) {
    if (p.rfind("mysql://", 0) != 0) {
      throw usage_failure("--store '" + p +
                          "': want one sqlite:PATH, or mysql:// URLs (one per shard)");
    }
  }
#if ORPHEUSCTL_WITH_MYSQL
  orpheus::mysql_options o;
  for (const auto& p : parts) o.shards.push_back(orpheus::parse_mysql_url(p));
  return std::make_unique<orpheus::mysql_store>(o);
#else
  throw usage_failure("this orpheusctl was built without MySQL (-DORPHEUS_WITH_MYSQL=OFF)");
#endif
}

// Every command but migrate needs the schema this version writes.
void check_schema(orpheus::store& s) {
  const int latest = s.required_schema_version();
  for (std::size_t shard = 0; shard < s.shard_count(); ++shard) {
    const int v = s.schema_version(shard);
    if (v < latest) {
      throw orpheus::storage_error::permanent(
          "shard " + std::to_string(shard) + " has schema version " + std::to_string(v) +
          ", this orpheusctl needs " + std::to_string(latest) + ": run `orpheusctl migrate`");
    }
  }
}

json record_json(const orpheus::record_report& r, const std::string& scope,
                 const std::string& key) {
  const auto& rec = r.rec;
  json out = {
      {"scope", scope},
      {"key", key},
      {"shard", r.shard},
      {"state", std::string(to_string(rec.state))},
      {"fingerprint", rec.fingerprint},
      {"attempts", rec.attempts},
      {"attempts_before_requeue", rec.attempts_before_requeue},
      {"lease_owner", rec.lease_owner.empty() ? json(nullptr) : json(rec.lease_owner)},
      {"lease_expires_us", rec.lease_expires_us},
      {"created_us", rec.created_us},
      {"updated_us", rec.updated_us},
      {"retry_until_us", rec.retry_until_us},
      {"expires_us", rec.expires_us},
      {"in_doubt_until_us",
       rec.in_doubt_until_us == 0 ? json(nullptr) : json(rec.in_doubt_until_us)},
      {"db_now_us", rec.db_now_us},
      {"last_error", rec.last_error},
      {"pre_state", rec.pre_state},
      {"recovery_point", rec.recovery_point.empty() ? json(nullptr) : json(rec.recovery_point)}};
  if (orpheus::is_terminal(rec.state)) {
    out["response"] = {{"status", rec.recorded.status},
                       {"headers", rec.recorded.headers},
                       {"body", rec.recorded.body}};
  } else {
    out["response"] = nullptr;
  }
  json history = json::array();
  for (const auto& h : r.history) {
    history.push_back({{"attempt", h.attempt},
                       {"at_us", h.at_us},
                       {"outcome", h.outcome},
                       {"runner", h.runner},
                       {"step", h.step.empty() ? json(nullptr) : json(h.step)},
                       {"error", h.error}});
  }
  out["history"] = history;
  return out;
}

void print_record(const orpheus::record_report& r, const std::string& scope,
                  const std::string& key) {
  const auto& rec = r.rec;
  std::cout << "scope " << scope << " key " << key << " (shard " << r.shard << ")\n"
            << "  state        " << to_string(rec.state) << "\n"
            << "  attempts     " << rec.attempts;
  if (rec.attempts_before_requeue > 0) {
    std::cout << " (" << rec.attempts_before_requeue << " before the last requeue)";
  }
  std::cout << "\n  created      " << iso_time(rec.created_us) << "\n  updated      "
            << iso_time(rec.updated_us) << "\n  retry until  " << iso_time(rec.retry_until_us)
            << "\n  expires      " << iso_time(rec.expires_us) << "\n";
  if (!rec.lease_owner.empty()) {
    std::cout << "  lease        " << rec.lease_owner << " until " << iso_time(rec.lease_expires_us)
              << (rec.lease_expires_us > rec.db_now_us ? " (live)" : " (expired)") << "\n";
  }
  if (rec.in_doubt_until_us > rec.db_now_us && !orpheus::is_terminal(rec.state)) {
    std::cout << "  in doubt     a call downstream may still land until "
              << iso_time(rec.in_doubt_until_us) << ": ask downstream before resolving\n";
  }
  if (!rec.last_error.empty()) std::cout << "  last error   " << rec.last_error << "\n";
  if (!rec.recovery_point.empty()) std::cout << "  steps        " << rec.recovery_point << "\n";
  if (orpheus::is_terminal(rec.state)) {
    std::cout << "  response     " << rec.recorded.status << ", " << rec.recorded.body.size()
              << " bytes\n";
  }
  std::cout << "  history      " << (r.history.empty() ? "(none)" : "") << "\n";
  for (const auto& h : r.history) {
    // The step too (found in review: without it an operator reading an
    // in-doubt row could not tell the authorisation from the capture).
    std::cout << "    " << iso_time(h.at_us) << "  attempt " << h.attempt
              << (h.step.empty() ? "" : ", step " + h.step) << "  " << h.outcome << " (" << h.runner
              << ")" << (h.error.empty() ? "" : ": " + h.error) << "\n";
  }
}

int report(const orpheus::admin_result& r, bool as_json) {
  using status = orpheus::admin_result::status;
  const char* name = r.result == status::done        ? "done"
                     : r.result == status::not_found ? "not_found"
                                                     : "refused";
  if (as_json) {
    std::cout << dump({{"result", name}, {"why", r.why}}) << "\n";
  } else if (r.ok()) {
    std::cout << "done\n";
  } else {
    std::cerr << "orpheusctl: " << r.why << "\n";
  }
  switch (r.result) {
    case status::done:
      return ok;
    case status::not_found:
      return not_found;
    case status::refused:
      return refused;
  }
  return refused;
}

void need_positionals(const arguments& args, std::size_t n, const char* what) {
  if (args.positional.size() != n + 1) {
    throw usage_failure(std::string("usage: orpheusctl ") + what);
  }
}

int run(const arguments& args) {
  if (args.positional.empty()) throw usage_failure("no command");
  const std::string& command = args.positional[0];
  static const std::vector<std::string> commands = {"show",    "list",    "stats",
                                                    "requeue", "cancel",  "resolve",
                                                    "purge",   "migrate", "adopt-shard-map"};
  if (std::find(commands.begin(), commands.end(), command) == commands.end()) {
    throw usage_failure("unknown command '" + command + "'");
  }
  // Each command's flags, and each flag once but --store (found in review:
  // `purge --limit 10` purged everything, ignoring the flag, and a second
  // --note silently replaced the first).
  static const std::map<std::string, std::vector<std::string>, std::less<>> takes = {
      {"show", {}},           {"list", {"state", "older-than", "limit"}},
      {"stats", {}},          {"requeue", {"note"}},
      {"cancel", {"note"}},   {"resolve", {"status", "body", "content-type", "note"}},
      {"purge", {"batch"}},   {"migrate", {}},
      {"adopt-shard-map", {}}};
  // --retry-window-ms and --retention-ms are the servers' settings, taken by
  // every command (a wrapper passes them always; a review of the first
  // version).
  for (const auto& [name, values] : args.flags) {
    const auto& allowed = takes.at(command);
    const bool global = name == "store" || name == "retry-window-ms" || name == "retention-ms";
    if (!global && std::find(allowed.begin(), allowed.end(), name) == allowed.end()) {
      std::string why = "--";
      why.append(name).append(" is not a flag of ").append(command);
      throw usage_failure(why);
    }
    if (name != "store" && values.size() > 1) throw usage_failure("--" + name + " is given twice");
  }
  orpheus::config cfg;
  cfg.retry_window = std::chrono::milliseconds(args.number("retry-window-ms", 86'400'000, 1));
  cfg.retention = std::chrono::milliseconds(args.number("retention-ms", 604'800'000, 1));
  try {
    orpheus::validate(cfg);
  } catch (const orpheus::config_error& e) {
    throw usage_failure(e.what());
  }
  // Flags and positionals are checked before the store is opened: bad
  // usage touches nothing.
  if (command == "show") need_positionals(args, 2, "show SCOPE KEY");
  if (command == "requeue") need_positionals(args, 2, "requeue SCOPE KEY --note TEXT");
  if (command == "cancel") need_positionals(args, 2, "cancel SCOPE KEY --note TEXT");
  if (command == "resolve") need_positionals(args, 2, "resolve SCOPE KEY --status N --note TEXT");
  const bool migrating = command == "migrate" || command == "adopt-shard-map";
  if (command == "list" || command == "stats" || command == "purge" || migrating) {
    need_positionals(args, 0, (command + (command == "list" ? " --state S" : "")).c_str());
  }
  std::optional<orpheus::record_state> state;
  std::chrono::milliseconds older_than{0};
  std::int64_t limit = 100;
  if (command == "list") {
    state = state_of(args.need("state"));
    if (!state) {
      throw usage_failure("--state is one of parked, in-progress, retryable, succeeded, failed");
    }
    older_than = duration_of(args.get("older-than").value_or("0"));
    limit = args.number("limit", 100, 1);
  }
  std::string note;
  if (command == "requeue" || command == "cancel" || command == "resolve") {
    note = args.need("note");
  }
  orpheus::response resolved;
  if (command == "resolve") {
    // Required here, before the store is opened (found in review: a
    // missing --status was found by the library after connecting, and with
    // the database down it said "retryable": run it again). Checked before
    // the cast (found in review: 2^32 + 201 became 201).
    (void)args.need("status");
    const std::int64_t status = args.number("status", 0, 200);
    if (status > 599) throw usage_failure("--status is 200..599");
    resolved.status = static_cast<int>(status);
    resolved.body = args.get("body").value_or("");
    if (const auto ct = args.get("content-type")) {
      // A body that says it is JSON and is not would be replayed, for good,
      // to clients that parse it (found in review).
      if (names_json(*ct) && !json::accept(resolved.body)) {
        throw usage_failure("--body is not JSON, though --content-type says it is");
      }
      resolved.headers.emplace_back("Content-Type", *ct);
    }
  }
  const std::int64_t batch = args.number("batch", 1000, 1);
  if (args.positional.size() == 3) {  // a bad key is bad usage, whatever the database's state
    orpheus::validate(
        orpheus::request_id{args.positional[1], args.positional[2], orpheus::fingerprint_of("")});
  }

  auto store = open_store(store_parts(args), migrating);
  if (migrating) {
    if (command == "migrate") {
      store->migrate();
    } else {
      store->adopt_shard_map();
    }
    json versions = json::array();
    for (std::size_t s = 0; s < store->shard_count(); ++s)
      versions.push_back(store->schema_version(s));
    if (args.json) {
      std::cout << dump({{"schema_version", versions}, {"shard_count", store->shard_count()}})
                << "\n";
    } else {
      std::cout << "schema version per shard: " << versions.dump() << "\n"
                << "shard map recorded: " << store->shard_count() << " shard(s), in this order\n";
    }
    return ok;
  }
  check_schema(*store);
  orpheus::admin ops(*store, cfg);

  if (command == "show") {
    const std::string& scope = args.positional[1];
    const std::string& key = args.positional[2];
    const auto r = ops.show(scope, key);
    if (!r) {
      if (args.json) {
        std::cout << "null\n";
      } else {
        std::cerr << "orpheusctl: no record for scope '" << scope << "' and key '" << key << "'\n";
      }
      return not_found;
    }
    if (args.json) {
      std::cout << dump(record_json(*r, scope, key)) << "\n";
    } else {
      print_record(*r, scope, key);
    }
    return ok;
  }
  if (command == "list") {
    const auto rows = ops.list(*state, older_than, static_cast<std::size_t>(limit));
    if (args.json) {
      json out = json::array();
      for (const auto& r : rows) {
        out.push_back({{"shard", r.shard},
                       {"scope", r.scope},
                       {"key", r.key},
                       {"state", std::string(to_string(r.state))},
                       {"attempts", r.attempts},
                       {"created_us", r.created_us},
                       {"updated_us", r.updated_us},
                       {"unchanged_ms", (r.db_now_us - r.updated_us) / 1000},
                       {"last_error", r.last_error}});
      }
      std::cout << dump(out) << "\n";
    } else {
      for (const auto& r : rows) {
        std::cout << r.shard << "  " << r.scope << "  " << r.key << "  " << to_string(r.state)
                  << "  attempts " << r.attempts << "  updated " << iso_time(r.updated_us)
                  << (r.last_error.empty() ? "" : "  " + r.last_error) << "\n";
      }
      std::cout << rows.size() << " record(s)\n";
    }
    return ok;
  }
  if (command == "stats") {
    const auto stats = ops.stats();
    if (args.json) {
      json out = json::array();
      for (const auto& s : stats) {
        out.push_back({{"shard", s.shard},
                       {"in_progress", s.in_progress},
                       {"retryable", s.retryable},
                       {"succeeded", s.succeeded},
                       {"failed", s.failed},
                       {"parked", s.parked}});
      }
      std::cout << dump(out) << "\n";
    } else {
      std::printf("%5s %12s %12s %12s %12s %12s\n", "shard", "in_progress", "retryable",
                  "succeeded", "failed", "parked");
      for (const auto& s : stats) {
        std::printf("%5zu %12lld %12lld %12lld %12lld %12lld\n", s.shard,
                    static_cast<long long>(s.in_progress), static_cast<long long>(s.retryable),
                    static_cast<long long>(s.succeeded), static_cast<long long>(s.failed),
                    static_cast<long long>(s.parked));
      }
    }
    return ok;
  }
  if (command == "requeue") {
    return report(ops.requeue(args.positional[1], args.positional[2], note), args.json);
  }
  if (command == "cancel") {
    return report(ops.cancel(args.positional[1], args.positional[2], note), args.json);
  }
  if (command == "resolve") {
    return report(ops.resolve(args.positional[1], args.positional[2], resolved, note), args.json);
  }
  // purge
  const std::size_t n = ops.purge(static_cast<std::size_t>(batch));
  if (args.json) {
    std::cout << dump({{"deleted_rows", n}}) << "\n";
  } else {
    std::cout << n << " row(s) deleted\n";
  }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  std::optional<arguments> args;
  try {
    args.emplace(argc, argv);
    return run(*args);
  } catch (const usage_failure& e) {
    if (std::string(e.what()).empty()) {
      std::cout << usage;
      return ok;
    }
    std::cerr << "orpheusctl: " << e.what() << "\n(orpheusctl --help for usage)\n";
    return usage_error;
  } catch (const orpheus::bad_input_error& e) {
    std::cerr << "orpheusctl: " << e.what() << "\n";
    return usage_error;
  } catch (const orpheus::config_error& e) {
    std::cerr << "orpheusctl: " << e.what() << "\n";
    return usage_error;
  } catch (const orpheus::error& e) {
    // migrate and purge commit as they go: a failure may leave part done.
    const std::string command = args && !args->positional.empty() ? args->positional[0] : "";
    const bool stepwise =
        command == "migrate" || command == "adopt-shard-map" || command == "purge";
    const char* advice = e.in_doubt()    ? " (in doubt: the change may or may not have been "
                                           "made; `orpheusctl show` tells)"
                         : stepwise      ? " (part of it may be done; see docs/operations.md "
                                           "before running it again)"
                         : e.retryable() ? " (retryable: nothing was changed; run it again "
                                           "once the cause above is put right)"
                                         : " (not retryable)";
    std::cerr << "orpheusctl: " << e.what() << advice << "\n";
    return storage_failed;
  } catch (const std::exception& e) {
    std::cerr << "orpheusctl: " << e.what() << "\n";
    return storage_failed;
  }
}
