#pragma once

#include "../concepts.hpp"
#include "../detail/connection_pool.hpp"
#include "../detail/pqxx_compat.hpp"
#include "../record.hpp"

#include <cctype>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace idemgate {

/// Tuning of a `PostgresStore`.
struct PostgresOptions {
  /// The idempotency log's table, optionally schema-qualified (`ops.idemgate_log`).
  std::string table = "idemgate_log";
  /// Connections in the store's pool. Worker threads share them; each call checks one out.
  std::size_t pool_size = 1;
  /// How long a call waits for a free connection before it throws `StoreError`.
  std::chrono::milliseconds checkout_timeout = std::chrono::seconds(30);
  /// How often a commit whose connection broke is tried again on a fresh connection. Safe:
  /// the fence makes a repeated commit a no-op once one attempt landed.
  int commit_attempts = 3;
};

namespace detail {

inline bool is_identifier(std::string_view part) {
  if (part.empty() || part.size() > 63) return false;
  auto first = static_cast<unsigned char>(part.front());
  if (!(std::isalpha(first) || first == '_')) return false;
  for (char c : part) {
    auto u = static_cast<unsigned char>(c);
    if (!(std::isalnum(u) || u == '_')) return false;
  }
  return true;
}

/// Checks a (schema-qualified) table name; throws `std::invalid_argument` with what to do.
inline std::string checked_table_name(std::string table) {
  const auto dot = table.find('.');
  const bool ok = dot == std::string::npos
                      ? is_identifier(table)
                      : is_identifier(std::string_view(table).substr(0, dot)) &&
                            is_identifier(std::string_view(table).substr(dot + 1));
  if (!ok)
    throw std::invalid_argument("idemgate: \"" + table +
                                "\" is not a usable table name; use letters, digits and "
                                "underscores, optionally as schema.table");
  return table;
}

inline std::string unqualified(const std::string& table) {
  const auto dot = table.find('.');
  return dot == std::string::npos ? table : table.substr(dot + 1);
}

inline std::chrono::system_clock::time_point from_micros(std::int64_t micros) {
  return std::chrono::system_clock::time_point(std::chrono::microseconds(micros));
}

}  // namespace detail

/**
 * The production store: an idempotency log in PostgreSQL, through libpqxx.
 *
 * Thread-safe: it owns a fixed pool of `PostgresOptions::pool_size` connections, and every call
 * checks one out for the length of its statement or transaction, so N worker threads can share
 * one store over M connections. Broken connections are reopened on their next checkout.
 *
 * Example:
 *   idemgate::PostgresStore store{"postgresql://app@127.0.0.1/app", {.pool_size = 4}};
 *   store.migrate();
 */
class PostgresStore {
 public:
  /// The business write's transaction: write your business rows with it.
  using transaction = pqxx::work;

  /// Connects to `uri` (the first connection opens now, so a bad URI throws `StoreError` here).
  explicit PostgresStore(std::string uri, PostgresOptions options = {})
      : options_(std::move(options)),
        table_(detail::checked_table_name(options_.table)),
        sql_(statements(table_)),
        pool_(std::move(uri), options_.pool_size, options_.checkout_timeout) {}

  /// The schema for a table name: the log, its constraints and the partial in-flight index.
  /// Also shipped as `docs/schema.sql`.
  [[nodiscard]] static std::string schema_sql(const std::string& table = "idemgate_log") {
    const std::string t = detail::checked_table_name(table);
    const std::string index = detail::unqualified(t) + "_in_flight";
    return "CREATE TABLE IF NOT EXISTS " + t +
           " (\n"
           "  key         bytea       PRIMARY KEY CHECK (octet_length(key) = 32),\n"
           "  status      text        NOT NULL\n"
           "              CHECK (status IN ('in_flight', 'committed', 'failed', 'escalated')),\n"
           "  fence       bigint      NOT NULL DEFAULT 1 CHECK (fence > 0),\n"
           "  lease_until timestamptz NOT NULL,\n"
           "  fingerprint bytea       NOT NULL CHECK (octet_length(fingerprint) = 32),\n"
           "  request     bytea       NOT NULL,\n"
           "  result      bytea,\n"
           "  reason      text,\n"
           "  created_at  timestamptz NOT NULL DEFAULT now(),\n"
           "  updated_at  timestamptz NOT NULL DEFAULT now(),\n"
           "  CHECK (status <> 'committed' OR result IS NOT NULL)\n"
           ");\n"
           "CREATE INDEX IF NOT EXISTS " +
           index + " ON " + t + " (lease_until) WHERE status = 'in_flight';\n";
  }

