// SPDX-License-Identifier: MIT
// How PostgresStore's values become parameters and come back: table names, durations, instants,
// holder tokens, and a row as the log's decoder reads it.
#pragma once

#include "../../detail/durations.hpp"
#include "../../detail/postgres/pqxx_compat.hpp"
#include "../log/row.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>

namespace idemgate::detail {

/// Longest table name: PostgreSQL cuts identifiers at 63 bytes, and the index names add up to
/// 14 characters to it.
inline constexpr std::size_t max_table_name = 48;

/// Checks a (schema-qualified) table name; throws `std::invalid_argument` with what to do.
inline std::string checked_table_name(std::string table) {
  const auto dot = table.find('.');
  const bool ok = dot == std::string::npos
                      ? is_identifier(table, max_table_name)
                      : is_identifier(std::string_view(table).substr(0, dot), max_table_name) &&
                            is_identifier(std::string_view(table).substr(dot + 1), max_table_name);
  if (!ok)
    throw std::invalid_argument("idemgate: \"" + table +
                                "\" is not a usable table name; use up to 48 letters, digits "
                                "and underscores, optionally as schema.table");
  return table;
}

inline std::string unqualified(const std::string& table) {
  const auto dot = table.find('.');
  return dot == std::string::npos ? table : table.substr(dot + 1);
}

/// Longest duration given to PostgreSQL's interval arithmetic: 1000 years (of 365.25 days), so
/// `now() ± d` stays far inside timestamptz's range. Longer durations are clamped to it, which
/// for rows this store stamps with now() means forever: a lease never expires, a row is never
/// stale, nothing is purged.
inline constexpr std::chrono::seconds max_sql_duration{31'557'600'000};

/// `d` in whole `Unit`s as a bigint parameter, clamped to ±`max_sql_duration`.
template <class Unit, class Rep, class Period>
[[nodiscard]] inline std::int64_t sql_duration(std::chrono::duration<Rep, Period> d) {
  const std::int64_t most = saturating_cast<Unit>(max_sql_duration).count();
  return std::clamp<std::int64_t>(saturating_cast<Unit>(d).count(), -most, most);
}

/// A random, non-zero token that marks the rows one attempt wrote (insert, takeover, take-stale),
/// so that a statement repeated after its reply was lost recognises its own work.
inline std::int64_t new_holder_token() {
  // Seeded per thread, and again in a child after fork(): a forked worker must not repeat its
  // parent's tokens, or each would take the other's row for its own.
  struct Source {
    pid_t pid = 0;
    std::mt19937_64 bits;
  };
  thread_local Source source;
  if (const pid_t pid = ::getpid(); source.pid != pid) {
    std::random_device seed;
    source.bits.seed((static_cast<std::uint64_t>(seed()) << 32) ^ seed());
    source.pid = pid;
  }
  std::int64_t token = 0;
  while (token == 0) token = static_cast<std::int64_t>(source.bits() >> 1);
  return token;
}

/// A time point as microseconds since the epoch, clamped to what a timestamptz holds comfortably
/// (about 4000 years either side of 1970).
inline std::int64_t sql_micros(std::chrono::system_clock::time_point at) {
  constexpr std::int64_t bound = 4000LL * 366 * 24 * 3600 * 1000000;
  const auto micros =
      std::chrono::duration_cast<std::chrono::microseconds>(at.time_since_epoch()).count();
  return micros < -bound ? -bound : (micros > bound ? bound : micros);
}

/// A libpqxx row as `to_record` and `signals_from` read it.
struct PqRow {
  /// The row (a lightweight reference into its result on libpqxx 8, a row before).
  pq::row row;
  /// Whether column `column` is NULL.
  [[nodiscard]] bool is_null(int column) const { return row[column].is_null(); }
  /// Column `column` as an integer.
  [[nodiscard]] std::int64_t int64(int column) const { return pq::int_field(row[column]); }
  /// Column `column`, a bytea, as its bytes.
  [[nodiscard]] std::string bytes(int column) const { return pq::bytea_field(row[column]); }
  /// Column `column`, a text, as its characters.
  [[nodiscard]] std::string text(int column) const { return pq::text_field(row[column]); }
};
static_assert(log_row<PqRow>);

}  // namespace idemgate::detail
