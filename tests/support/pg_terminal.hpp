#pragma once

// A terminal whose slots live in PostgreSQL tables, so that several processes (a consumer that
// is killed, the test that reconciles after it) see the same terminal. It honours idempotency
// keys and can look up by key, and it logs every answer it gave.

#include "postgres.hpp"
#include "slot_request.hpp"

#include <idemgate/detail/postgres/pqxx_compat.hpp>
#include <idemgate/key.hpp>
#include <idemgate/outcome.hpp>

#include <mutex>
#include <string>

namespace idemgate::test {

class PgTerminal {
 public:
  using request_type = SlotRequest;
  using outcome_type = std::string;
  static constexpr bool honours_idempotency_key = true;

  PgTerminal(const std::string& uri, std::string table)
      : connection_(uri), table_(std::move(table)) {}

  /// Creates the terminal's tables: its slots and the log of every answer it gave.
  static void create(const std::string& uri, const std::string& table) {
    pqxx::connection c(uri);
    pqxx::nontransaction tx(c);
    detail::pq::exec(tx, "DROP TABLE IF EXISTS " + table + ", " + table + "_answers");
    detail::pq::exec(tx, "CREATE TABLE " + table +
                             " (key bytea PRIMARY KEY, container text NOT NULL, slot text NOT "
                             "NULL, id bigserial)");
    detail::pq::exec(tx,
                     "CREATE TABLE " + table + "_answers (key bytea NOT NULL, slot text NOT NULL)");
  }

  ClaimResult<std::string> claim(const SlotRequest& request, const Key& key) {
    std::lock_guard lock(mutex_);
    pqxx::work tx(connection_);
    const std::string k = detail::pq::bytea_param(key.view());
    detail::pq::exec_params(tx,
                            "INSERT INTO " + table_ +
                                " (key, container, slot) VALUES ($1::bytea, $2,"
                                " 'ECTD-' || txid_current()) ON CONFLICT (key) DO NOTHING",
                            k, request.container);
    const auto rows =
        detail::pq::exec_params(tx, "SELECT slot FROM " + table_ + " WHERE key = $1::bytea", k);
    const std::string slot = rows[0][0].c_str();
    detail::pq::exec_params(tx, "INSERT INTO " + table_ + "_answers VALUES ($1::bytea, $2)", k,
                            slot);
    tx.commit();
    return slot;
  }

  LookupResult<std::string> lookup(const Key& key) {
    std::lock_guard lock(mutex_);
    pqxx::nontransaction tx(connection_);
    const auto rows =
        detail::pq::exec_params(tx, "SELECT slot FROM " + table_ + " WHERE key = $1::bytea",
                                detail::pq::bytea_param(key.view()));
    if (rows.empty()) return NotFound{};
    return std::string(rows[0][0].c_str());
  }

 private:
  std::mutex mutex_;
  pqxx::connection connection_;
  std::string table_;
};

}  // namespace idemgate::test
