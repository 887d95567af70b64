#pragma once

// A terminal whose slots live in PostgreSQL tables, so that several processes (a consumer that
// is killed, the test that reconciles after it) see the same terminal. It honours idempotency
// keys through idemgate's own server side (an Endpoint over a log of its own, `<table>_idem`,
// whose handler writes the slot in the transaction that stores its answer), looks up by key
// through the endpoint's lookup, and logs every answer it gave.

#include "postgres.hpp"
#include "slot_request.hpp"

#include <idemgate/detail/postgres/pqxx_compat.hpp>
#include <idemgate/key.hpp>
#include <idemgate/outcome.hpp>
#include <idemgate/server/endpoint.hpp>
#include <idemgate/store/postgres.hpp>

#include <mutex>
#include <string>

namespace idemgate::test {

class PgTerminal {
 public:
  using request_type = SlotRequest;
  using outcome_type = std::string;
  static constexpr bool honours_idempotency_key = true;

  PgTerminal(const std::string& uri, std::string table)
      : connection_(uri),
        table_(std::move(table)),
        log_(uri, log_options(table_)),
        endpoint_("terminal.slots", log_) {}

  /// Creates the terminal's tables: its slots and the log of every answer it gave.
  static void create(const std::string& uri, const std::string& table) {
    pqxx::connection c(uri);
    pqxx::nontransaction tx(c);
    detail::pq::exec(tx, "DROP TABLE IF EXISTS " + table + ", " + table + "_answers, " + table +
                             "_idem, " + table + "_idem_mismatches");
    detail::pq::exec(tx, "CREATE TABLE " + table +
                             " (key bytea PRIMARY KEY, container text NOT NULL, slot text NOT "
                             "NULL, id bigserial)");
    detail::pq::exec(tx,
                     "CREATE TABLE " + table + "_answers (key bytea NOT NULL, slot text NOT NULL)");
    PostgresStore{uri, log_options(table)}.migrate();
  }

  ClaimResult<std::string> claim(const SlotRequest& request, const Key& key) {
    std::lock_guard lock(mutex_);
    const std::string k = detail::pq::bytea_param(key.view());
    server::Request claim{"POST",
                          "/slots",
                          "\"" + key.hex() + "\"",
                          "text/plain",
                          request.container + '\n' + request.window,
                          "",
                          ""};
    const server::Response answer =
        endpoint_.handle(claim, [&](pqxx::work& tx, const server::Request&) {
          detail::pq::exec_params(tx,
                                  "INSERT INTO " + table_ +
                                      " (key, container, slot) VALUES ($1::bytea, $2,"
                                      " 'ECTD-' || txid_current())",
                                  k, request.container);
          const auto rows = detail::pq::exec_params(
              tx, "SELECT slot FROM " + table_ + " WHERE key = $1::bytea", k);
          return server::Response{201, {}, rows[0][0].c_str()};
        });
    if (answer.status != 201)
      return TransientFailure{"the terminal answered " + std::to_string(answer.status) + ": " +
                              answer.body};
    pqxx::work tx(connection_);
    detail::pq::exec_params(tx, "INSERT INTO " + table_ + "_answers VALUES ($1::bytea, $2)", k,
                            answer.body);
    tx.commit();
    return answer.body;
  }

  LookupResult<std::string> lookup(const Key& key) {
    std::lock_guard lock(mutex_);
    const server::Response found = endpoint_.lookup("", "POST", "/slots", key.hex());
    if (found.status == 404) return NotFound{};
    if (found.status != 201) return TransientFailure{"the lookup answered " + found.body};
    return found.body;
  }

 private:
  static PostgresOptions log_options(const std::string& table) {
    PostgresOptions options;
    options.table = table + "_idem";
    return options;
  }

  std::mutex mutex_;
  pqxx::connection connection_;
  std::string table_;
  PostgresStore log_;
  server::Endpoint<PostgresStore> endpoint_;
};

}  // namespace idemgate::test