  /// Creates the table and index if missing. Idempotent and safe from several processes at once.
  void migrate() {
    run([&](pqxx::connection& c) {
      pqxx::work tx(c);
      // Serialises concurrent migrations: CREATE ... IF NOT EXISTS alone can race.
      detail::pq::exec(tx, "SELECT pg_advisory_xact_lock(7158029411)");
      detail::pq::exec(tx, schema_sql(table_));
      tx.commit();
      return 0;
    });
  }

  /// Inserts the key as in flight in one statement, takes over an expired lease with a fence
  /// bump, or reports what is stored.
  Reservation reserve(const Key& key, const Fingerprint& fingerprint, std::string_view request,
                      std::chrono::milliseconds lease) {
    const std::string key_param = detail::pq::bytea_param(key.view());
    const std::string fingerprint_param = detail::pq::bytea_param(
        {reinterpret_cast<const char*>(fingerprint.data()), fingerprint.size()});
    const std::string request_param = detail::pq::bytea_param(request);
    const auto lease_ms = static_cast<std::int64_t>(lease.count());
    // Under READ COMMITTED the conflicting row may have committed after this statement's
    // snapshot: the insert then does nothing and the read sees nothing. A new statement has a
    // new snapshot, so the loop ends as soon as the row is visible (or released and free).
    for (int attempt = 0; attempt < 32; ++attempt) {
      pqxx::result rows = run([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        return detail::pq::exec_prepared(tx, "idemgate_reserve", key_param, fingerprint_param,
                                         request_param, lease_ms);
      });
      if (rows.empty()) continue;
      const pqxx::row row = rows[0];
      const std::int64_t fence = detail::pq::int_field(row[1]);
      if (detail::pq::bool_field(row[0])) return Reservation::acquired(fence);
      Reservation found =
          Reservation::existing(fence, parse_record_status(detail::pq::text_field(row[2])),
                                detail::pq::bool_field(row[3]), detail::pq::bytea_field(row[5]),
                                detail::pq::text_field(row[6]));
      const bool lease_live = detail::pq::bool_field(row[4]);
      if (found.status == RecordStatus::in_flight && found.same_request && !lease_live) {
        pqxx::result taken = run([&](pqxx::connection& c) {
          pqxx::nontransaction tx(c);
          return detail::pq::exec_prepared(tx, "idemgate_take_over", key_param, fence, lease_ms);
        });
        if (!taken.empty()) return Reservation::taken_over(detail::pq::int_field(taken[0][0]));
      }
      return found;
    }
    throw StoreError("idemgate: the reservation of key " + key.hex() +
                     " kept racing with concurrent releases; the store is overloaded. Do not ack;"
                     " the redelivery will try again.");
  }

  /// Runs `business` and marks the key committed with `result`, in one transaction, only if
  /// `fence` still holds. A broken connection is retried on a fresh one (the fence makes a
  /// repeated commit a no-op once one attempt landed).
  template <class BusinessWrite>
  CommitStatus commit(const Key& key, std::int64_t fence, std::string_view result,
                      BusinessWrite&& business) {
    const std::string key_param = detail::pq::bytea_param(key.view());
    const std::string result_param = detail::pq::bytea_param(result);
    for (int attempt = 1;; ++attempt) {
      auto lease = pool_.acquire();
      try {
        prepare_once(lease);
        pqxx::work tx(lease.connection());
        const pqxx::result updated =
            detail::pq::exec_prepared(tx, "idemgate_commit", key_param, fence, result_param);
        if (detail::pq::affected_rows(updated) == 0) {
          tx.abort();
          return settled_earlier(key_param, fence, RecordStatus::committed);
        }
        business(tx);
        tx.commit();
        return CommitStatus::committed;
      } catch (const pqxx::broken_connection& e) {
        lease.mark_broken();
        if (attempt >= options_.commit_attempts) throw commit_unknown(key, e);
      } catch (const pqxx::in_doubt_error& e) {
        lease.mark_broken();
        if (attempt >= options_.commit_attempts) throw commit_unknown(key, e);
      } catch (const pqxx::undefined_table&) {
        throw missing_table();
      }
    }
  }

