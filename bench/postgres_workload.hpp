#pragma once

// The PostgreSQL workload shared by the benchmarks and the pgbench baseline generated from the
// store's own statements: the tables, the business INSERT, the parameters of one event, and the
// gate's statements run by hand.

#include "bench_support.hpp"

#include <idemgate/codec.hpp>
#include <idemgate/detail/postgres/pqxx_compat.hpp>
#include <idemgate/gate.hpp>
#include <idemgate/store/postgres.hpp>

#include <chrono>
#include <cstdint>
#include <stdexcept>
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

/// What a careful programmer writes without the library: the gate's own statements
/// (PostgresStore::statement_sql for `log_table`), prepared once on one connection of the same
/// driver kept for the loop's life, with the parameters the store sends, and the business write
/// between them. The log and the business table must exist (the gate's store migrates the log).
///
/// - `Transactions::two`: the gate's transactions, in the gate's order: the reservation in
///   autocommit, then BEGIN / business INSERT / fenced UPDATE / COMMIT. The gate runs its fenced
///   update through an SQL `EXECUTE` behind a `SAVEPOINT` check in the same round trip; the hand
///   loop runs it prepared, unchecked.
/// - `Transactions::one`: the same statements with one commit instead of two: BEGIN /
///   reservation / business INSERT / fenced UPDATE / COMMIT. A hand-written reference for what the
///   reservation's own commit costs, not a mode of the library: the gate commits the reservation
///   before the side effect runs, so that another worker sees it and a crash cannot lose it.
class HandLoop {
 public:
  /// How many transactions an event takes.
  enum class Transactions { two, one };

  /// Connects to `uri` and prepares the reservation, the fenced update and the business INSERT.
  explicit HandLoop(const std::string& uri, Transactions transactions = Transactions::two)
      : connection_(uri), transactions_(transactions) {
    detail::pq::prepare(connection_, reserve_statement,
                        PostgresStore::statement_sql(sql::postgres::reserve, log_table));
    detail::pq::prepare(connection_, commit_statement,
                        PostgresStore::statement_sql(sql::postgres::commit, log_table));
    detail::pq::prepare(connection_, business_statement, business_insert_sql());
  }

  /// Processes one event whose key is new; throws when the key exists or the fence is lost.
  void event(const Key& key) {
    // Per event, as the gate computes it.
    const Fingerprint fingerprint = detail::sha256(request_);
    const std::string fingerprint_param =
        bytea_text({reinterpret_cast<const char*>(fingerprint.data()), fingerprint.size()});
    const std::string key_param = bytea_text(key.view());
    if (transactions_ == Transactions::one) {
      pqxx::work tx(connection_);
      const std::int64_t fence = reserve(tx, key_param, fingerprint_param);
      finish(tx, key, key_param, fence);
      return;
    }
    std::int64_t fence = 0;
    {
      pqxx::nontransaction tx(connection_);
      fence = reserve(tx, key_param, fingerprint_param);
    }
    pqxx::work tx(connection_);
    finish(tx, key, key_param, fence);
  }

 private:
  static constexpr const char* reserve_statement = "idemgate_reserve";
  static constexpr const char* commit_statement = "idemgate_commit";

  // The reservation of a new key; its fence.
  template <class Transaction>
  std::int64_t reserve(Transaction& tx, const std::string& key_param,
                       const std::string& fingerprint_param) {
    const pqxx::result rows =
        detail::pq::exec_prepared(tx, reserve_statement, gate_name, key_param, fingerprint_param,
                                  request_param_, lease_ms_, ++holder_, std::string());
    if (rows.empty() || !detail::pq::bool_field(rows[0][0]))
      throw std::runtime_error("the hand loop met an existing key");
    return detail::pq::int_field(rows[0][1]);
  }

  // The business write and the fenced update, then COMMIT.
  void finish(pqxx::work& tx, const Key& key, const std::string& key_param, std::int64_t fence) {
    write_business(tx, key, outcome());
    const pqxx::result updated =
        detail::pq::exec_prepared(tx, commit_statement, gate_name, key_param, fence, result_param_);
    if (detail::pq::affected_rows(updated) != 1)
      throw std::runtime_error("the hand loop lost a fence");
    tx.commit();
  }

  pqxx::connection connection_;
  Transactions transactions_;
  const std::string request_ = request_bytes();
  const std::string request_param_ = bytea_text(request_);
  const std::string result_param_ = bytea_text(outcome_bytes());
  const std::int64_t lease_ms_ = lease_ms();
  // This attempt's holder token: any non-zero number the loop has not used.
  std::int64_t holder_ = 0;
};

}  // namespace idemgate::bench::pg
