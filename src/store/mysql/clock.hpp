// The database clock of the MySQL backend, in SQL.
//
// Bug 14 of issue 7: the clock was CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS
// SIGNED). On MariaDB 10.11 UNIX_TIMESTAMP is 32-bit: it gives NULL for any
// time past 2038-01-19 03:14:07 UTC, and every lease and expiry with it.
// TIMESTAMPDIFF on DATETIME values has no such limit and returns a BIGINT;
// UTC_TIMESTAMP does not depend on the session's time_zone either. Today it
// equals the old expression to the microsecond
// (MysqlStore.TheClockExpressionWorksPast2038).
#pragma once

/// Microseconds since the Unix epoch of a DATETIME(6) SQL expression `dt`
/// taken as UTC, as a string literal for concatenation.
#define ORPHEUS_MYSQL_MICROS_SINCE_EPOCH(dt) \
  "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', " dt ")"

/// The database clock in microseconds since the epoch.
#define ORPHEUS_MYSQL_NOW_US ORPHEUS_MYSQL_MICROS_SINCE_EPOCH("UTC_TIMESTAMP(6)")
