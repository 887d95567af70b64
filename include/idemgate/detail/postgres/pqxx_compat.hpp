// SPDX-License-Identifier: MIT
// Every difference between libpqxx versions, for PostgresStore and its tests.
#pragma once

// Every difference between libpqxx versions lives here: 6.4 (Debian 12), 7.x and 8.x.

#include "../crypto/hex.hpp"

#include <libpq-fe.h>
#include <pqxx/pqxx>
#include <pqxx/version.hxx>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#if PQXX_VERSION_MAJOR > 7 || (PQXX_VERSION_MAJOR == 7 && PQXX_VERSION_MINOR >= 10)
#define IDEMGATE_PQXX_PREPPED 1
#else
#define IDEMGATE_PQXX_PREPPED 0
#endif

namespace idemgate::detail::pq {

/// Runs a prepared statement with positional parameters.
template <class Transaction, class... Args>
pqxx::result exec_prepared(Transaction& tx, const std::string& name, Args&&... args) {
#if IDEMGATE_PQXX_PREPPED
  return tx.exec(pqxx::prepped{name}, pqxx::params{std::forward<Args>(args)...});
#else
  return tx.exec_prepared(name, std::forward<Args>(args)...);
#endif
}

/// Runs one statement with positional parameters, unprepared.
template <class Transaction, class... Args>
pqxx::result exec_params(Transaction& tx, const std::string& sql, Args&&... args) {
#if IDEMGATE_PQXX_PREPPED
  return tx.exec(sql, pqxx::params{std::forward<Args>(args)...});
#else
  return tx.exec_params(sql, std::forward<Args>(args)...);
#endif
}

/// Runs one statement without parameters (may hold several statements).
template <class Transaction>
pqxx::result exec(Transaction& tx, const std::string& sql) {
  return tx.exec(sql);
}

/// A byte string as a bytea parameter in text form (`\x` + hex): the same on every version.
inline std::string bytea_param(std::string_view bytes) {
  std::string out;
  out.reserve(2 + bytes.size() * 2);
  out += "\\x";
  append_hex(out, bytes);
  return out;
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
inline std::string bytea_field(const pqxx::field& field) {
  if (field.is_null()) return {};
  std::size_t length = 0;
  unsigned char* raw =
      PQunescapeBytea(reinterpret_cast<const unsigned char*>(field.c_str()), &length);
  if (raw == nullptr) throw std::bad_alloc();
  std::string out(reinterpret_cast<const char*>(raw), length);
  PQfreemem(raw);
  return out;
}

/// A text field; empty when null (never `as<std::optional<…>>()`: 6.4 lacks it).
inline std::string text_field(const pqxx::field& field) {
  return field.is_null() ? std::string() : std::string(field.c_str());
}

/// An integer field.
inline std::int64_t int_field(const pqxx::field& field) {
  return field.as<std::int64_t>();
}

/// A boolean field; false when null.
inline bool bool_field(const pqxx::field& field) {
  return field.is_null() ? false : field.as<bool>();
}

/// Registers a prepared statement on a connection.
inline void prepare(pqxx::connection& connection, const std::string& name, const std::string& sql) {
  connection.prepare(name, sql);
}

/// Rows a command touched.
inline std::int64_t affected_rows(const pqxx::result& result) {
  return static_cast<std::int64_t>(result.affected_rows());
}

}  // namespace idemgate::detail::pq
