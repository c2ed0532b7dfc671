// The one place where SQLite result codes are classified (throw_sqlite in
// connection.cpp turns the verdict into a storage_error).
//
// Policy:
//
//  - Retry just the call: a result that says "not now" (another process holds
//    the lock, an I/O error, a full disk, a file that cannot be opened right
//    now, a WAL locking protocol race, out of memory) is retryable. Outside
//    COMMIT nothing of the transaction committed, so retrying is safe.
//  - So is what an operator puts right rather than the request: a read-only
//    or moved file, a permission, a schema changed under the statement (the
//    MySQL classifier's revoked grant, read-only server and metadata race;
//    found in review: a payment told not to retry goes through once fixed).
//  - Any other result (constraint, SQL error, misuse, corruption, ...) is
//    permanent: the same statement will be refused again, and retrying it
//    forever hides a bug.
//  - COMMIT is the exception: any failure of COMMIT, whatever the code, is in
//    doubt and retryable. Some of them certainly did not commit (a BUSY COMMIT
//    leaves the transaction open, and single_writer then rolls it back), but
//    the caller's only safe move is the same either way: retry with the same
//    key.
//
// Extended result codes (SQLITE_BUSY_SNAPSHOT, SQLITE_IOERR_FSYNC,
// SQLITE_CONSTRAINT_UNIQUE, ...) are classified by their primary code (the
// low 8 bits).
//
// Unlike the MySQL classifier there is no "connection broken" or
// "transaction ended" here: an SQLite connection is a file handle, never
// lost, and whether SQLite rolled the transaction back on an error depends on
// more than the code (see the SQLite documentation of sqlite3_get_autocommit),
// so sqlite_store.cpp asks sqlite3_get_autocommit() after every failure and
// poisons the transaction when it has ended.
#pragma once

#include <sqlite3.h>

namespace orpheus::sqlite_detail {

/// What one SQLite result code means for the caller.
struct verdict {
  bool retryable = false;
  bool in_doubt = false;  ///< a COMMIT that may have landed
};

/// Classifies SQLite result `rc` (primary or extended code, not SQLITE_OK).
/// `in_commit`: it came out of COMMIT.
[[nodiscard]] inline verdict judge(int rc, bool in_commit) noexcept {
  if (in_commit) return verdict{.retryable = true, .in_doubt = true};
  switch (rc & 0xFF) {
    case SQLITE_BUSY:      // another connection holds the lock past busy_timeout
    case SQLITE_LOCKED:    // a conflict inside this process (shared cache)
    case SQLITE_IOERR:     // the OS refused a read, write or fsync
    case SQLITE_FULL:      // disk full: the operator frees space
    case SQLITE_CANTOPEN:  // the file or its journal cannot be opened now
    case SQLITE_PROTOCOL:  // a WAL locking race between processes
    case SQLITE_NOMEM:     // out of memory
    case SQLITE_READONLY:  // the file (or its WAL) cannot be written now, or was moved
    case SQLITE_PERM:      // access permission denied
    case SQLITE_SCHEMA:    // the schema changed under the statement
      return verdict{.retryable = true, .in_doubt = false};
    default:
      return verdict{.retryable = false, .in_doubt = false};
  }
}

}  // namespace orpheus::sqlite_detail
