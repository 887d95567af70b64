#pragma once

#include "../concepts.hpp"
#include "../detail/connection_pool.hpp"
#include "../detail/durations.hpp"
#include "../detail/pqxx_compat.hpp"
#include "../record.hpp"
#include "../signals.hpp"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <span>
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
  /// Reservations commit without waiting for the WAL flush (`synchronous_commit = off` on a
  /// second pool of `pool_size` connections, so no round trip is added); commits stay durable.
  /// Exclusion between concurrent deliveries is unchanged, but a database crash may lose
  /// reservations made in the last moments before it: a redelivery then claims again, and only
  /// the downstream's idempotency key prevents a double effect. Off by default; a `Gate` refuses
  /// it with a downstream that does not honour keys.
  bool relaxed_reservations = false;
};

namespace detail {

/// Longest table name: PostgreSQL cuts identifiers at 63 bytes, and the index names add up to
/// 14 characters to it.
inline constexpr std::size_t max_table_name = 48;

inline bool is_identifier(std::string_view part) {
  if (part.empty() || part.size() > max_table_name) return false;
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
                                "\" is not a usable table name; use up to 48 letters, digits "
                                "and underscores, optionally as schema.table");
  return table;
}

inline std::string unqualified(const std::string& table) {
  const auto dot = table.find('.');
  return dot == std::string::npos ? table : table.substr(dot + 1);
}

/// A row count as a SQL LIMIT: sizes beyond what bigint holds mean "no limit".
inline std::int64_t sql_limit(std::size_t limit) {
  constexpr auto most = static_cast<std::size_t>(std::numeric_limits<std::int64_t>::max());
  return static_cast<std::int64_t>(limit > most ? most : limit);
}

