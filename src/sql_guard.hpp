// What Pre-RPC and Post-RPC may not send through their `tx`: statements that
// would end, escape or outlive the library's transaction. A handler that ran
// COMMIT (or anything that commits implicitly) would make the library's
// bookkeeping commit on its own, apart from the handler's writes, and a retry
// would run those writes again; a session setting would stay on the pooled
// connection for later requests.
//
// A guard against mistakes, not against an attacker: handler SQL is the
// application's own code. It reads statements as MariaDB, MySQL and SQLite
// do: comments (`--`, `#`, `/* */`) and empty statements before the first
// word are skipped, string literals are never taken for names, and
// executable comments (`/*! */`, `/*M! */`) are refused whole.
//
//   refuse_transaction_control("UPDATE payments SET state = 'done'");  // returns
//   refuse_transaction_control("; COMMIT");  // throws storage_error (permanent)
#pragma once

#include <string_view>

namespace orpheus::detail {

/// Throws a permanent storage_error naming the statement's head when `sql` is
/// refused; returns otherwise.
void refuse_transaction_control(std::string_view sql);

/// The narrower check for the application's own transactions
/// (store::begin_on_shard): its DDL, procedures and maintenance are its own
/// business, but nothing may end the transaction by a statement (on SQLite it
/// shares the writer's batch with other requests) or leave state on the
/// pooled connection for later requests: transaction control, LOCK TABLES,
/// session settings (SET of anything but a user variable), USE, executable
/// comments.
void refuse_session_escape(std::string_view sql);

}  // namespace orpheus::detail
