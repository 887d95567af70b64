#pragma once

// The PostgreSQL workload shared by the benchmarks and the pgbench baseline generated from the
// store's own statements: the tables, the business INSERT, and the parameters of one event.

#include "bench_support.hpp"

#include <idemgate/codec.hpp>
#include <idemgate/detail/postgres/pqxx_compat.hpp>
#include <idemgate/gate.hpp>
#include <idemgate/store/postgres.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

namespace idemgate::bench::pg {

/// The idempotency log the benchmarks and pgbench write.
inline const std::string log_table = "bench_log";

/// The gate every benchmark stands for: the rows of the log are that gate's.
inline const std::string gate_name = "ect.claim_slot";

/// The business table: one row per processed event, unique per key like a real booking table.
inline const std::string business_table = "bench_business";

/// Creates the business table if missing.
inline std::string business_schema_sql() {
  return "CREATE TABLE IF NOT EXISTS " + business_table +
         " (key bytea PRIMARY KEY, outcome text NOT NULL, created_at timestamptz NOT NULL "
         "DEFAULT now())";
}

/// The business write: one INSERT (parameters: the key as bytea, the outcome as text).
inline std::string business_insert_sql() {
  return "INSERT INTO " + business_table + " (key, outcome) VALUES ($1::bytea, $2::text)";
}

/// The prepared statement's name on every connection that runs the business write.
inline const std::string business_statement = "bench_business_insert";

/// Bytes in the text form a bytea parameter takes (`\x` + hex), as any libpq client sends them.
inline std::string bytea_text(std::string_view bytes) {
  std::string out;
  out.reserve(2 + bytes.size() * 2);
  out += "\\x";
  idemgate::detail::append_hex(out, bytes);
  return out;
}

/// The request's bytes as the store keeps them.
inline std::string request_bytes() {
  std::string bytes;
  codec<std::string>::encode(request(), bytes);
  return bytes;
}

/// The outcome's bytes as the store keeps them.
inline std::string outcome_bytes() {
  std::string bytes;
  codec<std::string>::encode(outcome(), bytes);
  return bytes;
}

/// The lease every benchmarked gate uses (the gate's default), in milliseconds.
inline std::int64_t lease_ms() {
  return static_cast<std::int64_t>(GateOptions{}.lease.count());
}

/// Runs the business write in `tx`: the same function for the gate and for the hand loop.
inline void write_business(pqxx::work& tx, const Key& key, const std::string& result) {
  detail::pq::exec_prepared(tx, business_statement, bytea_text(key.view()), result);
}

}  // namespace idemgate::bench::pg