  /// Stores a permanent failure, only if `fence` still holds.
  CommitStatus fail(const Key& key, std::int64_t fence, std::string_view reason) {
    return settle("idemgate_fail", key, fence, reason, RecordStatus::failed);
  }

  /// Parks the key for a human, only if `fence` still holds.
  CommitStatus escalate(const Key& key, std::int64_t fence, std::string_view reason) {
    return settle("idemgate_escalate", key, fence, reason, RecordStatus::escalated);
  }

  /// Deletes an in-flight reservation this caller holds, so the next delivery can take it.
  bool release(const Key& key, std::int64_t fence) {
    const std::string key_param = detail::pq::bytea_param(key.view());
    return run([&](pqxx::connection& c) {
      pqxx::nontransaction tx(c);
      return detail::pq::affected_rows(
                 detail::pq::exec_prepared(tx, "idemgate_release", key_param, fence)) > 0;
    });
  }

  /// The stored row, if any.
  std::optional<Record> find(const Key& key) {
    const std::string key_param = detail::pq::bytea_param(key.view());
    pqxx::result rows = run([&](pqxx::connection& c) {
      pqxx::nontransaction tx(c);
      return detail::pq::exec_prepared(tx, "idemgate_find", key_param);
    });
    if (rows.empty()) return std::nullopt;
    return to_record(rows[0]);
  }

  /// Takes over up to `limit` in-flight rows whose lease expired and that have not changed for
  /// `stale_after`, bumping their fence; rows another reconciler is taking are skipped.
  std::vector<Stranded> take_stale(std::size_t limit, std::chrono::milliseconds stale_after,
                                   std::chrono::milliseconds lease) {
    pqxx::result rows = run([&](pqxx::connection& c) {
      pqxx::nontransaction tx(c);
      return detail::pq::exec_prepared(
          tx, "idemgate_take_stale", static_cast<std::int64_t>(stale_after.count()),
          static_cast<std::int64_t>(limit), static_cast<std::int64_t>(lease.count()));
    });
    std::vector<Stranded> taken;
    taken.reserve(rows.size());
    for (const pqxx::row& row : rows)
      taken.push_back(
          {key_from(row[0]), detail::pq::int_field(row[1]), detail::pq::bytea_field(row[2])});
    return taken;
  }

  /// Up to `limit` escalated rows, oldest first.
  std::vector<Record> escalated(std::size_t limit) {
    pqxx::result rows = run([&](pqxx::connection& c) {
      pqxx::nontransaction tx(c);
      return detail::pq::exec_prepared(tx, "idemgate_escalated", static_cast<std::int64_t>(limit));
    });
    std::vector<Record> parked;
    parked.reserve(rows.size());
    for (const pqxx::row& row : rows) parked.push_back(to_record(row));
    return parked;
  }

  /// Commits an escalated row with `result` and the business write in one transaction; false
  /// if the row is not escalated (already resolved, or never parked).
  template <class BusinessWrite>
  bool resolve(const Key& key, std::string_view result, BusinessWrite&& business) {
    const std::string key_param = detail::pq::bytea_param(key.view());
    const std::string result_param = detail::pq::bytea_param(result);
    return run([&](pqxx::connection& c) {
      pqxx::work tx(c);
      const pqxx::result updated =
          detail::pq::exec_prepared(tx, "idemgate_resolve", key_param, result_param);
      if (detail::pq::affected_rows(updated) == 0) return false;
      business(tx);
      tx.commit();
      return true;
    });
  }

  /// The table this store writes.
  [[nodiscard]] const std::string& table() const noexcept { return table_; }

  /// Checks a connection out of the store's pool, for work beside the gate (tests, tools).
  detail::ConnectionPool::Lease connection() { return pool_.acquire(); }

 private:
  struct Statements {
    std::string reserve, take_over, commit, fail, escalate, release, find, take_stale, escalated,
        resolve, settled;
  };

