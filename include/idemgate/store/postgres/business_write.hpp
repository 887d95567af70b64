// SPDX-License-Identifier: MIT
// What a business write calls on PostgreSQL: parameterised and prepared statements the same way on
// every libpqxx, and a batch's column as one array parameter.
#pragma once

#include "../../detail/postgres/pqxx_compat.hpp"

#include <pqxx/pqxx>

#include <string>
#include <utility>

namespace idemgate {

/**
 * Runs one parameterised statement in a business write's transaction (`PostgresStore::transaction`,
 * or any libpqxx transaction): `$1`, `$2`, … take `args` in order, converted as libpqxx converts
 * them (strings, integers, floating point, bool, `std::optional` for NULL from 7.x on); an
 * `idemgate::Key` binds as a `bytea` (its 32 raw bytes). Returns the result.
 *
 * The same call on every libpqxx this store supports: `tx.exec_params` is deprecated from 7.10
 * on, and `tx.exec(sql, pqxx::params{...})` does not exist in 6.4.
 *
 * Example:
 *   idemgate::exec_params(tx, "INSERT INTO tms_bookings VALUES ($1, $2, $3)", container, slot,
 *                         key);
 */
template <class Transaction, class... Args>
pqxx::result exec_params(Transaction& tx, const std::string& sql, Args&&... args) {
  return detail::pq::exec_params(tx, sql, std::forward<Args>(args)...);
}

/**
 * Runs a statement prepared on the transaction's connection (`connection.prepare(name, sql)`)
 * with `args` as its parameters, converted as in `exec_params` (a `Key` binds as a `bytea`).
 * Returns the result. The same call on every libpqxx this store supports.
 *
 * Example:
 *   const auto found = idemgate::exec_prepared(tx, "booking_by_event", key);
 */
template <class Transaction, class... Args>
pqxx::result exec_prepared(Transaction& tx, const std::string& name, Args&&... args) {
  return detail::pq::exec_prepared(tx, name, std::forward<Args>(args)...);
}

/**
 * Strings as one `text[]` parameter of `exec_params` or `exec_prepared`, so a bulk business write
 * sends a column of the whole batch at once: `INSERT … SELECT * FROM unnest($1::text[], …)`.
 *
 * Example:
 *   const std::vector<std::string> containers{container, "TGHU1234567"};
 *   idemgate::exec_params(tx, "INSERT INTO tms_bookings (container)"
 *                             " SELECT * FROM unnest($1::text[])",
 *                         idemgate::text_array(containers));
 */
template <class Range>
[[nodiscard]] std::string text_array(const Range& values) {
  return detail::pq::text_array_param(values);
}

/**
 * Byte strings (each event's `key.view()`, say) as one `bytea[]` parameter of `exec_params` or
 * `exec_prepared`, for `unnest($1::bytea[])`.
 *
 * Example:
 *   const std::vector<std::string_view> keys{key.view()};
 *   idemgate::exec_params(tx, "SELECT count(*) FROM unnest($1::bytea[])",
 *                         idemgate::bytea_array(keys));
 */
template <class Range>
[[nodiscard]] std::string bytea_array(const Range& values) {
  return detail::pq::bytea_array_param(values);
}

}  // namespace idemgate
