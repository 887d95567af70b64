// SPDX-License-Identifier: MIT
// PostgresStore's one home for failure: what a failed attempt was (a broken connection, a COMMIT
// in doubt, a lost deadlock, the log's schema, anything else), how long to wait before the next,
// and the errors that say what to do.
#pragma once

#include "../../detail/durations.hpp"
#include "../../detail/postgres/connection_pool.hpp"
#include "../../detail/postgres/pqxx_compat.hpp"
#include "../../errors.hpp"
#include "../../key.hpp"

#include <pqxx/pqxx>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <string>
#include <string_view>

namespace idemgate::detail::postgres {

/// What a failed attempt of the store's work was.
enum class Failure {
  /// The connection broke, the COMMIT's outcome is unknown, the server is shutting down or
  /// starting (57P0x), the connection failed (08xxx), or it reached a standby (25006: after a
  /// failover, an old primary that came back read-only). Another connection may succeed; the
  /// attempt's connection is marked broken, so the pool reopens it.
  connection,
  /// The transaction lost a deadlock with concurrent work (overlapping batches lock rows in
  /// different orders) and was rolled back whole: it may run again at once.
  deadlock,
  /// Anything else, passed on unchanged: a `StoreError` (it says what to do already), the
  /// business write's own errors, a statement the server refused.
  other,
};

/// A classified failure, and the words that describe it for a log line or an error.
struct Classified {
  /// What it was.
  Failure kind;
  /// What the exception said.
  std::string why;
};

/// Whether an SQL error says this connection is no use any more but another may be (see
/// `Failure::connection`). Nothing was written: the work may run again on a fresh connection.
[[nodiscard]] inline bool reconnectable(const pqxx::sql_error& e) {
  const std::string state = pq::sqlstate(e);
  return state == "25006" || state.rfind("57P0", 0) == 0 || state.rfind("08", 0) == 0;
}

/// Whether an SQL error says the transaction was aborted earlier (25P02), or is gone (25P01).
[[nodiscard]] inline bool ended_transaction(const pqxx::sql_error& e) {
  const std::string state = pq::sqlstate(e);
  return state == "25P02" || state == "25P01";
}

/// The errors that name the log's table and say what to do.
class LogErrors {
 public:
  /// For the log `table`.
  explicit LogErrors(const std::string& table) : table_(table) {}

  /// The log's table does not exist.
  [[nodiscard]] StoreError missing_table() const {
    return StoreError("idemgate: the table " + table_ +
                      " does not exist; call PostgresStore::migrate() once, or apply "
                      "docs/schema.sql");
  }

  /// The log's table lacks a column this version writes.
  [[nodiscard]] StoreError outdated_table() const {
    return StoreError("idemgate: the table " + table_ +
                      " was created by an older version; call PostgresStore::migrate() once to "
                      "upgrade it (it only adds columns and indexes)");
  }

  /// A missing or outdated log table becomes the StoreError that says to migrate (thrown); a
  /// missing table of the caller's business write keeps its own error.
  void throw_if_schema_error(const pqxx::sql_error& e) const {
    if (!names_log_table(e)) return;
    if (dynamic_cast<const pqxx::undefined_table*>(&e) != nullptr) throw missing_table();
    if (dynamic_cast<const pqxx::undefined_column*>(&e) != nullptr) throw outdated_table();
  }

  /// A business write ended its transaction, or swallowed an SQL error and went on.
  [[nodiscard]] BusinessWriteError broken_transaction(const Key& key,
                                                      const std::string& detail) const {
    return BusinessWriteError(
        "idemgate: the business write of key " + key.hex() +
        " broke its transaction: it caught an SQL error (which ends a libpqxx transaction) or "
        "ended the transaction itself, and went on (" +
        detail + "). Nothing of the log was committed to " + table_ +
        ": the event stays as it was (in flight, its lease ended; or escalated, for a resolve). "
        "Statements the business write ran after the transaction ended were not part of it and "
        "may have committed on their own: check the business table for them. Let SQL errors "
        "propagate out of the business write, never end its transaction, and recover from an "
        "expected error inside a pqxx::subtransaction.");
  }

 private:
  // Whether a schema error is about the log (not about a table of the caller's business write).
  [[nodiscard]] bool names_log_table(const pqxx::sql_error& e) const {
    const std::string name = unqualified(table_);
    return pq::failed_query(e).find(name) != std::string::npos ||
           std::string(e.what()).find(name) != std::string::npos;
  }

  [[nodiscard]] static std::string unqualified(const std::string& table) {
    const auto dot = table.find('.');
    return dot == std::string::npos ? table : table.substr(dot + 1);
  }

  const std::string& table_;
};

/// What the failure `error` was; throws the `StoreError` that says to migrate for an error of
/// the log's own schema.
[[nodiscard]] inline Classified kind_of(const std::exception_ptr& error, const LogErrors& log) {
  try {
    std::rethrow_exception(error);
  } catch (const StoreError& e) {
    return {Failure::other, e.what()};
  } catch (const pqxx::broken_connection& e) {
    return {Failure::connection, e.what()};
  } catch (const pqxx::in_doubt_error& e) {
    return {Failure::connection, e.what()};
  } catch (const pqxx::deadlock_detected& e) {
    return {Failure::deadlock, e.what()};
  } catch (const pqxx::sql_error& e) {
    if (reconnectable(e)) return {Failure::connection, e.what()};
    log.throw_if_schema_error(e);
    return {Failure::other, e.what()};
  } catch (const std::exception& e) {
    return {Failure::other, e.what()};
  } catch (...) {
    return {Failure::other, "an exception that is not a std::exception"};
  }
}

/**
 * Classifies the failure `error` of an attempt that ran on `lease` (`kind_of`), and marks the
 * lease broken for a `Failure::connection`, so the pool reopens it. Every retry loop of the store
 * asks this.
 */
[[nodiscard]] inline Classified classify(const std::exception_ptr& error,
                                         ConnectionPool::Lease& lease, const LogErrors& log) {
  Classified failure = kind_of(error, log);
  if (failure.kind == Failure::connection) lease.mark_broken();
  return failure;
}

/// The pause after failed attempt `n` of a transaction: `first` doubled per attempt, at most
/// 5 s, of which a random quarter is taken off (`jitter` picks it) so that workers that failed
/// together retry apart.
template <class Jitter>
[[nodiscard]] std::chrono::milliseconds backoff(std::chrono::milliseconds first, int n,
                                                Jitter&& jitter) {
  using std::chrono::milliseconds;
  milliseconds pause = first;
  for (int i = 1; i < n && pause < milliseconds(5000); ++i) pause *= 2;
  pause = std::min(pause, milliseconds(5000));
  const auto quarter = pause.count() / 4;
  if (quarter > 0)
    pause -=
        milliseconds(static_cast<std::int64_t>(jitter() % static_cast<std::uint64_t>(quarter + 1)));
  return pause;
}

/// `text` without its trailing newlines and spaces (libpq ends its messages with one).
[[nodiscard]] inline std::string trimmed(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

}  // namespace idemgate::detail::postgres