  static Statements statements(const std::string& t) {
    const std::string columns =
        "key, status, fence, request, fingerprint, result, reason, "
        "(extract(epoch FROM created_at) * 1000000)::bigint, "
        "(extract(epoch FROM updated_at) * 1000000)::bigint, "
        "(extract(epoch FROM lease_until) * 1000000)::bigint";
    Statements s;
    s.reserve =
        "WITH claimed AS (INSERT INTO " + t +
        " (key, status, fence, lease_until, fingerprint, request)"
        " VALUES ($1::bytea, 'in_flight', 1, now() + $4::bigint * interval '1 millisecond',"
        " $2::bytea, $3::bytea)"
        " ON CONFLICT (key) DO NOTHING RETURNING fence)"
        " SELECT true, fence, NULL::text, NULL::boolean, NULL::boolean, NULL::bytea, NULL::text"
        " FROM claimed"
        " UNION ALL"
        " SELECT false, fence, status, fingerprint = $2::bytea, lease_until >= now(), result,"
        " reason FROM " +
        t + " WHERE key = $1::bytea AND NOT EXISTS (SELECT 1 FROM claimed)";
    s.take_over = "UPDATE " + t +
                  " SET fence = fence + 1, lease_until = now() + $3::bigint * interval '1 "
                  "millisecond', updated_at = now()"
                  " WHERE key = $1::bytea AND status = 'in_flight' AND fence = $2::bigint"
                  " AND lease_until < now() RETURNING fence";
    s.commit = "UPDATE " + t +
               " SET status = 'committed', result = $3::bytea, updated_at = now()"
               " WHERE key = $1::bytea AND status = 'in_flight' AND fence = $2::bigint";
    s.fail = "UPDATE " + t +
             " SET status = 'failed', reason = $3::text, updated_at = now()"
             " WHERE key = $1::bytea AND status = 'in_flight' AND fence = $2::bigint";
    s.escalate = "UPDATE " + t +
                 " SET status = 'escalated', reason = $3::text, updated_at = now()"
                 " WHERE key = $1::bytea AND status = 'in_flight' AND fence = $2::bigint";
    s.release = "DELETE FROM " + t +
                " WHERE key = $1::bytea AND status = 'in_flight' AND fence = $2::bigint";
    s.find = "SELECT " + columns + " FROM " + t + " WHERE key = $1::bytea";
    s.take_stale =
        "WITH stale AS (SELECT key FROM " + t +
        " WHERE status = 'in_flight' AND lease_until < now()"
        " AND updated_at <= now() - $1::bigint * interval '1 millisecond'"
        " ORDER BY lease_until LIMIT $2::bigint FOR UPDATE SKIP LOCKED)"
        " UPDATE " +
        t +
        " AS log SET fence = log.fence + 1,"
        " lease_until = now() + $3::bigint * interval '1 millisecond', updated_at = now()"
        " FROM stale WHERE log.key = stale.key RETURNING log.key, log.fence, log.request";
    s.escalated = "SELECT " + columns + " FROM " + t +
                  " WHERE status = 'escalated' ORDER BY updated_at LIMIT $1::bigint";
    s.resolve = "UPDATE " + t +
                " SET status = 'committed', result = $2::bytea, updated_at = now()"
                " WHERE key = $1::bytea AND status = 'escalated'";
    s.settled = "SELECT status, fence FROM " + t + " WHERE key = $1::bytea";
    return s;
  }

  // Statements are prepared on a connection's first use, not when it opens: the table may not
  // exist until migrate() has run.
  void prepare_once(detail::ConnectionPool::Lease& lease) {
    if (lease.ready()) return;
    prepare(lease.connection());
    lease.set_ready();
  }

  void prepare(pqxx::connection& c) {
    detail::pq::prepare(c, "idemgate_reserve", sql_.reserve);
    detail::pq::prepare(c, "idemgate_take_over", sql_.take_over);
    detail::pq::prepare(c, "idemgate_commit", sql_.commit);
    detail::pq::prepare(c, "idemgate_fail", sql_.fail);
    detail::pq::prepare(c, "idemgate_escalate", sql_.escalate);
    detail::pq::prepare(c, "idemgate_release", sql_.release);
    detail::pq::prepare(c, "idemgate_find", sql_.find);
    detail::pq::prepare(c, "idemgate_take_stale", sql_.take_stale);
    detail::pq::prepare(c, "idemgate_escalated", sql_.escalated);
    detail::pq::prepare(c, "idemgate_resolve", sql_.resolve);
    detail::pq::prepare(c, "idemgate_settled", sql_.settled);
  }

