// SPDX-License-Identifier: MIT
// Every difference between libpqxx versions, for PostgresStore and its tests.
#pragma once

// Every difference between libpqxx versions lives here: 6.4 (Debian 12), 7.x and 8.x. Nothing
// outside this file names a call whose spelling, result type or timing differs between them.
//
// - Parameterised statements: 6.4 has only `exec_params`/`exec_prepared`; 7.10 deprecates them
//   for `exec(sql, pqxx::params)`/`exec(pqxx::prepped, pqxx::params)`, which 6.4 lacks.
// - Rows and fields: up to 7.x, indexing a result gives a `pqxx::row` and a row a `pqxx::field`;
//   8.x gives the lightweight `pqxx::row_ref`/`pqxx::field_ref`, which do not convert to those.
//   `pq::row` and `pq::field` name whichever the version gives.
// - Errors: `sql_error::query()` and `sqlstate()` return `std::string` up to 7.x and
//   `std::string_view` in 8.x; `pq::failed_query` and `pq::sqlstate` copy either.
// - Preparing: 6.4 only records a statement in `connection::prepare` and sends it to the server
//   on its first use; 7.x and 8.x send it at once. Callers therefore prepare a statement right
//   before its first use on a connection (see PostgresStore), so the server sees it at the same
//   moment on every version.
// - Parameters of idemgate's own types: libpqxx converts a parameter through its
//   `string_traits`, whose shape differs between 6.4, 7.x and 8.x. A `Key` is therefore turned
//   into a bytea in text form (`\x` + hex, `bytea_param`) before libpqxx sees it, which every
//   version passes on as it is.

#include "../crypto/hex.hpp"

#include <libpq-fe.h>
#include <pqxx/pqxx>
#include <pqxx/version.hxx>

#include <cstdint>
#include <new>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#if PQXX_VERSION_MAJOR > 7 || (PQXX_VERSION_MAJOR == 7 && PQXX_VERSION_MINOR >= 10)
#define IDEMGATE_PQXX_PREPPED 1
#else
#define IDEMGATE_PQXX_PREPPED 0
#endif

namespace idemgate {
class Key;
}  // namespace idemgate

