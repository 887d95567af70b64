// SPDX-License-Identifier: MIT
// SqliteStore's options, and how its values become parameters and come back: table names,
// instants as microseconds since the epoch, and a row as the log's decoder reads it.
#pragma once

#include "../../concepts.hpp"
#include "../../detail/durations.hpp"
#include "../../detail/sqlite/statement.hpp"
#include "../log/row.hpp"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>

namespace idemgate {

/// Bytes that `SqliteTransaction::exec` binds as a BLOB (a plain string binds as TEXT).
struct SqliteBlob {
  /// The bytes; they must stay alive until `exec` returns.
  std::string_view bytes;
};

/// Tuning of a `SqliteStore`.
struct SqliteOptions {
  /// Where "now" comes from: leases, staleness and timestamps are measured with it.
  using Clock = WallClock;

  /// The idempotency log's table: letters, digits and underscores (SQLite has no schemas).
  std::string table = "idemgate_log";
  /// The longest any call waits, in all: for another thread's call on the same store, then for
  /// another connection's or process's write transaction. Past it the call throws `StoreError`
  /// ("do not ack"), naming what held the store. Writes take milliseconds, so a few seconds is
  /// plenty. Between 0 ms and 1 hour.
  std::chrono::milliseconds busy_timeout = std::chrono::seconds(5);
  /// The size the write-ahead log (`<file>-wal`) is kept to, in bytes. SQLite checkpoints the
  /// WAL into the database as it goes, but readers in other connections can keep it from
  /// starting over; once it passes this size the store runs a truncating checkpoint, and SQLite
  /// cuts the file back to this size whenever it starts over (`journal_size_limit`). Only a
  /// read transaction held open for long keeps the WAL above it (see `StoreSignals::wal_bytes`).
  /// Between 64 KiB and 1 TiB.
  std::size_t wal_size_limit = std::size_t{64} << 20;
  /// Injected clock for tests (expire leases without sleeping); empty means the system clock.
  Clock clock = {};
};

namespace detail::sqlite {

/// Checks a table name; throws `std::invalid_argument` that says what to use instead.
inline std::string checked_table_name(std::string table) {
  if (!idemgate::detail::is_identifier(table, 63))
    throw std::invalid_argument("idemgate: \"" + table +
                                "\" is not a usable SQLite table name; use a plain name (not "
                                "schema.table) of 1 to 63 letters, digits and underscores, "
                                "starting with a letter or an underscore");
  std::string lower = table;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](char c) {
    return static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  });
  if (lower.starts_with("sqlite_"))
    throw std::invalid_argument("idemgate: \"" + table +
                                "\" is reserved by SQLite (names starting with sqlite_); pick "
                                "another table name");
  return table;
}

/// Microseconds since the epoch, clamped instead of overflowing.
inline std::int64_t to_micros(std::chrono::system_clock::time_point t) {
  return idemgate::detail::saturating_micros(t.time_since_epoch());
}

/// Microseconds since the epoch, as a time point the saturating helpers work on.
using MicrosPoint = std::chrono::time_point<std::chrono::system_clock, std::chrono::microseconds>;

/// `at + d` in microseconds since the epoch; `duration::max()` gives the latest instant.
template <class Rep, class Period>
std::int64_t later(std::int64_t at, std::chrono::duration<Rep, Period> d) {
  return idemgate::detail::saturating_add(MicrosPoint(std::chrono::microseconds(at)), d)
      .time_since_epoch()
      .count();
}

/// `at - d` in microseconds since the epoch; `duration::max()` gives the earliest instant.
template <class Rep, class Period>
std::int64_t earlier(std::int64_t at, std::chrono::duration<Rep, Period> d) {
  return idemgate::detail::saturating_sub(MicrosPoint(std::chrono::microseconds(at)), d)
      .time_since_epoch()
      .count();
}

/// The lease end of a released row: before every instant the clock can give.
inline constexpr std::int64_t ended_lease = std::numeric_limits<std::int64_t>::min();

/// One row of a statement as `to_record` and `signals_from` read it (text reads as bytes).
struct Row {
  /// The statement, stepped onto the row.
  const Statement& statement;
  /// Whether column `column` is NULL.
  [[nodiscard]] bool is_null(int column) const { return statement.is_null(column); }
  /// Column `column` as an integer.
  [[nodiscard]] std::int64_t int64(int column) const { return statement.int64(column); }
  /// Column `column` as bytes.
  [[nodiscard]] std::string bytes(int column) const { return statement.bytes(column); }
  /// Column `column` as text.
  [[nodiscard]] std::string text(int column) const { return statement.bytes(column); }
};
static_assert(log_row<Row>);

}  // namespace detail::sqlite

}  // namespace idemgate