  // Runs one unit of work on a pooled connection. A connection that broke before or during
  // the work is replaced and the work tried once more: every statement run this way is safe to
  // repeat (inserts conflict, updates are fenced).
  template <class Work>
  auto run(Work&& work) -> std::invoke_result_t<Work&, pqxx::connection&> {
    for (int attempt = 1;; ++attempt) {
      auto lease = pool_.acquire();
      try {
        prepare_once(lease);
        return work(lease.connection());
      } catch (const pqxx::broken_connection& e) {
        lease.mark_broken();
        if (attempt >= 2)
          throw StoreError(std::string("idemgate: lost the connection to PostgreSQL at ") +
                           pool_.redacted_uri() + " (" + e.what() +
                           "). Do not ack; the redelivery will try again once the database is "
                           "back.");
      } catch (const pqxx::undefined_table&) {
        throw missing_table();
      }
    }
  }

  // After a fenced update touched no row: was it this fence's own earlier attempt that landed?
  CommitStatus settled_earlier(const std::string& key_param, std::int64_t fence,
                               RecordStatus target) {
    pqxx::result rows = run([&](pqxx::connection& c) {
      pqxx::nontransaction tx(c);
      return detail::pq::exec_prepared(tx, "idemgate_settled", key_param);
    });
    if (!rows.empty() && parse_record_status(detail::pq::text_field(rows[0][0])) == target &&
        detail::pq::int_field(rows[0][1]) == fence)
      return CommitStatus::committed;
    return CommitStatus::lost_lease;
  }

  CommitStatus settle(const char* statement, const Key& key, std::int64_t fence,
                      std::string_view reason, RecordStatus target) {
    const std::string key_param = detail::pq::bytea_param(key.view());
    const std::string reason_text(reason);
    const bool updated = run([&](pqxx::connection& c) {
      pqxx::nontransaction tx(c);
      return detail::pq::affected_rows(
                 detail::pq::exec_prepared(tx, statement, key_param, fence, reason_text)) > 0;
    });
    return updated ? CommitStatus::committed : settled_earlier(key_param, fence, target);
  }

  StoreError missing_table() const {
    return StoreError("idemgate: the table " + table_ +
                      " does not exist; call PostgresStore::migrate() once, or apply "
                      "docs/schema.sql");
  }

  StoreError commit_unknown(const Key& key, const std::exception& e) const {
    return StoreError("idemgate: the commit of key " + key.hex() +
                      " could not be confirmed after " + std::to_string(options_.commit_attempts) +
                      " attempts (" + e.what() +
                      "). Do not ack: the row stays in flight and a redelivery after its lease, "
                      "or the reconciler, finishes it.");
  }

  static Key key_from(const pqxx::field& field) {
    const std::string bytes = detail::pq::bytea_field(field);
    Key::bytes_type raw{};
    if (bytes.size() != raw.size())
      throw StoreError("idemgate: the store holds a key of " + std::to_string(bytes.size()) +
                       " bytes; expected 32");
    std::memcpy(raw.data(), bytes.data(), raw.size());
    return Key(raw);
  }

  static Record to_record(const pqxx::row& row) {
    Record record;
    record.key = key_from(row[0]);
    record.status = parse_record_status(detail::pq::text_field(row[1]));
    record.fence = detail::pq::int_field(row[2]);
    record.request = detail::pq::bytea_field(row[3]);
    const std::string fingerprint = detail::pq::bytea_field(row[4]);
    if (fingerprint.size() == record.fingerprint.size())
      std::memcpy(record.fingerprint.data(), fingerprint.data(), fingerprint.size());
    if (!row[5].is_null()) record.result = detail::pq::bytea_field(row[5]);
    record.reason = detail::pq::text_field(row[6]);
    record.created_at = detail::from_micros(detail::pq::int_field(row[7]));
    record.updated_at = detail::from_micros(detail::pq::int_field(row[8]));
    record.lease_until = detail::from_micros(detail::pq::int_field(row[9]));
    return record;
  }

  PostgresOptions options_;
  std::string table_;
  Statements sql_;
  detail::ConnectionPool pool_;
};

static_assert(store<PostgresStore>);

}  // namespace idemgate