namespace idemgate::detail::pq {

/// A byte string as a bytea parameter in text form (`\x` + hex): the same on every version.
inline std::string bytea_param(std::string_view bytes) {
  std::string out;
  out.reserve(2 + bytes.size() * 2);
  out += "\\x";
  append_hex(out, bytes);
  return out;
}

/// A statement parameter as libpqxx is given it: a `Key` as its bytea in text form, anything
/// else unchanged (libpqxx converts it).
template <class T>
decltype(auto) param(T&& value) {
  if constexpr (std::is_same_v<std::remove_cvref_t<T>, Key>)
    return bytea_param(value.view());
  else
    return std::forward<T>(value);
}

#if PQXX_VERSION_MAJOR >= 8
/// A row of a result, as indexing or iterating a result gives it.
using row = pqxx::row_ref;
/// A field of a row, as indexing a row gives it.
using field = pqxx::field_ref;
#else
/// A row of a result, as indexing or iterating a result gives it.
using row = pqxx::row;
/// A field of a row, as indexing a row gives it.
using field = pqxx::field;
#endif

/// Runs a prepared statement with positional parameters (a `Key` binds as bytea).
template <class Transaction, class... Args>
pqxx::result exec_prepared(Transaction& tx, const std::string& name, Args&&... args) {
#if IDEMGATE_PQXX_PREPPED
  return tx.exec(pqxx::prepped{name}, pqxx::params{param(std::forward<Args>(args))...});
#else
  return tx.exec_prepared(name, param(std::forward<Args>(args))...);
#endif
}

/// Runs one statement with positional parameters ($1, $2, …), unprepared (a `Key` binds as
/// bytea).
template <class Transaction, class... Args>
pqxx::result exec_params(Transaction& tx, const std::string& sql, Args&&... args) {
#if IDEMGATE_PQXX_PREPPED
  return tx.exec(sql, pqxx::params{param(std::forward<Args>(args))...});
#else
  return tx.exec_params(sql, param(std::forward<Args>(args))...);
#endif
}

/// Runs one statement without parameters (may hold several statements).
template <class Transaction>
pqxx::result exec(Transaction& tx, const std::string& sql) {
  return tx.exec(sql);
}

/// A byte string as an SQL literal of type bytea, independent of standard_conforming_strings.
inline std::string bytea_literal(std::string_view bytes) {
  std::string out;
  out.reserve(20 + bytes.size() * 2);
  out += "decode('";
  append_hex(out, bytes);
  out += "', 'hex')";
  return out;
}

/// Byte strings as an SQL array literal of type bytea[].
template <class Range>
std::string bytea_array_literal(const Range& values) {
  std::string out = "ARRAY[";
  bool first = true;
  for (std::string_view bytes : values) {
    if (!first) out += ',';
    first = false;
    out += bytea_literal(bytes);
  }
  out += "]::bytea[]";
  return out;
}

/// Byte strings as a `bytea[]` parameter in text form: `{"\\x…","\\x…"}`.
template <class Range>
std::string bytea_array_param(const Range& values) {
  std::string out = "{";
  for (std::string_view bytes : values) {
    if (out.size() > 1) out += ',';
    out += "\"\\\\x";
    append_hex(out, bytes);
    out += '"';
  }
  out += '}';
  return out;
}

/// Strings as a `text[]` parameter in text form: each quoted, `"` and `\` escaped.
template <class Range>
std::string text_array_param(const Range& values) {
  std::string out = "{";
  for (std::string_view text : values) {
    if (out.size() > 1) out += ',';
    out += '"';
    for (char c : text) {
      if (c == '"' || c == '\\') out += '\\';
      out += c;
    }
    out += '"';
  }
  out += '}';
  return out;
}

/// Integers as a `bigint[]` parameter in text form.
template <class Range>
std::string bigint_array_param(const Range& values) {
  std::string out = "{";
  for (auto value : values) {
    if (out.size() > 1) out += ',';
    out += std::to_string(value);
  }
  out += '}';
  return out;
}

/// Decodes a bytea field in text form (hex or escape output) into raw bytes.
inline std::string bytea_field(const field& value) {
  if (value.is_null()) return {};
  std::size_t length = 0;
  unsigned char* raw =
      PQunescapeBytea(reinterpret_cast<const unsigned char*>(value.c_str()), &length);
  if (raw == nullptr) throw std::bad_alloc();
  std::string out(reinterpret_cast<const char*>(raw), length);
  PQfreemem(raw);
  return out;
}

/// A text field; empty when null (never `as<std::optional<…>>()`: 6.4 lacks it).
inline std::string text_field(const field& value) {
  return value.is_null() ? std::string() : std::string(value.c_str());
}

/// An integer field.
inline std::int64_t int_field(const field& value) {
  return value.as<std::int64_t>();
}

/// A boolean field; false when null.
inline bool bool_field(const field& value) {
  return value.is_null() ? false : value.as<bool>();
}

/// Prepares a statement on a connection. 6.4 sends it to the server on its first use, 7.x and
/// 8.x now: call it right before the statement's first use on the connection, never ahead.
inline void prepare(pqxx::connection& connection, const std::string& name, const std::string& sql) {
  connection.prepare(name, sql);
}

/// Prepares a statement on a connection and sends it to the server now, on every version (6.4
/// would send it only at its first use), so that an SQL-level `EXECUTE` finds it. Call it
/// outside any transaction on the connection.
inline void prepare_at_once(pqxx::connection& connection, const std::string& name,
                            const std::string& sql) {
  connection.prepare(name, sql);
#if PQXX_VERSION_MAJOR < 7
  connection.prepare_now(name);
#endif
}

/// Rows a command touched.
inline std::int64_t affected_rows(const pqxx::result& result) {
  return static_cast<std::int64_t>(result.affected_rows());
}

/// The statement a `pqxx::sql_error` reports (for a prepared one, its name on some versions).
inline std::string failed_query(const pqxx::sql_error& error) {
  return std::string(error.query());
}

/// The SQLSTATE of a `pqxx::sql_error` (empty when the server sent none).
inline std::string sqlstate(const pqxx::sql_error& error) {
  return std::string(error.sqlstate());
}

}  // namespace idemgate::detail::pq