/// Longest duration given to PostgreSQL's interval arithmetic: 1000 years (of 365.25 days), so
/// `now() ± d` stays far inside timestamptz's range. Longer durations are clamped to it, which
/// for rows this store stamps with now() means forever: a lease never expires, a row is never
/// stale, nothing is purged.
inline constexpr std::chrono::seconds max_sql_duration{31'557'600'000};

/// `d` in whole `Unit`s as a bigint parameter, clamped to ±`max_sql_duration`.
template <class Unit, class Rep, class Period>
[[nodiscard]] inline std::int64_t sql_duration(std::chrono::duration<Rep, Period> d) {
  const std::int64_t most = saturating_cast<Unit>(max_sql_duration).count();
  return std::clamp<std::int64_t>(saturating_cast<Unit>(d).count(), -most, most);
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
 * Durations given to its methods are clamped to ±1000 years (`detail::max_sql_duration`), so
 * PostgreSQL's interval arithmetic never overflows: `duration::max()` means forever.
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
      : options_([&] {
          using std::chrono::milliseconds;
          detail::require_in_range("PostgresOptions::pool_size", options.pool_size, std::size_t{1},
                                   std::size_t{1000},
                                   "It is the connections this store opens (default 1).");
          detail::require_in_range("PostgresOptions::checkout_timeout", options.checkout_timeout,
                                   milliseconds(1), std::chrono::hours(1),
                                   "It is how long a call waits for a free connection (default "
                                   "30 s).");
          if (options.commit_attempts < 1 || options.commit_attempts > 100)
            throw std::invalid_argument("idemgate: PostgresOptions::commit_attempts is " +
                                        std::to_string(options.commit_attempts) +
                                        "; it must be between 1 and 100. It is how often a commit "
                                        "whose connection broke is tried (default 3).");
          return std::move(options);
        }()),
        table_(detail::checked_table_name(options_.table)),
        sql_(statements(table_)),
        pool_(uri, options_.pool_size, options_.checkout_timeout) {
    if (options_.relaxed_reservations)
      relaxed_pool_ = std::make_unique<detail::ConnectionPool>(
          uri, options_.pool_size, options_.checkout_timeout, "SET synchronous_commit = off");
  }

  /// The schema for a table name: the log, its constraints and the partial in-flight index.
  /// Also shipped as `docs/schema.sql`.
  [[nodiscard]] static std::string schema_sql(const std::string& table = "idemgate_log") {
    const std::string t = detail::checked_table_name(table);
    const std::string name = detail::unqualified(t);
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
           "  duplicates  bigint      NOT NULL DEFAULT 0,\n"
           "  created_at  timestamptz NOT NULL DEFAULT now(),\n"
           "  updated_at  timestamptz NOT NULL DEFAULT now(),\n"
           "  CHECK (status <> 'committed' OR result IS NOT NULL)\n"
           ");\n"
           "-- Added in 0.1: logs created before it gain the column here.\n"
           "ALTER TABLE " +
           t +
           " ADD COLUMN IF NOT EXISTS duplicates bigint NOT NULL DEFAULT 0;\n"
           "-- Stranded work: the reconciler's scan and the oldest in-flight row.\n"
           "CREATE INDEX IF NOT EXISTS " +
           name + "_in_flight ON " + t +
           " (lease_until) WHERE status = 'in_flight';\n"
           "-- The manual queue.\n"
           "CREATE INDEX IF NOT EXISTS " +
           name + "_escalated ON " + t +
           " (updated_at) WHERE status = 'escalated';\n"
           "-- Retention and the signals' window; BRIN stays tiny on an append-mostly column.\n"
           "CREATE INDEX IF NOT EXISTS " +
           name + "_created ON " + t +
           " USING brin (created_at);\n"
           "-- Downstream answers that differed from the stored one (healthy: empty).\n"
           "CREATE TABLE IF NOT EXISTS " +
           t +
           "_mismatches (\n"
           "  key         bytea       NOT NULL,\n"
           "  stored      bytea       NOT NULL,\n"
           "  observed    bytea       NOT NULL,\n"
           "  source      text        NOT NULL,\n"
           "  at          timestamptz NOT NULL DEFAULT now()\n"
           ");\n"
           "CREATE INDEX IF NOT EXISTS " +
           name + "_mismatches_at ON " + t + "_mismatches (at);\n";
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
    const auto lease_ms = detail::sql_duration<std::chrono::milliseconds>(lease);
    // Under READ COMMITTED the conflicting row may have committed after this statement's
    // snapshot: the insert then does nothing and the read sees nothing. A new statement has a
    // new snapshot, so the loop ends as soon as the row is visible.
    for (int attempt = 0; attempt < 32; ++attempt) {
      pqxx::result rows = run_on(reservation_pool(), [&](pqxx::connection& c) {
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
        pqxx::result taken = run_on(reservation_pool(), [&](pqxx::connection& c) {
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
        // The business write goes first and the fenced update last: if the business write
        // swallowed an error of its own, the transaction is aborted on the server and the
        // update throws, instead of COMMIT quietly rolling back a "processed" event.
        business(tx);
        const pqxx::result updated =
            detail::pq::exec_prepared(tx, "idemgate_commit", key_param, fence, result_param);
        if (detail::pq::affected_rows(updated) == 0) {
          tx.abort();
          pqxx::nontransaction check(lease.connection());
          return settled_earlier(check, key_param, fence, RecordStatus::committed);
        }
        tx.commit();
        return CommitStatus::committed;
      } catch (const pqxx::broken_connection& e) {
        lease.mark_broken();
        if (attempt >= options_.commit_attempts) throw commit_unknown(key, e);
      } catch (const pqxx::in_doubt_error& e) {
        lease.mark_broken();
        if (attempt >= options_.commit_attempts) throw commit_unknown(key, e);
      } catch (const pqxx::sql_error& e) {
        throw_if_log_schema_error(e);
        throw;  // anything else, the business write's own errors included, unchanged
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

  /// Gives back an in-flight reservation this caller holds after a transient failure: its lease
  /// ends now, so the next delivery takes the key over at once (with a higher fence). False when
  /// the fence no longer holds.
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
          tx, "idemgate_take_stale", detail::sql_duration<std::chrono::milliseconds>(stale_after),
          detail::sql_limit(limit), detail::sql_duration<std::chrono::milliseconds>(lease));
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
      return detail::pq::exec_prepared(tx, "idemgate_escalated", detail::sql_limit(limit));
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
      business(tx);  // first, so an error it swallowed aborts the update below (see commit)
      const pqxx::result updated =
          detail::pq::exec_prepared(tx, "idemgate_resolve", key_param, result_param);
      if (detail::pq::affected_rows(updated) == 0) return false;
      tx.commit();
      return true;
    });
  }

  /// The three signals over the events reserved in the last `window`, in one round trip.
  StoreSignals signals(std::chrono::seconds window) {
    const pqxx::result rows = run([&](pqxx::connection& c) {
      pqxx::nontransaction tx(c);
      return detail::pq::exec_prepared(tx, "idemgate_signals",
                                       detail::sql_duration<std::chrono::seconds>(window));
    });
    const pqxx::row row = rows[0];
    StoreSignals s;
    s.window = window;
    s.duplicates = detail::pq::int_field(row[1]);
    s.events = detail::pq::int_field(row[0]) + s.duplicates;
    s.in_flight = detail::pq::int_field(row[2]);
    if (!row[3].is_null()) s.oldest_in_flight = std::chrono::seconds(detail::pq::int_field(row[3]));
    s.escalated = detail::pq::int_field(row[4]);
    s.mismatched_keys = detail::pq::int_field(row[5]);
    s.mismatches_total = detail::pq::int_field(row[6]);
    return s;
  }

  /// Keeps a downstream answer that differed from the stored one.
  void record_mismatch(const Key& key, std::string_view stored, std::string_view observed,
                       std::string_view source) {
    const std::string key_param = detail::pq::bytea_param(key.view());
    const std::string stored_param = detail::pq::bytea_param(stored);
    const std::string observed_param = detail::pq::bytea_param(observed);
    const std::string source_text(source);
    run([&](pqxx::connection& c) {
      pqxx::nontransaction tx(c);
      return detail::pq::exec_prepared(tx, "idemgate_record_mismatch", key_param, stored_param,
                                       observed_param, source_text);
    });
  }

  /// Up to `limit` recorded mismatches, newest first.
  std::vector<Mismatch> mismatches(std::size_t limit) {
    const pqxx::result rows = run([&](pqxx::connection& c) {
      pqxx::nontransaction tx(c);
      return detail::pq::exec_prepared(tx, "idemgate_mismatches", detail::sql_limit(limit));
    });
    std::vector<Mismatch> found;
    found.reserve(rows.size());
    for (const pqxx::row& row : rows)
      found.push_back({key_from(row[0]), detail::pq::bytea_field(row[1]),
                       detail::pq::bytea_field(row[2]), detail::pq::text_field(row[3]),
                       detail::from_micros(detail::pq::int_field(row[4]))});
    return found;
  }

  /// Deletes committed and failed rows that finished more than `older_than` ago, `batch` rows per
  /// statement (each its own short transaction, skipping rows locked by live traffic); never
  /// in-flight or escalated rows. Returns how many it deleted.
  std::size_t purge(std::chrono::seconds older_than, std::size_t batch) {
    std::size_t deleted = 0;
    for (;;) {
      const std::int64_t n = run([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        return detail::pq::affected_rows(detail::pq::exec_prepared(
            tx, "idemgate_purge", detail::sql_duration<std::chrono::seconds>(older_than),
            detail::sql_limit(batch)));
      });
      deleted += static_cast<std::size_t>(n);
      if (n == 0 || static_cast<std::size_t>(n) < batch) return deleted;
    }
  }

  /// The SQL text of every statement the store prepares, for one table: documentation, and
  /// the script a benchmark runs to measure the database's own ceiling for the gate's work.
  struct Statements {
    /// The reservation: insert as in flight, or count a duplicate and return the row.
    std::string reserve;
    /// Takes an expired lease over with a fence bump.
    std::string take_over;
    /// The fenced status update of the commit transaction.
    std::string commit;
    /// Stores a permanent failure (fenced).
    std::string fail;
    /// Parks the key for a human (fenced).
    std::string escalate;
    /// Ends the lease after a transient failure (fenced).
    std::string release;
    /// Reads one row.
    std::string find;
    /// The reconciler's takeover of stranded rows.
    std::string take_stale;
    /// Lists the manual queue.
    std::string escalated;
    /// Commits an escalated row.
    std::string resolve;
    /// Reads status and fence after a fenced update missed.
    std::string settled;
    /// Reads the three signals.
    std::string signals;
    /// Records a mismatch.
    std::string record_mismatch;
    /// Lists mismatches.
    std::string mismatches;
    /// Deletes one batch of finished rows past the window.
    std::string purge;
    /// Reserves many keys in one statement.
    std::string reserve_batch;
    /// The fenced status update of a batch commit.
    std::string commit_batch;
  };

  /// The statements for `table` (checked like the constructor checks it).
  [[nodiscard]] static Statements statements(const std::string& table) {
    const std::string t = detail::checked_table_name(table);
    const std::string columns =
        "key, status, fence, request, fingerprint, result, reason, duplicates, "
        "(extract(epoch FROM created_at) * 1000000)::bigint, "
        "(extract(epoch FROM updated_at) * 1000000)::bigint, "
        "(extract(epoch FROM lease_until) * 1000000)::bigint";
    Statements s;
    // The insert claims a new key; when it conflicts, the update counts the duplicate and
    // returns the stored row: one statement, one round trip, either way.
    s.reserve =
        "WITH claimed AS (INSERT INTO " + t +
        " (key, status, fence, lease_until, fingerprint, request)"
        " VALUES ($1::bytea, 'in_flight', 1, now() + $4::bigint * interval '1 millisecond',"
        " $2::bytea, $3::bytea)"
        " ON CONFLICT (key) DO NOTHING RETURNING fence),"
        " seen AS (UPDATE " +
        t +
        " SET duplicates = duplicates + 1 WHERE key = $1::bytea"
        " AND NOT EXISTS (SELECT 1 FROM claimed)"
        " RETURNING fence, status, fingerprint = $2::bytea AS same, lease_until >= now() AS live,"
        " result, reason)"
        " SELECT true, fence, NULL::text, NULL::boolean, NULL::boolean, NULL::bytea, NULL::text"
        " FROM claimed"
        " UNION ALL SELECT false, fence, status, same, live, result, reason FROM seen";
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
    // The row stays: its lease ends, so the next delivery takes it over with a higher fence (a
    // worker still holding the old fence can never commit), and if no delivery comes back the
    // reconciler finishes the event.
    s.release = "UPDATE " + t +
                " SET lease_until = 'epoch', updated_at = now()"
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
    s.signals = "SELECT (SELECT count(*) FROM " + t +
                " WHERE created_at >= now() - $1::bigint * interval '1 second'),"
                " (SELECT coalesce(sum(duplicates), 0) FROM " +
                t +
                " WHERE created_at >= now() - $1::bigint * interval '1 second'),"
                " (SELECT count(*) FROM " +
                t +
                " WHERE status = 'in_flight'),"
                " (SELECT floor(extract(epoch FROM now() - min(created_at)))::bigint FROM " +
                t +
                " WHERE status = 'in_flight'),"
                " (SELECT count(*) FROM " +
                t +
                " WHERE status = 'escalated'),"
                " (SELECT count(DISTINCT key) FROM " +
                t +
                "_mismatches WHERE at >= now() - $1::bigint * interval '1 second'),"
                " (SELECT count(*) FROM " +
                t + "_mismatches)";
    s.record_mismatch = "INSERT INTO " + t +
                        "_mismatches (key, stored, observed, source)"
                        " VALUES ($1::bytea, $2::bytea, $3::bytea, $4::text)";
    s.mismatches =
        "SELECT key, stored, observed, source,"
        " (extract(epoch FROM at) * 1000000)::bigint FROM " +
        t + "_mismatches ORDER BY at DESC LIMIT $1::bigint";
    s.reserve_batch =
        "WITH input AS (SELECT * FROM unnest($1::bytea[], $2::bytea[], $3::bytea[])"
        " WITH ORDINALITY AS i(key, fingerprint, request, n)),"
        " claimed AS (INSERT INTO " +
        t +
        " (key, status, fence, lease_until, fingerprint, request)"
        " SELECT key, 'in_flight', 1, now() + $4::bigint * interval '1 millisecond', fingerprint,"
        " request FROM input ORDER BY n ON CONFLICT (key) DO NOTHING RETURNING key, fence),"
        " seen AS (UPDATE " +
        t +
        " AS log SET duplicates = log.duplicates + 1 FROM input"
        " WHERE log.key = input.key AND NOT EXISTS (SELECT 1 FROM claimed WHERE claimed.key ="
        " input.key) RETURNING log.key, log.fence, log.status, log.fingerprint = input.fingerprint"
        " AS same, log.lease_until >= now() AS live, log.result, log.reason)"
        " SELECT input.n, claimed.fence IS NOT NULL, coalesce(claimed.fence, seen.fence),"
        " seen.status, seen.same, seen.live, seen.result, seen.reason FROM input"
        " LEFT JOIN claimed ON claimed.key = input.key LEFT JOIN seen ON seen.key = input.key";
    s.commit_batch = "UPDATE " + t +
                     " AS log SET status = 'committed', result = v.result, updated_at = now()"
                     " FROM unnest($1::bytea[], $2::bigint[], $3::bytea[]) WITH ORDINALITY"
                     " AS v(key, fence, result, n)"
                     " WHERE log.key = v.key AND log.fence = v.fence AND log.status = 'in_flight'"
                     " RETURNING v.n";
    s.purge = "DELETE FROM " + t + " WHERE key IN (SELECT key FROM " + t +
              " WHERE status IN ('committed', 'failed')"
              " AND created_at < now() - $1::bigint * interval '1 second'"
              " AND updated_at < now() - $1::bigint * interval '1 second'"
              " LIMIT $2::bigint FOR UPDATE SKIP LOCKED)";
    return s;
  }

  /// Whether reservations skip the WAL flush (`PostgresOptions::relaxed_reservations`).
  [[nodiscard]] bool relaxed_reservations() const noexcept { return relaxed_pool_ != nullptr; }

  /// Reserves many keys in one statement (`unnest` of the key array): one reservation per item,
  /// in order. Items whose row committed after the statement's snapshot, and expired leases,
  /// fall back to `reserve` one by one. Keys must be distinct.
  std::vector<Reservation> reserve_batch(std::span<const ReserveItem> items,
                                         std::chrono::milliseconds lease) {
    std::vector<std::string_view> keys, fingerprints, requests;
    for (const ReserveItem& item : items) {
      keys.push_back(item.key.view());
      fingerprints.push_back(
          {reinterpret_cast<const char*>(item.fingerprint.data()), item.fingerprint.size()});
      requests.push_back(item.request);
    }
    const pqxx::result rows = run_on(reservation_pool(), [&](pqxx::connection& c) {
      pqxx::nontransaction tx(c);
      return detail::pq::exec_prepared(
          tx, "idemgate_reserve_batch", detail::pq::bytea_array_param(keys),
          detail::pq::bytea_array_param(fingerprints), detail::pq::bytea_array_param(requests),
          detail::sql_duration<std::chrono::milliseconds>(lease));
    });
    std::vector<std::optional<Reservation>> found(items.size());
    for (const pqxx::row& row : rows) {
      const auto index = static_cast<std::size_t>(detail::pq::int_field(row[0]) - 1);
      if (index >= items.size() || row[2].is_null()) continue;
      const std::int64_t fence = detail::pq::int_field(row[2]);
      if (detail::pq::bool_field(row[1])) {
        found[index] = Reservation::acquired(fence);
        continue;
      }
      Reservation existing =
          Reservation::existing(fence, parse_record_status(detail::pq::text_field(row[3])),
                                detail::pq::bool_field(row[4]), detail::pq::bytea_field(row[6]),
                                detail::pq::text_field(row[7]));
      const bool expired = existing.status == RecordStatus::in_flight && existing.same_request &&
                           !detail::pq::bool_field(row[5]);
      if (!expired) found[index] = std::move(existing);
    }
    std::vector<Reservation> reservations;
    reservations.reserve(items.size());
    for (std::size_t i = 0; i < items.size(); ++i)
      reservations.push_back(
          found[i] ? std::move(*found[i])
                   : reserve(items[i].key, items[i].fingerprint, items[i].request, lease));
    return reservations;
  }

  /// Commits many outcomes in one transaction: `business(tx, index)` for every item, then one
  /// fenced update for all of them, then one COMMIT. All or nothing: when a fence no longer holds
  /// or a business write fails, nothing is written and the answer is nullopt — commit the items
  /// one by one instead (`Gate::process_batch` does).
  template <class BusinessWrite>
  std::optional<std::vector<CommitStatus>> commit_batch(std::span<const CommitItem> items,
                                                        BusinessWrite&& business) {
    std::vector<std::string_view> keys, results;
    std::vector<std::int64_t> fences;
    for (const CommitItem& item : items) {
      keys.push_back(item.key.view());
      fences.push_back(item.fence);
      results.push_back(item.result);
    }
    const std::string key_array = detail::pq::bytea_array_param(keys);
    const std::string fence_array = detail::pq::bigint_array_param(fences);
    const std::string result_array = detail::pq::bytea_array_param(results);
    try {
      const bool all_held = run([&](pqxx::connection& c) {
        pqxx::work tx(c);
        for (std::size_t i = 0; i < items.size(); ++i) business(tx, i);
        const pqxx::result updated = detail::pq::exec_prepared(
            tx, "idemgate_commit_batch", key_array, fence_array, result_array);
        if (updated.size() != items.size()) return false;  // rolled back on leaving
        tx.commit();
        return true;
      });
      if (all_held) return std::vector<CommitStatus>(items.size(), CommitStatus::committed);
    } catch (const StoreError&) {
      throw;
    } catch (const std::exception&) {
      // A business write refused, or the COMMIT's fate is unknown: item by item decides.
    }
    return std::nullopt;
  }

  /// The table this store writes.
  [[nodiscard]] const std::string& table() const noexcept { return table_; }

  /// Checks a connection out of the store's pool, for work beside the gate (tests, tools). It
  /// goes back to the pool when the lease is destroyed; after a `pqxx::broken_connection`, call
  /// `mark_broken()` on the lease so the pool reopens it.
  detail::ConnectionPool::Lease connection() { return pool_.acquire(); }

 private:
  detail::ConnectionPool& reservation_pool() { return relaxed_pool_ ? *relaxed_pool_ : pool_; }

  // Statements are prepared on a connection's first use, not when it opens: the table may not
  // exist until migrate() has run.
  void prepare_once(detail::ConnectionPool::Lease& lease) {
    if (lease.ready()) return;
    try {
      prepare(lease.connection());
    } catch (...) {
      // Some statements may be prepared already: start the next checkout on a new connection.
      lease.mark_broken();
      throw;
    }
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
    detail::pq::prepare(c, "idemgate_signals", sql_.signals);
    detail::pq::prepare(c, "idemgate_record_mismatch", sql_.record_mismatch);
    detail::pq::prepare(c, "idemgate_mismatches", sql_.mismatches);
    detail::pq::prepare(c, "idemgate_purge", sql_.purge);
    detail::pq::prepare(c, "idemgate_reserve_batch", sql_.reserve_batch);
    detail::pq::prepare(c, "idemgate_commit_batch", sql_.commit_batch);
  }

  // Runs one unit of work on a pooled connection. A connection that broke before or during
  // the work is replaced and the work tried once more: every statement run this way is safe to
  // repeat (inserts conflict, updates are fenced).
  template <class Work>
  auto run(Work&& work) -> std::invoke_result_t<Work&, pqxx::connection&> {
    return run_on(pool_, std::forward<Work>(work));
  }

  template <class Work>
  auto run_on(detail::ConnectionPool& pool, Work&& work)
      -> std::invoke_result_t<Work&, pqxx::connection&> {
    for (int attempt = 1;; ++attempt) {
      auto lease = pool.acquire();
      try {
        prepare_once(lease);
        return work(lease.connection());
      } catch (const pqxx::deadlock_detected& e) {
        // Overlapping batches can lock the same rows in different orders; the loser was rolled
        // back whole, so it runs again.
        if (attempt >= 5)
          throw StoreError(std::string("idemgate: kept deadlocking with concurrent work (") +
                           e.what() + "); nothing was written. Do not ack.");
      } catch (const pqxx::broken_connection& e) {
        lease.mark_broken();
        if (attempt >= 2)
          throw StoreError(std::string("idemgate: lost the connection to PostgreSQL at ") +
                           pool.redacted_uri() + " (" + e.what() +
                           "). Do not ack; the redelivery will try again once the database is "
                           "back.");
      } catch (const pqxx::sql_error& e) {
        throw_if_log_schema_error(e);
        throw;  // anything else, the business write's own errors included, unchanged
      }
    }
  }

  // After a fenced update touched no row: was it this fence's own earlier attempt that landed?
  // Asked on the caller's connection: a second checkout could wait on a pool of one.
  // With relaxed reservations, a row that is gone altogether was lost in a database crash: no
  // one else holds the event, so this delivery must not be acked.
  template <class Transaction>
  CommitStatus settled_earlier(Transaction& tx, const std::string& key_param, std::int64_t fence,
                               RecordStatus target) const {
    const pqxx::result rows = detail::pq::exec_prepared(tx, "idemgate_settled", key_param);
    if (rows.empty() && relaxed_pool_)
      throw StoreError("idemgate: the reservation of this event is gone from " + table_ +
                       " (a relaxed reservation lost in a database crash?); nothing was "
                       "committed. Do not ack: the redelivery reserves it again and the "
                       "downstream returns the original outcome for the key.");
    if (!rows.empty() && parse_record_status(detail::pq::text_field(rows[0][0])) == target &&
        detail::pq::int_field(rows[0][1]) == fence)
      return CommitStatus::committed;
    return CommitStatus::lost_lease;
  }

  CommitStatus settle(const char* statement, const Key& key, std::int64_t fence,
                      std::string_view reason, RecordStatus target) {
    const std::string key_param = detail::pq::bytea_param(key.view());
    const std::string reason_text(reason);
    return run([&](pqxx::connection& c) {
      pqxx::nontransaction tx(c);
      if (detail::pq::affected_rows(
              detail::pq::exec_prepared(tx, statement, key_param, fence, reason_text)) > 0)
        return CommitStatus::committed;
      return settled_earlier(tx, key_param, fence, target);
    });
  }

  // A missing or outdated log table becomes a StoreError that says to migrate; a missing table
  // of the caller's business write keeps its own error.
  void throw_if_log_schema_error(const pqxx::sql_error& e) const {
    if (!names_log_table(e)) return;
    if (dynamic_cast<const pqxx::undefined_table*>(&e) != nullptr) throw missing_table();
    if (dynamic_cast<const pqxx::undefined_column*>(&e) != nullptr) throw outdated_table();
  }

  // Whether a schema error is about the log (not about a table of the caller's business write).
  bool names_log_table(const pqxx::sql_error& e) const {
    const std::string query = e.query();
    const std::string message = e.what();
    return query.find(detail::unqualified(table_)) != std::string::npos ||
           message.find(detail::unqualified(table_)) != std::string::npos ||
           query.rfind("idemgate_", 0) == 0;
  }

  StoreError missing_table() const {
    return StoreError("idemgate: the table " + table_ +
                      " does not exist; call PostgresStore::migrate() once, or apply "
                      "docs/schema.sql");
  }

  StoreError outdated_table() const {
    return StoreError("idemgate: the table " + table_ +
                      " was created by an older version; call PostgresStore::migrate() once to "
                      "upgrade it (it only adds columns and indexes)");
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
    record.duplicates = detail::pq::int_field(row[7]);
    record.created_at = detail::from_micros(detail::pq::int_field(row[8]));
    record.updated_at = detail::from_micros(detail::pq::int_field(row[9]));
    record.lease_until = detail::from_micros(detail::pq::int_field(row[10]));
    return record;
  }

  PostgresOptions options_;
  std::string table_;
  Statements sql_;
  detail::ConnectionPool pool_;
  std::unique_ptr<detail::ConnectionPool> relaxed_pool_;
};

static_assert(store<PostgresStore>);
static_assert(monitored_store<PostgresStore>);

}  // namespace idemgate
