// SPDX-License-Identifier: MIT
// PostgresStore's retention and signals: the health signals, the mismatches, and the purge of
// finished rows.
#pragma once

#include "../../detail/postgres/pqxx_compat.hpp"
#include "../../key.hpp"
#include "../../record.hpp"
#include "../log/row.hpp"
#include "../log/text.hpp"
#include "session.hpp"
#include "sql/monitoring.hpp"
#include "values.hpp"

#include <pqxx/pqxx>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace idemgate::detail::postgres {

/// What keeps a gate's log watched and small: its signals, the downstream answers that differed
/// from the stored one, and retention.
class Monitoring {
 public:
  /// On the handle's scope.
  explicit Monitoring(Scope scope) noexcept : s_(scope.session), gate_(scope.gate) {}

  /// See `PostgresStore::signals`.
  StoreSignals signals(std::chrono::seconds window) {
    const pqxx::result rows = s_.run([&](Lease& c) {
      pqxx::nontransaction tx(c.connection());
      return s_.exec(c, tx, sql::postgres::signals, gate_,
                     sql_duration<std::chrono::seconds>(window));
    });
    // The oldest in-flight row comes as its age in seconds.
    StoreSignals s = signals_from(PqRow{rows[0]}, window,
                                  [](std::int64_t age) { return std::chrono::seconds(age); });
    s.oldest_snapshot = std::chrono::seconds(pq::int_field(rows[0][8]));
    s.oldest_snapshot_holder = pq::text_field(rows[0][9]);
    return s;
  }

  /// See `PostgresStore::record_mismatch`.
  void record_mismatch(const Key& key, std::string_view stored, std::string_view observed,
                       std::string_view source) {
    const std::string key_param = pq::bytea_param(key.view());
    const std::string stored_param = pq::bytea_param(stored);
    const std::string observed_param = pq::bytea_param(observed);
    const std::string source_text = detail::stored_text(source);
    s_.run([&](Lease& c) {
      pqxx::nontransaction tx(c.connection());
      return s_.exec(c, tx, sql::postgres::record_mismatch, gate_, key_param, stored_param,
                     observed_param, source_text);
    });
  }

  /// See `PostgresStore::mismatches`.
  std::vector<Mismatch> mismatches(std::size_t limit) {
    const pqxx::result rows = s_.run([&](Lease& c) {
      pqxx::nontransaction tx(c.connection());
      return s_.exec(c, tx, sql::postgres::mismatches, gate_, sql_limit(limit));
    });
    std::vector<Mismatch> found;
    found.reserve(rows.size());
    for (const pq::row& row : rows)
      found.push_back({key_from(pq::bytea_field(row[0])), pq::bytea_field(row[1]),
                       pq::bytea_field(row[2]), pq::text_field(row[3]),
                       from_micros(pq::int_field(row[4]))});
    return found;
  }

  /// See `PostgresStore::purge`.
  std::size_t purge(std::chrono::seconds older_than, std::size_t batch) {
    return delete_in_batches(sql::postgres::purge, older_than, batch);
  }

  /// See `PostgresStore::purge_abandoned`.
  std::size_t purge_abandoned(std::chrono::seconds older_than, std::size_t batch) {
    return delete_in_batches(sql::postgres::purge_abandoned, older_than, batch);
  }

  /// See `PostgresStore::expire`.
  bool expire(const Key& key, std::chrono::seconds lifetime) {
    return s_.run([&](Lease& c) {
      pqxx::nontransaction tx(c.connection());
      return pq::affected_rows(s_.exec(c, tx, sql::postgres::expire, gate_,
                                       pq::bytea_param(key.view()),
                                       sql_duration<std::chrono::seconds>(lifetime))) > 0;
    });
  }

  /// VACUUM of the log after a purge. Autovacuum alone visits a table at most once per
  /// autovacuum_naptime (a minute by default): a log whose rows are purged as fast as they
  /// arrive would meanwhile fill with dead rows that every scan of the purge steps over.
  void vacuum_log() { s_.vacuum_after_purge(s_.render(sql::postgres::vacuum.text), s_.table()); }

 private:
  // Runs `statement` (`$1 gate, $2 older than (s), $3 limit`), each batch its own statement,
  // until a batch deletes fewer than `batch` rows; a VACUUM of the log follows when it deleted
  // any.
  std::size_t delete_in_batches(const sql::Statement& statement, std::chrono::seconds older_than,
                                std::size_t batch) {
    std::size_t deleted = 0;
    for (;;) {
      const std::int64_t n = s_.run([&](Lease& c) {
        pqxx::nontransaction tx(c.connection());
        return pq::affected_rows(s_.exec(c, tx, statement, gate_,
                                         sql_duration<std::chrono::seconds>(older_than),
                                         sql_limit(batch)));
      });
      deleted += static_cast<std::size_t>(n);
      if (n == 0 || static_cast<std::size_t>(n) < batch) break;
    }
    if (deleted > 0) vacuum_log();
    return deleted;
  }

  Session& s_;
  const std::string& gate_;
};

}  // namespace idemgate::detail::postgres
