// SPDX-License-Identifier: MIT
// PostgresStore's operator's queue and history: the manual queue, re-drives, rows by filter,
// causes and gates.
#pragma once

#include "../../detail/postgres/pqxx_compat.hpp"
#include "../../key.hpp"
#include "../../record.hpp"
#include "../log/row.hpp"
#include "../log/text.hpp"
#include "session.hpp"
#include "sql/operator.hpp"
#include "values.hpp"

#include <pqxx/pqxx>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace idemgate::detail::postgres {

/// What an operator sees and does: the manual queue and its resolution, re-drives of failed
/// events, rows listed and counted by filters, failures grouped by cause, the gates of the log.
class OperatorQueue {
 public:
  /// On the handle's scope.
  explicit OperatorQueue(Scope scope) noexcept : s_(scope.session), gate_(scope.gate) {}

  /// See `PostgresStore::escalated`.
  std::vector<Record> escalated(std::size_t limit) {
    return records(s_.run([&](Lease& c) {
      pqxx::nontransaction tx(c.connection());
      return s_.exec(c, tx, sql::postgres::escalated, gate_, sql_limit(limit));
    }));
  }

  /// See `PostgresStore::resolve`.
  template <class BusinessWrite>
  bool resolve(const Key& key, std::string_view result, BusinessWrite&& business) {
    const std::string literals[] = {"'" + gate_ + "'", pq::bytea_literal(key.view()),
                                    pq::bytea_literal(result)};
    const std::string update = s_.literal_text(sql::postgres::resolve, literals);
    const std::string key_param = pq::bytea_param(key.view());
    const RetriedWork resolving{
        "commit", &key, 0,
        "the row stays escalated unless the commit landed; find(key) tells which."};
    return s_.retrying(resolving, [&](Lease& c, int attempt) {
      if (attempt > 1) {
        // The previous attempt's COMMIT may have landed: never run the business write twice.
        pqxx::nontransaction check(c.connection());
        const pqxx::result rows = s_.exec(c, check, sql::postgres::find, gate_, key_param);
        if (rows.empty()) return false;
        const Record row = to_record(PqRow{rows[0]});
        if (row.status == RecordStatus::committed) return row.result == result;
        if (row.status != RecordStatus::escalated) return false;
      }
      pqxx::work tx(c.connection());
      // First, and checked like commit's (see there).
      s_.run_business_write(key, [&] { business(tx); });
      if (pq::affected_rows(s_.checked(tx, update, key)) == 0) return false;
      tx.commit();
      return true;
    });
  }

  /// See `PostgresStore::redrive_failed`.
  std::size_t redrive_failed(const Key& key) {
    return changed(sql::postgres::redrive_key, pq::bytea_param(key.view()));
  }

  /// See `PostgresStore::redrive_failed`.
  std::size_t redrive_failed(std::chrono::system_clock::time_point from,
                             std::chrono::system_clock::time_point to, std::size_t limit) {
    return changed(sql::postgres::redrive_range, sql_micros(from), sql_micros(to),
                   sql_limit(limit));
  }

  /// See `PostgresStore::redrive_cause`.
  std::size_t redrive_cause(std::string_view reason, std::size_t limit) {
    return changed(sql::postgres::redrive_cause, detail::stored_text(reason), sql_limit(limit));
  }

  /// See `PostgresStore::rows`.
  std::vector<Record> rows(const RowQuery& query) {
    return records(s_.run([&](Lease& c) {
      pqxx::nontransaction tx(c.connection());
      return with_query(query, [&](auto&&... params) {
        return s_.exec(c, tx, sql::postgres::rows, gate_, params..., sql_limit(query.limit));
      });
    }));
  }

  /// See `PostgresStore::count`.
  std::int64_t count(const RowQuery& query) {
    const pqxx::result found = s_.run([&](Lease& c) {
      pqxx::nontransaction tx(c.connection());
      return with_query(query, [&](auto&&... params) {
        return s_.exec(c, tx, sql::postgres::count, gate_, params..., std::int64_t{0});
      });
    });
    return pq::int_field(found[0][0]);
  }

  /// See `PostgresStore::causes`.
  std::vector<Cause> causes(std::size_t limit) {
    const pqxx::result found = s_.run([&](Lease& c) {
      pqxx::nontransaction tx(c.connection());
      return s_.exec(c, tx, sql::postgres::causes, gate_, sql_limit(limit));
    });
    std::vector<Cause> causes;
    causes.reserve(found.size());
    for (const pq::row& row : found)
      causes.push_back({parse_record_status(pq::text_field(row[0])), pq::text_field(row[1]),
                        pq::int_field(row[2]), from_micros(pq::int_field(row[3])),
                        from_micros(pq::int_field(row[4]))});
    return causes;
  }

  /// See `PostgresStore::gates`.
  std::vector<std::string> gates() {
    const pqxx::result found = s_.run([&](Lease& c) {
      pqxx::nontransaction tx(c.connection());
      return s_.exec(c, tx, sql::postgres::gates, gate_);
    });
    std::vector<std::string> names;
    names.reserve(found.size());
    for (const pq::row& row : found) names.push_back(pq::text_field(row[0]));
    return names;
  }

 private:
  // Runs an update of the operator's and answers how many rows it changed.
  template <class... Args>
  std::size_t changed(const sql::Statement& statement, const Args&... args) {
    return s_.run([&](Lease& c) {
      pqxx::nontransaction tx(c.connection());
      return static_cast<std::size_t>(pq::affected_rows(s_.exec(c, tx, statement, gate_, args...)));
    });
  }

  static std::vector<Record> records(const pqxx::result& found) {
    std::vector<Record> out;
    out.reserve(found.size());
    for (const pq::row& row : found) out.push_back(to_record(PqRow{row}));
    return out;
  }

  // Calls `exec` with an operator's query, its texts as the log keeps them
  // (`detail::stored_query`), as the parameters $2 to $9 of `rows` and `count`: a switch and a
  // value for each filter (libpqxx 6.4 binds no NULL parameters).
  template <class Exec>
  static pqxx::result with_query(const RowQuery& asked, Exec&& exec) {
    const RowQuery query = detail::stored_query(asked);
    const auto micros = [](const std::optional<std::chrono::system_clock::time_point>& at) {
      return at ? sql_micros(*at) : std::int64_t{0};
    };
    return exec(std::string(query.status ? to_string(*query.status) : std::string_view()),
                query.reason.has_value(), query.reason.value_or(std::string()),
                query.label_contains, query.changed_from.has_value(), micros(query.changed_from),
                query.changed_to.has_value(), micros(query.changed_to));
  }

  Session& s_;
  const std::string& gate_;
};

}  // namespace idemgate::detail::postgres
