#include "sql_guard.hpp"

#include <algorithm>
#include <string>

#include "orpheus/detail/ascii.hpp"
#include "orpheus/error.hpp"

namespace orpheus::detail {
namespace {

// ASCII only, whatever the process's locale (found in review: under
// tr_TR.UTF-8 std::toupper('i') is 'i', and "commit" went through as COMMiT).
char upper(char c) { return ascii_upper(c); }
bool is_space(char c) { return is_ascii_space(c); }
bool is_word_char(char c) { return is_ascii_alnum(c) || c == '_' || c == '$'; }

/// How a dialect reads "--": MySQL and MariaDB as a comment only before a
/// space or a control character ("--1" is minus minus one), SQLite always.
enum class dashes { mysql, sqlite };

/// `sql` upper-cased, comments replaced by a space, every string literal
/// emptied ('' or ""), so that no word inside a literal or a comment is read
/// as SQL.
std::string normalize(std::string_view sql, dashes rule) {
  std::string out;
  out.reserve(sql.size());
  std::size_t i = 0;
  while (i < sql.size()) {
    const char c = sql[i];
    const bool dash_comment =
        sql.substr(i, 2) == "--" && (rule == dashes::sqlite || i + 2 == sql.size() ||
                                     static_cast<unsigned char>(sql[i + 2]) <= ' ');
    if (dash_comment || c == '#') {
      while (i < sql.size() && sql[i] != '\n') ++i;
      out.push_back(' ');
    } else if (sql.substr(i, 2) == "/*") {
      const auto close = sql.find("*/", i + 2);
      i = close == std::string_view::npos ? sql.size() : close + 2;
      out.push_back(' ');
    } else if (c == '`') {
      // A quoted identifier: whatever it holds is a name, never a comment,
      // a literal or a parenthesis (found in review: SET @`#` = 1, ...). A
      // doubled backtick is one backtick inside it.
      ++i;
      while (i < sql.size()) {
        if (sql[i] == '`' && i + 1 < sql.size() && sql[i + 1] == '`') {
          i += 2;
          continue;
        }
        if (sql[i++] == '`') break;
      }
      out.append("``");
    } else if (c == '\'' || c == '"') {
      ++i;
      while (i < sql.size()) {
        // A backslash escapes the next character; a doubled quote is one
        // quote inside the literal: both skip two characters.
        const bool two = sql[i] == '\\' || (sql[i] == c && i + 1 < sql.size() && sql[i + 1] == c);
        if (two) {
          i += 2;
          continue;
        }
        ++i;
        if (sql[i - 1] == c) break;
      }
      out.push_back(c);
      out.push_back(c);
    } else {
      out.push_back(upper(c));
      ++i;
    }
  }
  return out;
}

/// `raw` names the SQLite writer's savepoint, in any case and under any
/// quotes. Searched only for savepoint statements, without a copy.
bool names_writer_savepoint(std::string_view raw) {
  constexpr std::string_view name = "orpheus_member";
  return std::search(raw.begin(), raw.end(), name.begin(), name.end(),
                     [](char a, char b) { return ascii_lower(a) == b; }) != raw.end();
}

/// The next word of `n` from `i` (skipping spaces and, before the first
/// word, empty statements), and where it ends.
std::string_view next_word(std::string_view n, std::size_t& i, bool first = false) {
  while (i < n.size() && (is_space(n[i]) || (first && n[i] == ';'))) ++i;
  const std::size_t start = i;
  while (i < n.size() && is_word_char(n[i])) ++i;
  return n.substr(start, i - start);
}

enum class scope { handler, own_transaction };

[[noreturn]] void refuse(scope where, std::string_view head, std::string_view why = {}) {
  std::string msg =
      where == scope::handler
          ? "Pre-RPC and Post-RPC may not begin, end, lock or change the schema outside the "
            "library's transaction"
          : "a transaction of store::begin_on_shard() may not be ended by a statement (use "
            "commit() or rollback()) nor lock tables";
  msg.append(why).append(" (").append(head).append(")");
  throw storage_error::permanent(std::move(msg));
}

// First words of statements that end the transaction, lock, commit
// implicitly (DDL, table maintenance, administration on MariaDB and MySQL)
// or run SQL the guard cannot see (dynamic SQL).
constexpr std::string_view refused_first_words[] = {
    "BEGIN",     "COMMIT",  "END",      "START",    "XA",         "LOCK",     "UNLOCK",
    "CREATE",    "ALTER",   "DROP",     "TRUNCATE", "RENAME",     "GRANT",    "REVOKE",
    "FLUSH",     "ANALYZE", "OPTIMIZE", "REPAIR",   "CHECK",      "CACHE",    "INSTALL",
    "UNINSTALL", "RESET",   "CHANGE",   "STOP",     "BACKUP",     "SHUTDOWN", "RESTART",
    "IMPORT",    "CLONE",   "PREPARE",  "EXECUTE",  "DEALLOCATE",
    "USE",     // the session's default database would stay on the pooled connection
    "PRAGMA",  // SQLite: a setting stays on the one writer connection (query_only=1
               // failed every later write); read with SELECT ... FROM pragma_xxx()
};

// First words of MariaDB's compound statements besides BEGIN, which it runs
// outside a stored program too.
constexpr std::string_view compound_first_words[] = {"IF",    "CASE",   "LOOP",
                                                     "WHILE", "REPEAT", "FOR"};

/// The assignments of a SET (after the word SET), split at the commas that
/// are not inside parentheses.
void check_set_targets(std::string_view n, std::size_t i, scope where, std::string_view head) {
  int depth = 0;
  std::size_t item = i;
  for (std::size_t k = i; k <= n.size(); ++k) {
    const char c = k < n.size() ? n[k] : ',';
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if (c != ',' || depth != 0) continue;
    std::string_view target = n.substr(item, k - item);
    while (!target.empty() && is_space(target.front())) target.remove_prefix(1);
    item = k + 1;
    // A user variable (@name, not @@name) is the handler's own: allowed.
    if (target.starts_with('@') && !target.starts_with("@@")) continue;
    // Anything else is the session's (autocommit, isolation,
    // completion_type, time_zone, NAMES, ROLE, PASSWORD, TRANSACTION, ...):
    // it would stay on the pooled connection for later requests, and some
    // commit or change what the library's statements see.
    refuse(where, head,
           ", nor change a session setting, which stays on the pooled connection "
           "(user variables, @name, are allowed)");
  }
}

void check(std::string_view n, scope where, bool backslash, std::string_view raw) {
  std::size_t i = 0;
  const std::string_view first = next_word(n, i, /*first=*/true);
  std::size_t after_first = i;
  const std::string_view second = next_word(n, after_first);
  const std::string head = std::string(first) + (second.empty() ? "" : " ") + std::string(second);
  // ROLLBACK [WORK | TRANSACTION] TO [SAVEPOINT] name undoes to a savepoint.
  std::size_t after_second = after_first;
  const bool to_savepoint = second == "TO" || ((second == "WORK" || second == "TRANSACTION") &&
                                               next_word(n, after_second) == "TO");
  // MariaDB runs a compound statement outside a stored program (IF, CASE,
  // LOOP, WHILE, REPEAT, FOR, or one of them or BEGIN after a label), and
  // it may COMMIT inside, as a procedure may: refused to handlers as CALL
  // is (found in review: "IF 1 THEN INSERT ...; COMMIT; END IF" committed
  // Post-RPC's row apart from the record, and a retry wrote it again).
  // A label is the first word and a colon before a block that takes one
  // ("SELECT :amount", a SQLite parameter, is not: found in review).
  std::size_t colon = i;  // just after the first word
  while (colon < n.size() && is_space(n[colon])) ++colon;
  bool labelled = false;
  if (!first.empty() && colon < n.size() && n[colon] == ':') {
    std::size_t after_colon = colon + 1;
    const std::string_view block = next_word(n, after_colon);
    labelled = block == "BEGIN" || block == "LOOP" || block == "WHILE" || block == "REPEAT" ||
               block == "FOR";
  }
  if (where == scope::handler &&
      (labelled || std::find(std::begin(compound_first_words), std::end(compound_first_words),
                             first) != std::end(compound_first_words))) {
    refuse(where, head,
           ", nor run a compound statement (IF, CASE, LOOP, WHILE, REPEAT, FOR, or a label), "
           "which may COMMIT inside");
  }
  if (where == scope::own_transaction) {
    if (first == "BEGIN" || first == "COMMIT" || first == "END" || first == "START" ||
        first == "XA" || first == "LOCK" || first == "UNLOCK" || first == "USE" ||
        first == "PRAGMA" || (first == "ROLLBACK" && !to_savepoint)) {
      refuse(where, head);
    }
  } else if (first == "CALL") {
    // A stored procedure may COMMIT inside (found in review): the handler's
    // writes before it would commit apart from the record, and a retry
    // would run them again.
    throw storage_error::permanent(
        "Pre-RPC and Post-RPC may not CALL a stored procedure: it may COMMIT the library's "
        "transaction apart from the record; run its statements in the handler instead");
  }
  if (where == scope::handler) {
    for (const std::string_view word : refused_first_words) {
      if (first == word) refuse(where, head);
    }
    if ((first == "LOAD" && second == "INDEX") || (first == "ROLLBACK" && !to_savepoint)) {
      refuse(where, head);
    }
  }
  // The SQLite backend's own savepoint (group commit), under any quotes:
  // the raw text is searched (check_statement()).
  if ((first == "SAVEPOINT" || first == "RELEASE" || first == "ROLLBACK") &&
      names_writer_savepoint(raw)) {
    refuse(where, head);
  }
  if (first != "SET") return;
  // Whether a backslash escapes a quote depends on the session's sql_mode
  // (NO_BACKSLASH_ESCAPES): the guard could misread where a literal ends, so
  // a SET with one is refused (pass the value as a parameter).
  if (backslash) refuse(where, head, ", nor SET a value with a backslash (pass it as a parameter)");
  if (second == "STATEMENT") {
    // SET STATEMENT var = value [, ...] FOR <statement>: the settings last
    // one statement; the statement is checked as any other.
    int depth = 0;
    for (std::size_t k = after_first; k < n.size(); ++k) {
      if (n[k] == '(') ++depth;
      if (n[k] == ')') --depth;
      if (depth == 0 && n.substr(k, 3) == "FOR" && (k == 0 || !is_word_char(n[k - 1])) &&
          (k + 3 == n.size() || !is_word_char(n[k + 3]))) {
        check(n.substr(k + 3), where, backslash, raw);
        return;
      }
    }
    return;  // no FOR: the server refuses it
  }
  check_set_targets(n, i, where, head);
}

void check_statement(std::string_view sql, scope where) {
  // MySQL and MariaDB run executable comments as SQL: refused whole.
  for (const std::string_view executable : {"/*!", "/*M!", "/*m!"}) {
    if (sql.find(executable) != std::string_view::npos) refuse(where, "an executable comment");
  }
  const bool backslash = sql.find('\\') != std::string_view::npos;
  check(normalize(sql, dashes::mysql), where, backslash, sql);
  // A statement is checked as each dialect reads it (found in review:
  // "--x\nCOMMIT" has no first word as MySQL reads it, and SQLite, for which
  // the first line is a comment, ran the COMMIT on the shared batch).
  if (sql.find("--") != std::string_view::npos) {
    check(normalize(sql, dashes::sqlite), where, backslash, sql);
  }
}

}  // namespace

void refuse_transaction_control(std::string_view sql) { check_statement(sql, scope::handler); }

void refuse_session_escape(std::string_view sql) { check_statement(sql, scope::own_transaction); }

}  // namespace orpheus::detail
