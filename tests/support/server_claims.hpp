#pragma once

// A claims API on the server side, over SQLite or PostgreSQL, for the server-side tests and the
// process they kill: POST /claims under Idempotency-Key inserts one row into its own table in
// the store's transaction and answers 201 {"claim":<n>}; GET /claims?idempotency_key=<key> is
// the reconciler's lookup.

#include <idemgate/server/endpoint.hpp>
#include <idemgate/server/httplib.hpp>
#include <idemgate/store/postgres.hpp>
#include <idemgate/store/sqlite.hpp>

#include <sqlite3.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>

namespace idemgate::test {

/// The claims table of a SQLite file: created beside the log, counted from outside.
struct SqliteClaims {
  using Store = SqliteStore;
  std::string path;

  static std::int64_t query(const std::string& path, const std::string& sql) {
    sqlite3* db = nullptr;
    if (sqlite3_open(path.c_str(), &db) != SQLITE_OK) throw std::runtime_error("open " + path);
    sqlite3_busy_timeout(db, 5000);
    sqlite3_stmt* st = nullptr;
    std::int64_t n = 0;
    if (sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW)
      n = sqlite3_column_int64(st, 0);
    const bool ok = st != nullptr;
    sqlite3_finalize(st);
    sqlite3_close(db);
    if (!ok) throw std::runtime_error("query failed: " + sql);
    return n;
  }
  void create() const {
    query(path, "CREATE TABLE IF NOT EXISTS claims (id INTEGER PRIMARY KEY, client TEXT)");
  }
  [[nodiscard]] std::int64_t count() const { return query(path, "SELECT count(*) FROM claims"); }
  [[nodiscard]] SqliteStore open() const { return SqliteStore{path}; }
  /// Inserts one claim in the store's transaction; returns the claims now committed or pending.
  static std::int64_t insert(SqliteTransaction& tx, const std::string& client) {
    tx.exec("INSERT INTO claims (client) VALUES (?)", client);
    return tx.query_int("SELECT count(*) FROM claims").value_or(0);
  }
};

/// The claims table on PostgreSQL, named per test.
struct PgClaims {
  using Store = PostgresStore;
  std::string uri;
  std::string table;

  void create() const {
    pqxx::connection c(uri);
    pqxx::work tx(c);
    detail::pq::exec(tx, "CREATE TABLE IF NOT EXISTS " + table +
                             "_claims (id BIGSERIAL PRIMARY KEY, client TEXT)");
    tx.commit();
  }
  /// Drops the log and the claims table of this test.
  void drop() const {
    pqxx::connection c(uri);
    pqxx::nontransaction tx(c);
    detail::pq::exec(
        tx, "DROP TABLE IF EXISTS " + table + ", " + table + "_mismatches, " + table + "_claims");
  }
  [[nodiscard]] std::int64_t count() const {
    pqxx::connection c(uri);
    pqxx::nontransaction tx(c);
    return detail::pq::exec(tx, "SELECT count(*) FROM " + table + "_claims")[0][0]
        .as<std::int64_t>();
  }
  [[nodiscard]] PostgresStore open() const {
    PostgresOptions o;
    o.table = table;
    o.pool_size = 8;  // a handler holds a connection while it runs: room for the others
    return PostgresStore{uri, o};
  }
  std::int64_t insert(pqxx::work& tx, const std::string& client) const {
    exec_params(tx, "INSERT INTO " + table + "_claims (client) VALUES ($1)", client);
    return detail::pq::exec(tx, "SELECT count(*) FROM " + table + "_claims")[0][0]
        .as<std::int64_t>();
  }
};

/// The claim handler: one row, and 201 with the claim's number and a header not replayed.
template <class Claims>
auto claim_handler(const Claims& claims, std::function<void()> after_write = {}) {
  return [&claims, after_write](typename Claims::Store::transaction& tx, const server::Request& r) {
    const std::int64_t n = claims.insert(tx, r.client);
    if (after_write) after_write();
    server::Response response{201, {}, "{\"claim\":" + std::to_string(n) + "}"};
    response.set_header("Content-Type", "application/json");
    response.set_header("Location", "/claims/" + std::to_string(n));
    response.set_header("X-Not-Stored", "first-answer-only");
    return response;
  };
}

}  // namespace idemgate::test
