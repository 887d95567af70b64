// SPDX-License-Identifier: MIT
// PostgresStore: the production store on PostgreSQL (libpqxx, idemgate::postgres).
#pragma once

#include "../concepts.hpp"
#include "../detail/durations.hpp"
#include "../detail/postgres/connection_pool.hpp"
#include "../detail/postgres/pqxx_compat.hpp"
#include "../record.hpp"
#include "../signals.hpp"
#include "log_row.hpp"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace idemgate {

/// What lies between a `PostgresStore` and the server (`PostgresOptions::pooling`).
enum class PostgresPooling {
  /// Each connection is a server session of its own: the server directly, or PgBouncer with
  /// `pool_mode = session`. The store prepares its statements once per connection.
  session,
  /// A pooler hands each transaction whichever server connection is free: PgBouncer with
  /// `pool_mode = transaction`. The store keeps no state in the session: no named prepared
  /// statements (each statement goes with its text and parameters, unnamed), no session-level
  /// `SET`. Your business write must keep none either (docs/stores.md).
  transaction,
};

/// Tuning of a `PostgresStore`.
struct PostgresOptions {
  /// The idempotency log's table, optionally schema-qualified (`ops.idemgate_log`).
  std::string table = "idemgate_log";
  /// Connections in the store's pool. Worker threads share them; each call checks one out.
  /// Lease renewals (the gate's heartbeat, the reconciler) have one connection of their own
  /// beside the pool, opened at the first renewal, so they neither wait for the workers nor
  /// keep a worker waiting when the database stops answering.
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
  /// What lies between the store and the server. Behind PgBouncer in transaction pooling mode,
  /// use `PostgresPooling::transaction`: a named statement prepared in one transaction is not
  /// there in the next, which may run on another server connection. It costs the server a parse
  /// and plan of every statement (see docs/stores.md for the measured cost); with relaxed
  /// reservations, each reservation also becomes a transaction of its own that sets
  /// `synchronous_commit` locally (three round trips more).
  PostgresPooling pooling = PostgresPooling::session;
  /// Your business write's statements, as {name, SQL}: the store prepares each on a connection
  /// right before the first commit that runs there (again after a reconnect), so the business
  /// write runs it with `idemgate::exec_prepared(tx, name, args...)` and the server neither
  /// parses nor plans it again per event. At most `max_business_statements`; not with
  /// `PostgresPooling::transaction` (nothing stays prepared there).
  std::vector<std::pair<std::string, std::string>> business_statements = {};
  /// Most entries of `business_statements`.
  static constexpr std::size_t max_business_statements = 16;

  // --- Dead connections. Each guard below goes into every connection the store opens unless
  // the connection string sets it itself (a keyword in the URI or key=value string, or a
  // `statement_timeout` in its `options` or in PGOPTIONS): the user's own value always wins. A
  // zero leaves the setting to libpq or the server. With the defaults, a call that meets a
  // partition (the database gone without a FIN or RST) fails within about 20 s, a commit (which
  // reconnects up to `commit_attempts` times) within about 40 s, and is not acked; the calls
  // after the partition heals open fresh connections. ---

  /// libpq `connect_timeout`: how long opening one connection may take, per host of a
  /// multi-host URI. Without it, a connect into a partition waits for the kernel (minutes).
  std::chrono::seconds connect_timeout = std::chrono::seconds(5);
  /// libpq `keepalives_idle`: a connection silent this long gets a TCP keepalive probe.
  std::chrono::seconds keepalives_idle = std::chrono::seconds(10);
  /// libpq `keepalives_interval`: the time between unanswered probes.
  std::chrono::seconds keepalives_interval = std::chrono::seconds(3);
  /// libpq `keepalives_count`: unanswered probes after which the kernel drops the connection.
  /// With the defaults, a call waiting on a peer that vanished fails after 10 + 3 × 3 = 19 s.
  std::size_t keepalives_count = 3;
  /// libpq `tcp_user_timeout`: how long sent data may stay unacknowledged before the kernel
  /// drops the connection (a statement sent into a partition).
  std::chrono::milliseconds tcp_user_timeout = std::chrono::seconds(15);
  /// Server `statement_timeout`, set once on every connection with `SET` (a startup option
  /// would be refused by PgBouncer; behind PgBouncer in transaction mode, set it on the role
  /// instead; with `PostgresPooling::transaction` the store does not set it): the server ends a
  /// statement that runs longer, the business write's included.
  std::chrono::milliseconds statement_timeout = std::chrono::seconds(15);
  /// A checked-out connection that sent a statement and received nothing at all for this long
  /// is taken for dead: the store shuts its socket down, and the call fails like any lost
  /// connection. It catches what keepalives cannot: a proxy, pooler or load balancer between the
  /// store and the database that keeps the TCP connection alive while the database behind it is
  /// gone. Must exceed `statement_timeout` (the server answers by then); zero turns it off.
  std::chrono::milliseconds reply_timeout = std::chrono::seconds(20);
  /// The first pause between two commit attempts (`commit_attempts`); it doubles after each
  /// attempt, up to 5 s, with jitter. It lets a failover finish between attempts.
  std::chrono::milliseconds retry_backoff = std::chrono::milliseconds(250);
  /// How long `migrate()` waits for an unreachable server, trying again with backoff, before it
  /// throws `StoreError`. Other calls never wait for it: they throw at once, so the event is not
  /// acked and comes back.
  std::chrono::milliseconds startup_wait = std::chrono::minutes(2);
  /// Where the store reports what no call returns: a lazy start while the server is down, a
  /// lease release that failed, a commit tried again, a silent connection cut. Standard error by
  /// default; an empty function silences it.
  std::function<void(std::string_view)> log = [](std::string_view line) {
    std::fprintf(stderr, "%.*s\n", static_cast<int>(line.size()), line.data());
  };
};

namespace detail {

/// Longest table name: PostgreSQL cuts identifiers at 63 bytes, and the index names add up to
/// 14 characters to it.
inline constexpr std::size_t max_table_name = 48;

/// Checks a (schema-qualified) table name; throws `std::invalid_argument` with what to do.
inline std::string checked_table_name(std::string table) {
  const auto dot = table.find('.');
  const bool ok = dot == std::string::npos
                      ? is_identifier(table, max_table_name)
                      : is_identifier(std::string_view(table).substr(0, dot), max_table_name) &&
                            is_identifier(std::string_view(table).substr(dot + 1), max_table_name);
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

/// A random, non-zero token that marks the rows one attempt wrote (insert, takeover, take-stale),
/// so that a statement repeated after its reply was lost recognises its own work.
inline std::int64_t new_holder_token() {
  // Seeded per thread, and again in a child after fork(): a forked worker must not repeat its
  // parent's tokens, or each would take the other's row for its own.
  struct Source {
    pid_t pid = 0;
    std::mt19937_64 bits;
  };
  thread_local Source source;
  if (const pid_t pid = ::getpid(); source.pid != pid) {
    std::random_device seed;
    source.bits.seed((static_cast<std::uint64_t>(seed()) << 32) ^ seed());
    source.pid = pid;
  }
  std::int64_t token = 0;
  while (token == 0) token = static_cast<std::int64_t>(source.bits() >> 1);
  return token;
}

/// A time point as microseconds since the epoch, clamped to what a timestamptz holds comfortably
/// (about 4000 years either side of 1970).
inline std::int64_t sql_micros(std::chrono::system_clock::time_point at) {
  constexpr std::int64_t bound = 4000LL * 366 * 24 * 3600 * 1000000;
  const auto micros =
      std::chrono::duration_cast<std::chrono::microseconds>(at.time_since_epoch()).count();
  return micros < -bound ? -bound : (micros > bound ? bound : micros);
}

/// A libpqxx row as `to_record` and `signals_from` read it.
struct PqRow {
  /// The row (a lightweight reference into its result on libpqxx 8, a row before).
  pq::row row;
  /// Whether column `column` is NULL.
  [[nodiscard]] bool is_null(int column) const { return row[column].is_null(); }
  /// Column `column` as an integer.
  [[nodiscard]] std::int64_t int64(int column) const { return pq::int_field(row[column]); }
  /// Column `column`, a bytea, as its bytes.
  [[nodiscard]] std::string bytes(int column) const { return pq::bytea_field(row[column]); }
  /// Column `column`, a text, as its characters.
  [[nodiscard]] std::string text(int column) const { return pq::text_field(row[column]); }
};
static_assert(log_row<PqRow>);

}  // namespace detail

/**
 * Runs one parameterised statement in a business write's transaction (`PostgresStore::transaction`,
 * or any libpqxx transaction): `$1`, `$2`, … take `args` in order, converted as libpqxx converts
 * them (strings, integers, floating point, bool, `std::optional` for NULL from 7.x on); an
 * `idemgate::Key` binds as a `bytea` (its 32 raw bytes). Returns the result.
 *
 * The same call on every libpqxx this store supports: `tx.exec_params` is deprecated from 7.10
 * on, and `tx.exec(sql, pqxx::params{...})` does not exist in 6.4.
 *
 * Example:
 *   idemgate::exec_params(tx, "INSERT INTO tms_bookings VALUES ($1, $2, $3)", container, slot,
 *                         key);
 */
template <class Transaction, class... Args>
pqxx::result exec_params(Transaction& tx, const std::string& sql, Args&&... args) {
  return detail::pq::exec_params(tx, sql, std::forward<Args>(args)...);
}

/**
 * Runs a statement prepared on the transaction's connection (`connection.prepare(name, sql)`)
 * with `args` as its parameters, converted as in `exec_params` (a `Key` binds as a `bytea`).
 * Returns the result. The same call on every libpqxx this store supports.
 *
 * Example:
 *   const auto found = idemgate::exec_prepared(tx, "booking_by_event", key);
 */
template <class Transaction, class... Args>
pqxx::result exec_prepared(Transaction& tx, const std::string& name, Args&&... args) {
  return detail::pq::exec_prepared(tx, name, std::forward<Args>(args)...);
}

/**
 * Strings as one `text[]` parameter of `exec_params` or `exec_prepared`, so a bulk business write
 * sends a column of the whole batch at once: `INSERT … SELECT * FROM unnest($1::text[], …)`.
 *
 * Example:
 *   const std::vector<std::string> containers{container, "TGHU1234567"};
 *   idemgate::exec_params(tx, "INSERT INTO tms_bookings (container)"
 *                             " SELECT * FROM unnest($1::text[])",
 *                         idemgate::text_array(containers));
 */
template <class Range>
[[nodiscard]] std::string text_array(const Range& values) {
  return detail::pq::text_array_param(values);
}

/**
 * Byte strings (each event's `key.view()`, say) as one `bytea[]` parameter of `exec_params` or
 * `exec_prepared`, for `unnest($1::bytea[])`.
 *
 * Example:
 *   const std::vector<std::string_view> keys{key.view()};
 *   idemgate::exec_params(tx, "SELECT count(*) FROM unnest($1::bytea[])",
 *                         idemgate::bytea_array(keys));
 */
template <class Range>
[[nodiscard]] std::string bytea_array(const Range& values) {
  return detail::pq::bytea_array_param(values);
}

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

  /// Connects to `uri`, a URI (`postgresql://user@h1:5432,h2:5432/db?target_session_attrs=
  /// read-write` follows a failover) or key=value pairs. A string libpq cannot read throws
  /// `StoreError` here. The first connection is tried now; when the server cannot be reached the
  /// store says so in its log (`PostgresOptions::log`) and starts anyway: every call opens the
  /// connection it needs, and fails with `StoreError` (do not ack) until the server is back.
  explicit PostgresStore(std::string uri, PostgresOptions options = {})
      : PostgresStore(open(std::move(uri), std::move(options)), std::string()) {}

  /// A handle on the same log and connections that sees only the rows of gate `name`.
  [[nodiscard]] PostgresStore for_gate(const GateName& name) const {
    return PostgresStore(shared_, name.str());
  }
  /// The gate whose rows this handle sees ("" for rows that belong to no gate).
  [[nodiscard]] const std::string& gate() const noexcept { return gate_; }

  /// The schema for a table name: the log, its constraints and the partial in-flight index.
  /// Also shipped as `docs/schema.sql` (with `key_migration_sql` and `index_sql`). On a log of an
  /// earlier version it only adds what that log lacks, without rewriting it: the `gate` column
  /// comes with a constant default, which PostgreSQL stores once instead of in every row.
  [[nodiscard]] static std::string schema_sql(const std::string& table = "idemgate_log") {
    const std::string t = detail::checked_table_name(table);
    return "CREATE TABLE IF NOT EXISTS " + t +
           " (\n"
           "  gate        text        NOT NULL DEFAULT '' CHECK (octet_length(gate) <= 64),\n"
           "  key         bytea       NOT NULL CHECK (octet_length(key) = 32),\n"
           "  status      text        NOT NULL\n"
           "              CHECK (status IN ('in_flight', 'committed', 'failed', 'escalated')),\n"
           "  fence       bigint      NOT NULL DEFAULT 1 CHECK (fence > 0),\n"
           "  lease_until timestamptz NOT NULL,\n"
           "  fingerprint bytea       NOT NULL CHECK (octet_length(fingerprint) = 32),\n"
           "  request     bytea       NOT NULL,\n"
           "  result      bytea,\n"
           "  reason      text,\n"
           "  duplicates  bigint      NOT NULL DEFAULT 0,\n"
           "  holder      bigint      NOT NULL DEFAULT 0,\n"
           "  attempts    bigint      NOT NULL DEFAULT 1,\n"
           "  label       text,\n"
           "  history     jsonb,\n"
           "  created_at  timestamptz NOT NULL DEFAULT now(),\n"
           "  updated_at  timestamptz NOT NULL DEFAULT now(),\n"
           "  PRIMARY KEY (gate, key),\n"
           "  CHECK (status <> 'committed' OR result IS NOT NULL)\n"
           ");\n"
           "-- Added in 0.1: logs created before it gain the column here.\n"
           "ALTER TABLE " +
           t +
           " ADD COLUMN IF NOT EXISTS duplicates bigint NOT NULL DEFAULT 0;\n"
           "-- Added in 0.2: the attempt that holds a row, and how many attempts held it.\n"
           "ALTER TABLE " +
           t + " ADD COLUMN IF NOT EXISTS holder bigint NOT NULL DEFAULT 0;\n" + "ALTER TABLE " +
           t +
           " ADD COLUMN IF NOT EXISTS attempts bigint NOT NULL DEFAULT 1;\n"
           "-- Added in 0.3: the gate a row belongs to. Rows written before belong to no gate "
           "('')\n"
           "-- until an operator gives them to one (adopt_unowned_rows).\n"
           "ALTER TABLE " +
           t +
           " ADD COLUMN IF NOT EXISTS gate text NOT NULL DEFAULT '';\n"
           "-- Added in 0.4: a readable label, kept only when asked, and the newest ends of\n"
           "-- attempts and operators' actions. NULL by default: no row is rewritten.\n"
           "ALTER TABLE " +
           t + " ADD COLUMN IF NOT EXISTS label text;\n" + "ALTER TABLE " + t +
           " ADD COLUMN IF NOT EXISTS history jsonb;\n"
           "-- Downstream answers that differed from the stored one (healthy: empty).\n"
           "CREATE TABLE IF NOT EXISTS " +
           t +
           "_mismatches (\n"
           "  gate        text        NOT NULL DEFAULT '',\n"
           "  key         bytea       NOT NULL,\n"
           "  stored      bytea       NOT NULL,\n"
           "  observed    bytea       NOT NULL,\n"
           "  source      text        NOT NULL,\n"
           "  at          timestamptz NOT NULL DEFAULT now()\n"
           ");\n"
           "ALTER TABLE " +
           t + "_mismatches ADD COLUMN IF NOT EXISTS gate text NOT NULL DEFAULT '';\n" +
           "CREATE INDEX IF NOT EXISTS " + detail::unqualified(t) + "_mismatches_at ON " + t +
           "_mismatches (at);\n";
  }

  /// What brings a log of an earlier version, keyed by `key` alone, to the primary key (gate,
  /// key) while other sessions go on writing: the new key is built beside the old one with
  /// `CREATE UNIQUE INDEX CONCURRENTLY`, then takes its place in one short step (a brief lock, no
  /// scan). Each statement runs on its own, outside a transaction block (as psql runs a script).
  /// `migrate()` runs them only on a log keyed by `key` alone. Shipped in `docs/schema.sql`.
  [[nodiscard]] static std::vector<std::string> key_migration_sql(
      const std::string& table = "idemgate_log") {
    const std::string t = detail::checked_table_name(table);
    const std::string name = detail::unqualified(t);
    return {"CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS " + name + "_gate_key ON " + t +
                " (gate, key)",
            "ALTER TABLE " + t + " DROP CONSTRAINT " + name + "_pkey, ADD CONSTRAINT " + name +
                "_pkey PRIMARY KEY USING INDEX " + name + "_gate_key"};
  }

  /// The log's indexes, each built with `CREATE INDEX CONCURRENTLY` (on its own, outside a
  /// transaction block), and the drop of an earlier version's indexes that the per-gate ones
  /// replace. No-ops once done. Shipped in `docs/schema.sql`.
  [[nodiscard]] static std::vector<std::string> index_sql(
      const std::string& table = "idemgate_log") {
    const std::string t = detail::checked_table_name(table);
    const std::string name = detail::unqualified(t);
    return {
        // Stranded work, per gate: the reconciler's scan and the oldest in-flight row.
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS " + name + "_gate_in_flight ON " + t +
            " (gate, lease_until) WHERE status = 'in_flight'",
        // The manual queue, per gate.
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS " + name + "_gate_escalated ON " + t +
            " (gate, updated_at) WHERE status = 'escalated'",
        // Failed rows, per gate: re-drives and an operator's lists and causes. A commit never
        // writes to it: a row enters it only when it fails.
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS " + name + "_gate_failed ON " + t +
            " (gate, updated_at) WHERE status = 'failed'",
        // Retention and the signals' window; BRIN stays tiny on an append-mostly column.
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS " + name + "_created ON " + t +
            " USING brin (created_at)",
        "DROP INDEX CONCURRENTLY IF EXISTS " + qualified_like(t, name + "_in_flight"),
        "DROP INDEX CONCURRENTLY IF EXISTS " + qualified_like(t, name + "_escalated"),
    };
  }

  /// Creates the log and its indexes if missing, and brings a log of an earlier version to this
  /// one's shape in place (`schema_sql`, `key_migration_sql`, `index_sql`). Idempotent and safe
  /// from several processes at once (they take turns). Other sessions go on writing while it runs:
  /// the indexes are built concurrently, and no statement holds a lock that blocks writers for
  /// longer than a catalog change (docs/operations.md has the measured wait). Behind a
  /// transaction pooler (`PostgresPooling::transaction`) everything runs in one transaction
  /// instead, which blocks writers while the indexes are built: migrate through a direct
  /// connection there. When the server cannot be reached, it waits for it up to
  /// `PostgresOptions::startup_wait`, trying again with backoff and logging each failure, then
  /// throws `StoreError`: a consumer started during an outage migrates as soon as the database
  /// is back.
  void migrate() {
    const auto give_up =
        detail::saturating_add(std::chrono::steady_clock::now(), options_.startup_wait);
    for (int n = 1;; ++n) {
      try {
        run([&](Lease& c) {
          if (pooled_by_transaction()) {
            pqxx::work tx(c.connection());
            detail::pq::exec(tx, "SELECT pg_advisory_xact_lock(7158029411)");
            detail::pq::exec(tx, schema_sql(table_));
            if (keyed_by_key_alone(tx))
              for (const std::string& sql : key_migration_sql(table_))
                detail::pq::exec(tx, without_concurrently(sql));
            for (const std::string& sql : index_sql(table_))
              detail::pq::exec(tx, without_concurrently(sql));
            tx.commit();
            return 0;
          }
          // A session lock, taken without waiting inside a statement: a session waiting for it
          // inside a statement would hold a snapshot that CREATE INDEX CONCURRENTLY waits for.
          for (;;) {
            pqxx::nontransaction lock(c.connection());
            if (detail::pq::bool_field(
                    detail::pq::exec(lock, "SELECT pg_try_advisory_lock(7158029411)")[0][0]))
              break;
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
          }
          try {
            {
              pqxx::work tx(c.connection());
              detail::pq::exec(tx, schema_sql(table_));
              tx.commit();
            }
            std::vector<std::string> steps;
            {
              pqxx::nontransaction check(c.connection());
              if (keyed_by_key_alone(check)) steps = key_migration_sql(table_);
            }
            for (std::string& sql : index_sql(table_)) steps.push_back(std::move(sql));
            for (const std::string& sql : steps) {
              drop_invalid_index(c, sql);
              pqxx::nontransaction step(c.connection());
              detail::pq::exec(step, sql);
            }
          } catch (...) {
            unlock_migration(c);
            throw;
          }
          unlock_migration(c);
          return 0;
        });
        if (n > 1) log("idemgate: PostgreSQL is back; migrated " + table_ + ".");
        return;
      } catch (const detail::ConnectionUnavailable& e) {
        const auto pause = backoff(n);
        if (std::chrono::steady_clock::now() + pause >= give_up)
          throw StoreError(std::string(e.what()) + " migrate() waited " +
                           detail::describe(options_.startup_wait) +
                           " (PostgresOptions::startup_wait) for it; start it, or call migrate() "
                           "again.");
        log(std::string(e.what()) + " migrate() tries again in " + detail::describe(pause) + ".");
        std::this_thread::sleep_for(pause);
      }
    }
  }

  /// Gives this handle's gate the rows that belong to no gate (written before logs knew their
  /// gates), up to `limit` of them in statements of at most 10,000 rows, except keys this gate
  /// already holds; returns how many it moved. Throws `std::logic_error` on a handle scoped to
  /// no gate.
  std::size_t adopt_unowned_rows(std::size_t limit) {
    detail::require_named_scope(gate_, "adopt_unowned_rows");
    std::size_t moved = 0;
    while (moved < limit) {
      const std::size_t batch = std::min<std::size_t>(limit - moved, 10'000);
      const std::int64_t n = run([&](Lease& c) {
        pqxx::nontransaction tx(c.connection());
        return detail::pq::affected_rows(detail::pq::exec_params(
            tx,
            "WITH picked AS MATERIALIZED (SELECT u.key FROM " + table_ +
                " AS u WHERE u.gate = '' AND NOT EXISTS (SELECT 1 FROM " + table_ +
                " AS g WHERE g.gate = $1::text AND g.key = u.key)"
                " LIMIT $2::bigint FOR UPDATE SKIP LOCKED)"
                " UPDATE " +
                table_ +
                " AS log SET gate = $1::text FROM picked"
                " WHERE log.gate = '' AND log.key = picked.key",
            gate_, detail::sql_limit(batch)));
      });
      moved += static_cast<std::size_t>(n);
      if (static_cast<std::size_t>(n) < batch) break;
    }
    return moved;
  }

  /// Inserts the key as in flight in one statement, takes over an expired lease with a fence
  /// bump, or reports what is stored.
  Reservation reserve(const Key& key, const Fingerprint& fingerprint, std::string_view request,
                      std::chrono::milliseconds lease) {
    return reserve(key, fingerprint, request, lease, {});
  }

  /// Like `reserve`, and keeps `label` with a new row (a stored row keeps its own label).
  Reservation reserve(const Key& key, const Fingerprint& fingerprint, std::string_view request,
                      std::chrono::milliseconds lease, std::string_view label) {
    const std::string key_param = detail::pq::bytea_param(key.view());
    const std::string fingerprint_param = detail::pq::bytea_param(
        {reinterpret_cast<const char*>(fingerprint.data()), fingerprint.size()});
    const std::string request_param = detail::pq::bytea_param(request);
    const std::int64_t lease_ms = detail::sql_duration<std::chrono::milliseconds>(lease);
    // This attempt's token: when a reply is lost and the statement runs again, the row it finds
    // is recognised as this attempt's own instead of "another worker holds this key".
    const std::int64_t holder = detail::new_holder_token();
    bool tried_takeover = false;
    // Under READ COMMITTED the conflicting row may have committed after this statement's
    // snapshot: the insert then does nothing and the read sees nothing. A new statement has a
    // new snapshot, so the loop ends as soon as the row is visible.
    for (int attempt = 0; attempt < 32; ++attempt) {
      pqxx::result rows =
          label.empty()
              ? reserve_statement(Statement::reserve, key_param, fingerprint_param, request_param,
                                  lease_ms, holder)
              : reserve_statement(Statement::reserve_labelled, key_param, fingerprint_param,
                                  request_param, lease_ms, holder, std::string(label));
      if (rows.empty()) continue;
      const detail::pq::row row = rows[0];
      const std::int64_t fence = detail::pq::int_field(row[1]);
      if (detail::pq::bool_field(row[0])) return Reservation::acquired(fence);
      Reservation found =
          Reservation::existing(fence, parse_record_status(detail::pq::text_field(row[2])),
                                detail::pq::bool_field(row[3]), detail::pq::bytea_field(row[5]),
                                detail::pq::text_field(row[6]));
      if (found.status == RecordStatus::in_flight && detail::pq::bool_field(row[7]))
        return tried_takeover ? Reservation::taken_over(fence) : Reservation::acquired(fence);
      const bool lease_live = detail::pq::bool_field(row[4]);
      if (found.status == RecordStatus::in_flight && found.same_request && !lease_live) {
        tried_takeover = true;
        pqxx::result taken =
            reserve_statement(Statement::take_over, key_param, fence, lease_ms, holder);
        if (!taken.empty()) return Reservation::taken_over(detail::pq::int_field(taken[0][0]));
        // Another worker took it over first, or this attempt's own takeover landed and its reply
        // was lost: read the row again to tell which.
        continue;
      }
      if (found.status == RecordStatus::in_flight) make_durable(key_param);
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
    return with_commit_retries(key, [&](Lease& c, int attempt) -> CommitStatus {
      if (attempt > 1) {
        // The previous attempt's COMMIT may have landed before its connection broke: find out
        // first, so that the business write never runs twice for one fence.
        pqxx::nontransaction check(c.connection());
        if (const auto settled = settled_state(c, check, key_param, fence, RecordStatus::committed))
          return *settled;
      }
      const std::string update = in_open_transaction(commit_update_sql(c, key, fence, result));
      pqxx::work tx(c.connection());
      // The business write goes first and the fenced update last, sent so that libpqxx checks
      // the transaction is still open: a business write that swallowed an SQL error, or ended
      // the transaction itself, is caught here instead of its statements and the status
      // committing apart.
      run_business_write(key, [&] { business(tx); });
      const pqxx::result updated = fenced_update(tx, update, key);
      if (detail::pq::affected_rows(updated) == 0) {
        tx.abort();
        pqxx::nontransaction check(c.connection());
        return settled_earlier(c, check, key_param, fence, RecordStatus::committed);
      }
      tx.commit();
      return CommitStatus::committed;
    });
  }

  /**
   * Like `commit`, for a result that only the transaction can give: runs `produce(pqxx::work&)`
   * and stores the string it returns as the result, in the same transaction, only if `fence`
   * still holds. Whatever `produce` throws rolls everything back and propagates. A broken
   * connection is retried on a fresh one, where `produce` runs again (its first transaction did
   * not commit). The server side (`server/endpoint.hpp`) runs a request's handler this way.
   */
  template <class Produce>
  CommitStatus commit_computed(const Key& key, std::int64_t fence, Produce&& produce) {
    const std::string key_param = detail::pq::bytea_param(key.view());
    return with_commit_retries(key, [&](Lease& c, int attempt) -> CommitStatus {
      if (attempt > 1) {
        pqxx::nontransaction check(c.connection());
        if (const auto settled = settled_state(c, check, key_param, fence, RecordStatus::committed))
          return *settled;
      }
      pqxx::work tx(c.connection());
      std::string result;
      run_business_write(key, [&] { result = produce(tx); });
      const pqxx::result updated =
          fenced_update(tx, in_open_transaction(fenced_update_sql(key, fence, result)), key);
      if (detail::pq::affected_rows(updated) == 0) {
        tx.abort();
        pqxx::nontransaction check(c.connection());
        return settled_earlier(c, check, key_param, fence, RecordStatus::committed);
      }
      tx.commit();
      return CommitStatus::committed;
    });
  }

  /// Stores a permanent failure, only if `fence` still holds.
  CommitStatus fail(const Key& key, std::int64_t fence, std::string_view reason) {
    return settle(Statement::fail, key, fence, reason, RecordStatus::failed);
  }

  /// Parks the key for a human, only if `fence` still holds.
  CommitStatus escalate(const Key& key, std::int64_t fence, std::string_view reason) {
    return settle(Statement::escalate, key, fence, reason, RecordStatus::escalated);
  }

  /// Gives back an in-flight reservation this caller holds after a transient failure: its lease
  /// ends now, so the next delivery takes the key over at once (with a higher fence). False when
  /// the fence no longer holds.
  bool release(const Key& key, std::int64_t fence) { return release(key, fence, {}); }

  /// Like `release`, and keeps `reason` (when not empty) as why this attempt gave the event back;
  /// the reconciler shows it when it gives up on the event.
  bool release(const Key& key, std::int64_t fence, std::string_view reason) {
    const std::string key_param = detail::pq::bytea_param(key.view());
    const std::string reason_text(reason);
    try {
      return run([&](Lease& c) {
        pqxx::nontransaction tx(c.connection());
        return detail::pq::affected_rows(
                   exec_prepared(c, tx, Statement::release, key_param, fence, reason_text)) > 0;
      });
    } catch (const std::exception& e) {
      // Callers give leases back on their way out of a failure and cannot do anything more
      // about this one: say so here, where it happened.
      log("idemgate: could not release the lease of key " + key.hex() + " (fence " +
          std::to_string(fence) + "): " + e.what() +
          " Safe: the lease runs out by itself, then a redelivery or the reconciler takes the "
          "event over; until then, redeliveries of it answer \"in flight\".");
      throw;
    }
  }

  /// Extends the leases the caller still holds to `lease` from now, in one statement; returns how
  /// many it extended (a lease taken over meanwhile is not, nor one whose row another
  /// transaction is writing: see `renew`).
  std::size_t extend(std::span<const HeldLease> held, std::chrono::milliseconds lease) {
    const std::vector<LeaseRenewal> renewed = renew(held, lease);
    return static_cast<std::size_t>(
        std::count(renewed.begin(), renewed.end(), LeaseRenewal::extended));
  }

  /// Renews the leases the caller still holds to `lease` from now, in one statement, on the
  /// renewal connection; says per lease (in order) whether it was extended, its fence is gone,
  /// or its row was busy: another transaction was writing it (a commit group's members are
  /// locked until its COMMIT), and the renewal skipped it instead of waiting, so that one busy
  /// row never holds up the renewal of every other lease.
  std::vector<LeaseRenewal> renew(std::span<const HeldLease> held,
                                  std::chrono::milliseconds lease) {
    if (held.empty()) return {};
    std::vector<std::string_view> keys;
    std::vector<std::int64_t> fences;
    for (const HeldLease& h : held) {
      keys.push_back(h.key.view());
      fences.push_back(h.fence);
    }
    const std::string key_array = detail::pq::bytea_array_param(keys);
    const std::string fence_array = detail::pq::bigint_array_param(fences);
    const std::int64_t lease_ms = detail::sql_duration<std::chrono::milliseconds>(lease);
    return run_on(renewal_pool_, [&](Lease& c) {
      pqxx::nontransaction tx(c.connection());
      const pqxx::result rows =
          exec_prepared(c, tx, Statement::extend, key_array, fence_array, lease_ms);
      std::vector<LeaseRenewal> renewed;
      renewed.reserve(held.size());
      for (const auto& row : rows) {
        const char state = row[0].c_str()[0];
        renewed.push_back(state == 'e'   ? LeaseRenewal::extended
                          : state == 'b' ? LeaseRenewal::busy
                                         : LeaseRenewal::gone);
      }
      if (renewed.size() != held.size())
        throw StoreError("idemgate: renewing " + std::to_string(held.size()) + " leases answered " +
                         std::to_string(renewed.size()) +
                         " rows; is the log's table what this version expects? (run migrate())");
      return renewed;
    });
  }

  /// Puts a failed event back in flight under a new fence with its lease ended, so the next
  /// delivery or the reconciler claims again under the same key (a downstream that honours keys
  /// returns its original outcome if it had one). Returns 1, or 0 when the key is not failed.
  std::size_t redrive_failed(const Key& key) {
    const std::string key_param = detail::pq::bytea_param(key.view());
    return run([&](Lease& c) {
      pqxx::nontransaction tx(c.connection());
      return static_cast<std::size_t>(
          detail::pq::affected_rows(exec_prepared(c, tx, Statement::redrive_key, key_param)));
    });
  }

  /// Re-drives up to `limit` failed events whose failure was stored in [`from`, `to`), for
  /// example every event an expired credential failed.
  std::size_t redrive_failed(std::chrono::system_clock::time_point from,
                             std::chrono::system_clock::time_point to, std::size_t limit) {
    return run([&](Lease& c) {
      pqxx::nontransaction tx(c.connection());
      return static_cast<std::size_t>(detail::pq::affected_rows(
          exec_prepared(c, tx, Statement::redrive_range, detail::sql_micros(from),
                        detail::sql_micros(to), detail::sql_limit(limit))));
    });
  }

  /// The stored row, if any.
  std::optional<Record> find(const Key& key) {
    const std::string key_param = detail::pq::bytea_param(key.view());
    pqxx::result rows = run([&](Lease& c) {
      pqxx::nontransaction tx(c.connection());
      return exec_prepared(c, tx, Statement::find, key_param);
    });
    if (rows.empty()) return std::nullopt;
    return detail::to_record(detail::PqRow{rows[0]});
  }

  /// Takes over up to `limit` in-flight rows whose lease expired and that have not changed for
  /// `stale_after`, bumping their fence; rows another reconciler is taking are skipped.
  std::vector<Stranded> take_stale(std::size_t limit, std::chrono::milliseconds stale_after,
                                   std::chrono::milliseconds lease) {
    // When the reply is lost and the statement runs again on a new connection, the rows this
    // pass already took come back too (they carry its token), instead of staying in flight
    // under a live lease that nobody works on.
    const std::int64_t holder = detail::new_holder_token();
    pqxx::result rows = run([&](Lease& c) {
      pqxx::nontransaction tx(c.connection());
      return exec_prepared(c, tx, Statement::take_stale,
                           detail::sql_duration<std::chrono::milliseconds>(stale_after),
                           detail::sql_limit(limit),
                           detail::sql_duration<std::chrono::milliseconds>(lease), holder);
    });
    std::vector<Stranded> taken;
    taken.reserve(rows.size());
    for (const detail::pq::row& row : rows)
      taken.push_back({detail::key_from(detail::pq::bytea_field(row[0])),
                       detail::pq::int_field(row[1]), detail::pq::bytea_field(row[2]),
                       detail::pq::int_field(row[3]), detail::pq::text_field(row[4])});
    return taken;
  }

  /// Up to `limit` escalated rows, oldest first.
  std::vector<Record> escalated(std::size_t limit) {
    pqxx::result rows = run([&](Lease& c) {
      pqxx::nontransaction tx(c.connection());
      return exec_prepared(c, tx, Statement::escalated, detail::sql_limit(limit));
    });
    std::vector<Record> parked;
    parked.reserve(rows.size());
    for (const detail::pq::row& row : rows) parked.push_back(detail::to_record(detail::PqRow{row}));
    return parked;
  }

  /// Commits an escalated row with `result` and the business write in one transaction; false
  /// if the row is not escalated (already resolved, or never parked).
  template <class BusinessWrite>
  bool resolve(const Key& key, std::string_view result, BusinessWrite&& business) {
    const std::string update =
        "UPDATE " + table_ +
        " SET status = 'committed', result = " + detail::pq::bytea_literal(result) +
        ", updated_at = now(), history = " + resolved_history() + " WHERE gate = '" + gate_ +
        "' AND key = " + detail::pq::bytea_literal(key.view()) + " AND status = 'escalated'";
    const std::string key_param = detail::pq::bytea_param(key.view());
    return with_commit_retries(key, [&](Lease& c, int attempt) {
      if (attempt > 1) {
        // The previous attempt's COMMIT may have landed: never run the business write twice.
        pqxx::nontransaction check(c.connection());
        const pqxx::result rows = exec_prepared(c, check, Statement::find, key_param);
        if (rows.empty()) return false;
        const Record row = detail::to_record(detail::PqRow{rows[0]});
        if (row.status == RecordStatus::committed) return row.result == result;
        if (row.status != RecordStatus::escalated) return false;
      }
      pqxx::work tx(c.connection());
      // First, and checked like commit's (see there).
      run_business_write(key, [&] { business(tx); });
      const pqxx::result updated = fenced_update(tx, update, key);
      if (detail::pq::affected_rows(updated) == 0) return false;
      tx.commit();
      return true;
    });
  }

  /// Re-drives up to `limit` failed rows of this gate whose reason is exactly `reason`, oldest
  /// failure first, as `redrive_failed(key)` does (rows another session is changing are
  /// skipped); returns how many changed. The rows' history keeps the reason.
  std::size_t redrive_cause(std::string_view reason, std::size_t limit) {
    const std::string reason_text(reason);
    return run([&](Lease& c) {
      pqxx::nontransaction tx(c.connection());
      return static_cast<std::size_t>(detail::pq::affected_rows(
          exec_prepared(c, tx, Statement::redrive_cause, reason_text, detail::sql_limit(limit))));
    });
  }

  /// Up to `query.limit` rows of this gate that match `query`, the newest change first. An
  /// operator's query: it scans the gate's rows (the failed and escalated ones by index).
  std::vector<Record> rows(const RowQuery& query) {
    const pqxx::result found = run([&](Lease& c) {
      pqxx::nontransaction tx(c.connection());
      return with_query(query, [&](auto&&... params) {
        return exec_prepared(c, tx, Statement::rows, params..., detail::sql_limit(query.limit));
      });
    });
    std::vector<Record> rows;
    rows.reserve(found.size());
    for (const detail::pq::row& row : found) rows.push_back(detail::to_record(detail::PqRow{row}));
    return rows;
  }

  /// How many rows of this gate match `query` (its limit aside).
  std::int64_t count(const RowQuery& query) {
    const pqxx::result found = run([&](Lease& c) {
      pqxx::nontransaction tx(c.connection());
      return with_query(query, [&](auto&&... params) {
        return exec_prepared(c, tx, Statement::count_rows, params..., std::int64_t{0});
      });
    });
    return detail::pq::int_field(found[0][0]);
  }

  /// This gate's failed and escalated rows grouped by status and reason, most rows first (then
  /// the most recent), at most `limit` groups.
  std::vector<Cause> causes(std::size_t limit) {
    const pqxx::result found = run([&](Lease& c) {
      pqxx::nontransaction tx(c.connection());
      return exec_prepared(c, tx, Statement::causes, detail::sql_limit(limit));
    });
    std::vector<Cause> causes;
    causes.reserve(found.size());
    for (const detail::pq::row& row : found)
      causes.push_back({parse_record_status(detail::pq::text_field(row[0])),
                        detail::pq::text_field(row[1]), detail::pq::int_field(row[2]),
                        detail::from_micros(detail::pq::int_field(row[3])),
                        detail::from_micros(detail::pq::int_field(row[4]))});
    return causes;
  }

  /// The gates that have rows in this log, sorted, whichever gate this handle is scoped to
  /// (rows of no gate are not listed). One step of the primary key's index per gate.
  std::vector<std::string> gates() {
    const pqxx::result found = run([&](Lease& c) {
      pqxx::nontransaction tx(c.connection());
      return exec_prepared(c, tx, Statement::gates);
    });
    std::vector<std::string> names;
    names.reserve(found.size());
    for (const detail::pq::row& row : found) names.push_back(detail::pq::text_field(row[0]));
    return names;
  }

  /// The three signals over the events reserved in the last `window`, and the oldest
  /// transaction open in the database (`StoreSignals::oldest_snapshot`), in one round trip.
  StoreSignals signals(std::chrono::seconds window) {
    const pqxx::result rows = run([&](Lease& c) {
      pqxx::nontransaction tx(c.connection());
      return exec_prepared(c, tx, Statement::signals,
                           detail::sql_duration<std::chrono::seconds>(window));
    });
    // The oldest in-flight row comes as its age in seconds.
    StoreSignals s = detail::signals_from(
        detail::PqRow{rows[0]}, window, [](std::int64_t age) { return std::chrono::seconds(age); });
    s.oldest_snapshot = std::chrono::seconds(detail::pq::int_field(rows[0][8]));
    s.oldest_snapshot_holder = detail::pq::text_field(rows[0][9]);
    return s;
  }

  /// Keeps a downstream answer that differed from the stored one.
  void record_mismatch(const Key& key, std::string_view stored, std::string_view observed,
                       std::string_view source) {
    const std::string key_param = detail::pq::bytea_param(key.view());
    const std::string stored_param = detail::pq::bytea_param(stored);
    const std::string observed_param = detail::pq::bytea_param(observed);
    const std::string source_text(source);
    run([&](Lease& c) {
      pqxx::nontransaction tx(c.connection());
      return exec_prepared(c, tx, Statement::record_mismatch, key_param, stored_param,
                           observed_param, source_text);
    });
  }

  /// Up to `limit` recorded mismatches, newest first.
  std::vector<Mismatch> mismatches(std::size_t limit) {
    const pqxx::result rows = run([&](Lease& c) {
      pqxx::nontransaction tx(c.connection());
      return exec_prepared(c, tx, Statement::mismatches, detail::sql_limit(limit));
    });
    std::vector<Mismatch> found;
    found.reserve(rows.size());
    for (const detail::pq::row& row : rows)
      found.push_back({detail::key_from(detail::pq::bytea_field(row[0])),
                       detail::pq::bytea_field(row[1]), detail::pq::bytea_field(row[2]),
                       detail::pq::text_field(row[3]),
                       detail::from_micros(detail::pq::int_field(row[4]))});
    return found;
  }

  /// Deletes committed and failed rows that finished more than `older_than` ago, `batch` rows per
  /// statement (each its own short transaction, skipping rows locked by live traffic); never
  /// in-flight or escalated rows. Returns how many it deleted. When it deleted any, it ends with
  /// a `VACUUM` of the log (skipped while another vacuum holds the table), so the space of those
  /// rows, and of the versions the commits left behind, is reused at once rather than at
  /// autovacuum's next turn; a vacuum that fails (the role does not own the table) is logged
  /// and leaves the work to autovacuum.
  std::size_t purge(std::chrono::seconds older_than, std::size_t batch) {
    std::size_t deleted = 0;
    for (;;) {
      const std::int64_t n = run([&](Lease& c) {
        pqxx::nontransaction tx(c.connection());
        return detail::pq::affected_rows(exec_prepared(
            c, tx, Statement::purge, detail::sql_duration<std::chrono::seconds>(older_than),
            detail::sql_limit(batch)));
      });
      deleted += static_cast<std::size_t>(n);
      if (n == 0 || static_cast<std::size_t>(n) < batch) break;
    }
    if (deleted > 0) vacuum_log();
    return deleted;
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
    /// Renews leases still held, skipping rows another transaction is writing; one row per
    /// lease, in order: 'e' extended, 'g' fence gone, 'b' busy.
    std::string extend;
    /// A no-op update whose synchronous commit flushes the WAL (relaxed reservations).
    std::string make_durable;
    /// Counts the items of a batch committed under their fences (after an in-doubt COMMIT).
    std::string batch_landed;
    /// Re-drives one failed key.
    std::string redrive_key;
    /// Re-drives the failed keys of a time range.
    std::string redrive_range;
    /// The reservation that keeps a label with a new row.
    std::string reserve_labelled;
    /// Re-drives the failed keys of one reason.
    std::string redrive_cause;
    /// Lists rows by an operator's filters.
    std::string rows;
    /// Counts rows by an operator's filters.
    std::string count;
    /// Groups failed and escalated rows by cause.
    std::string causes;
    /// Lists the gates that have rows.
    std::string gates;
    /// Reserves many keys in one statement, keeping their labels with new rows.
    std::string reserve_batch_labelled;
  };

  /// The row's history (a jsonb array) with one more entry (`outcome`, `reason`: SQL
  /// expressions) for the attempt the row is at, now, keeping the newest `history_limit`.
  [[nodiscard]] static std::string history_with(std::string_view outcome, std::string_view reason) {
    const std::string kept = "coalesce(history, '[]'::jsonb)";
    return "(CASE WHEN jsonb_array_length(" + kept + ") >= " + std::to_string(history_limit) +
           " THEN " + kept + " - 0 ELSE " + kept +
           " END || jsonb_build_array(jsonb_build_object('attempt', attempts, 'outcome', " +
           std::string(outcome) + "::text, 'reason', " + std::string(reason) +
           "::text, 'at', (extract(epoch FROM now()) * 1000000)::bigint)))";
  }

  /// The statements for `table` (checked like the constructor checks it).
  [[nodiscard]] static Statements statements(const std::string& table) {
    const std::string t = detail::checked_table_name(table);
    const std::string columns =
        detail::record_select_list([](detail::LogColumn column, std::string_view name) {
          const std::string n(name);
          if (column == detail::LogColumn::history) return n + "::text";
          return detail::is_instant(column) ? "(extract(epoch FROM " + n + ") * 1000000)::bigint"
                                            : n;
        });
    Statements s;
    // The insert claims a new key; when it conflicts, the update counts the duplicate and
    // returns the stored row: one statement, one round trip, either way.
    // A row this attempt wrote itself (its reply was lost) is not counted as a duplicate and
    // comes back as `mine`, its lease renewed from now: the attempt goes on with a whole lease,
    // not one that may have run out while it reconnected (a partition), and a reconciler does
    // not take the event over under it.
    // A labelled reservation writes its label ($7) with a new row; the plain one is unchanged.
    const auto reserve = [&t](bool labelled) {
      return "WITH claimed AS (INSERT INTO " + t +
             " (gate, key, status, fence, lease_until, fingerprint, request, holder, attempts" +
             (labelled ? ", label" : "") +
             ") VALUES ($1::text, $2::bytea, 'in_flight', 1,"
             " now() + $5::bigint * interval '1 millisecond', $3::bytea, $4::bytea, $6::bigint, 1" +
             (labelled ? ", nullif($7::text, '')" : "") +
             ") ON CONFLICT (gate, key) DO NOTHING RETURNING fence),"
             " seen AS (UPDATE " +
             t +
             " SET duplicates = duplicates + CASE WHEN holder = $6::bigint THEN 0 ELSE 1 END,"
             " lease_until = CASE WHEN holder = $6::bigint AND status = 'in_flight'"
             " THEN now() + $5::bigint * interval '1 millisecond' ELSE lease_until END"
             " WHERE gate = $1::text AND key = $2::bytea AND NOT EXISTS (SELECT 1 FROM claimed)"
             " RETURNING fence, status, fingerprint = $3::bytea AS same, lease_until >= now() AS "
             "live,"
             " result, reason, holder = $6::bigint AS mine)"
             " SELECT true, fence, NULL::text, NULL::boolean, NULL::boolean, NULL::bytea, "
             "NULL::text,"
             " true FROM claimed"
             " UNION ALL SELECT false, fence, status, same, live, result, reason, mine FROM seen";
    };
    s.reserve = reserve(false);
    s.reserve_labelled = reserve(true);
    s.take_over = "UPDATE " + t +
                  " SET fence = fence + 1, lease_until = now() + $4::bigint * interval '1 "
                  "millisecond', updated_at = now(), holder = $5::bigint, attempts = attempts + 1,"
                  " history = " +
                  taken_over_history() +
                  " WHERE gate = $1::text AND key = $2::bytea AND status IN ('in_flight', '')"
                  " AND fence = $3::bigint AND lease_until < now() RETURNING fence";
    // `status IN ('in_flight', '')` ('' is never a status) finds the same rows as `status =
    // 'in_flight'` without implying the in-flight index's predicate: the planner then takes the
    // row by its primary key, instead of walking that partial index, which holds an entry for
    // every version reserved since the oldest snapshot while one is held open (2,700 buffers
    // against 5 on a log of 100,000 such versions). Every statement here that finds one row by
    // its key tests it so: the commit, and the takeover, fail, escalate and release above and
    // below.
    s.commit = "UPDATE " + t +
               " SET status = 'committed', result = $4::bytea, updated_at = now()"
               " WHERE gate = $1::text AND key = $2::bytea AND status IN ('in_flight', '')"
               " AND fence = $3::bigint";
    s.fail = "UPDATE " + t +
             " SET status = 'failed', reason = $4::text, updated_at = now(), history = " +
             history_with("'failed'", "$4::text") +
             " WHERE gate = $1::text AND key = $2::bytea AND status IN ('in_flight', '')"
             " AND fence = $3::bigint";
    s.escalate = "UPDATE " + t +
                 " SET status = 'escalated', reason = $4::text, updated_at = now(), history = " +
                 history_with("'escalated'", "$4::text") +
                 " WHERE gate = $1::text AND key = $2::bytea AND status IN ('in_flight', '')"
                 " AND fence = $3::bigint";
    // The row stays: its lease ends, so the next delivery takes it over with a higher fence (a
    // worker still holding the old fence can never commit), and if no delivery comes back the
    // reconciler finishes the event.
    s.release = "UPDATE " + t +
                " SET lease_until = 'epoch', updated_at = now(),"
                " reason = CASE WHEN $4::text = '' THEN reason ELSE $4::text END,"
                " history = CASE WHEN $4::text = '' THEN history ELSE " +
                history_with("'released'", "$4::text") +
                " END WHERE gate = $1::text AND key = $2::bytea AND status IN ('in_flight', '')"
                " AND fence = $3::bigint";
    s.find = "SELECT " + columns + " FROM " + t + " WHERE gate = $1::text AND key = $2::bytea";
    // The second half returns the rows this pass's token already holds: a pass repeated after
    // its reply was lost gets back what it took the first time.
    s.take_stale =
        "WITH stale AS (SELECT key FROM " + t +
        " WHERE gate = $1::text AND status = 'in_flight' AND lease_until < now()"
        " AND updated_at <= now() - $2::bigint * interval '1 millisecond'"
        " ORDER BY lease_until LIMIT $3::bigint FOR UPDATE SKIP LOCKED),"
        " taken AS (UPDATE " +
        t +
        " AS log SET fence = log.fence + 1, attempts = log.attempts + 1, holder = $5::bigint,"
        " lease_until = now() + $4::bigint * interval '1 millisecond', updated_at = now(),"
        " history = " +
        taken_over_history() +
        " FROM stale WHERE log.gate = $1::text AND log.key = stale.key"
        " RETURNING log.key, log.fence, log.request, log.attempts, log.reason)"
        " SELECT key, fence, request, attempts, reason FROM taken"
        " UNION ALL SELECT key, fence, request, attempts, reason FROM " +
        t + " WHERE gate = $1::text AND status = 'in_flight' AND holder = $5::bigint";
    s.escalated = "SELECT " + columns + " FROM " + t +
                  " WHERE gate = $1::text AND status = 'escalated' ORDER BY updated_at"
                  " LIMIT $2::bigint";
    s.resolve = "UPDATE " + t +
                " SET status = 'committed', result = $3::bytea, updated_at = now(), history = " +
                resolved_history() +
                " WHERE gate = $1::text AND key = $2::bytea AND status = 'escalated'";
    s.settled = "SELECT status, fence FROM " + t + " WHERE gate = $1::text AND key = $2::bytea";
    s.signals =
        "SELECT (SELECT count(*) FROM " + t +
        " WHERE gate = $1::text AND created_at >= now() - $2::bigint * interval '1 second'),"
        " (SELECT coalesce(sum(duplicates), 0) FROM " +
        t +
        " WHERE gate = $1::text AND created_at >= now() - $2::bigint * interval '1 second'),"
        " (SELECT count(*) FROM " +
        t +
        " WHERE gate = $1::text AND status = 'in_flight'),"
        " (SELECT floor(extract(epoch FROM now() - min(created_at)))::bigint FROM " +
        t +
        " WHERE gate = $1::text AND status = 'in_flight'),"
        " (SELECT count(*) FROM " +
        t +
        " WHERE gate = $1::text AND status = 'escalated'),"
        " (SELECT count(DISTINCT key) FROM " +
        t +
        "_mismatches WHERE gate = $1::text AND at >= now() - $2::bigint * interval '1 second'),"
        " (SELECT count(*) FROM " +
        t +
        "_mismatches WHERE gate = $1::text),"
        " (SELECT count(*) FROM " +
        t + " WHERE gate = $1::text AND status = 'in_flight' AND attempts > 1), " +
        oldest_snapshot_columns();
    s.record_mismatch = "INSERT INTO " + t +
                        "_mismatches (gate, key, stored, observed, source)"
                        " VALUES ($1::text, $2::bytea, $3::bytea, $4::bytea, $5::text)";
    s.mismatches =
        "SELECT key, stored, observed, source,"
        " (extract(epoch FROM at) * 1000000)::bigint FROM " +
        t + "_mismatches WHERE gate = $1::text ORDER BY at DESC LIMIT $2::bigint";
    // The labelled batch writes each item's label ($7, '' for none) with its new row.
    const auto reserve_batch = [&t](bool labelled) {
      return std::string(
                 "WITH input AS (SELECT * FROM unnest($2::bytea[], $3::bytea[], "
                 "$4::bytea[]") +
             (labelled ? ", $7::text[]) WITH ORDINALITY AS i(key, fingerprint, request, label, n)),"
                       : ") WITH ORDINALITY AS i(key, fingerprint, request, n)),") +
             " claimed AS (INSERT INTO " + t +
             " (gate, key, status, fence, lease_until, fingerprint, request, holder, attempts" +
             (labelled ? ", label" : "") +
             ") SELECT $1::text, key, 'in_flight', 1, now() + $5::bigint * interval '1 "
             "millisecond', fingerprint, request, $6::bigint, 1" +
             (labelled ? ", nullif(label, '')" : "") +
             " FROM input ORDER BY n"
             " ON CONFLICT (gate, key) DO NOTHING"
             " RETURNING key, fence),"
             " seen AS (UPDATE " +
             t +
             " AS log SET duplicates = log.duplicates + CASE WHEN log.holder = $6::bigint THEN 0"
             " ELSE 1 END, lease_until = CASE WHEN log.holder = $6::bigint AND log.status ="
             " 'in_flight' THEN now() + $5::bigint * interval '1 millisecond' ELSE log.lease_until "
             "END"
             " FROM input"
             " WHERE log.gate = $1::text AND log.key = input.key"
             " AND NOT EXISTS (SELECT 1 FROM claimed WHERE claimed.key ="
             " input.key) RETURNING log.key, log.fence, log.status, log.fingerprint = "
             "input.fingerprint"
             " AS same, log.lease_until >= now() AS live, log.result, log.reason,"
             " log.holder = $6::bigint AS mine)"
             " SELECT input.n, claimed.fence IS NOT NULL, coalesce(claimed.fence, seen.fence),"
             " seen.status, seen.same, seen.live, seen.result, seen.reason, seen.mine FROM input"
             " LEFT JOIN claimed ON claimed.key = input.key LEFT JOIN seen ON seen.key = input.key";
    };
    s.reserve_batch = reserve_batch(false);
    s.reserve_batch_labelled = reserve_batch(true);
    // A row another transaction is writing (a commit group's fenced update holds its row until
    // COMMIT) is skipped, not waited for: one renewal renews every lease of the gate, and waiting
    // on one row would leave all the others unrenewed. The snapshot read tells a skipped row
    // (still held under the fence as last committed: busy) from one whose fence is gone.
    const std::string held_rows =
        "SELECT * FROM unnest($2::bytea[], $3::bigint[]) WITH ORDINALITY AS v(key, fence, n)";
    const std::string held_here =
        " AS log WHERE log.gate = $1::text AND log.key = held.key"
        " AND log.fence = held.fence AND log.status = 'in_flight'";
    const std::string free_rows = "SELECT log.key FROM " + t + " AS log JOIN held" +
                                  " ON log.key = held.key AND log.fence = held.fence" +
                                  " WHERE log.gate = $1::text AND log.status = 'in_flight'" +
                                  " FOR UPDATE OF log SKIP LOCKED";
    const std::string extend_free =
        "UPDATE " + t + " AS log" +
        " SET lease_until = now() + $4::bigint * interval '1 millisecond'" +
        " FROM free WHERE log.gate = $1::text AND log.key = free.key RETURNING log.key";
    s.extend = "WITH held AS (" + held_rows + "), free AS (" + free_rows + "), extended AS (" +
               extend_free + ") SELECT CASE" +
               " WHEN EXISTS (SELECT 1 FROM extended WHERE extended.key = held.key) THEN 'e'" +
               " WHEN EXISTS (SELECT 1 FROM " + t + held_here + ") THEN 'b' ELSE 'g' END" +
               " FROM held ORDER BY held.n";
    // The history keeps the reason the re-drive clears.
    const std::string redrive = "UPDATE " + t +
                                " SET status = 'in_flight', fence = fence + 1,"
                                " attempts = attempts + 1, reason = NULL, history = " +
                                history_with("'redriven'", "coalesce(reason, '')") +
                                ", lease_until = 'epoch', updated_at = now()";
    s.redrive_key = redrive + " WHERE gate = $1::text AND key = $2::bytea AND status = 'failed'";
    // The rows are picked once, in a CTE: a LIMIT subquery inside IN may be scanned again by
    // the plan, and would then pick rows beyond the limit.
    s.redrive_range =
        "WITH picked AS MATERIALIZED (SELECT key FROM " + t +
        " WHERE gate = $1::text AND status = 'failed'"
        " AND updated_at >= 'epoch'::timestamptz + $2::bigint * interval '1 microsecond'"
        " AND updated_at < 'epoch'::timestamptz + $3::bigint * interval '1 microsecond'"
        " LIMIT $4::bigint FOR UPDATE SKIP LOCKED) " +
        redrive + " FROM picked WHERE " + t + ".gate = $1::text AND " + t + ".key = picked.key";
    s.redrive_cause = "WITH picked AS MATERIALIZED (SELECT key FROM " + t +
                      " WHERE gate = $1::text AND status = 'failed'"
                      " AND coalesce(reason, '') = $2::text ORDER BY updated_at"
                      " LIMIT $3::bigint FOR UPDATE SKIP LOCKED) " +
                      redrive + " FROM picked WHERE " + t + ".gate = $1::text AND " + t +
                      ".key = picked.key";
    // An operator's filters: each matches any row when its switch is off ('' for the status and
    // the label).
    const std::string filter =
        " WHERE gate = $1::text AND ($2::text = '' OR status = $2::text)"
        " AND (NOT $3::boolean OR coalesce(reason, '') = $4::text)"
        " AND ($5::text = '' OR strpos(coalesce(label, ''), $5::text) > 0)"
        " AND (NOT $6::boolean OR updated_at >= 'epoch'::timestamptz"
        " + $7::bigint * interval '1 microsecond')"
        " AND (NOT $8::boolean OR updated_at < 'epoch'::timestamptz"
        " + $9::bigint * interval '1 microsecond')";
    s.rows = "SELECT " + columns + " FROM " + t + filter +
             " ORDER BY updated_at DESC, key LIMIT $10::bigint";
    // `count` takes `rows`' parameters, the limit included, so that both bind the same list.
    s.count = "SELECT count(*) FROM " + t + filter + " AND $10::bigint IS NOT NULL";
    s.causes =
        "SELECT status, coalesce(reason, ''), count(*),"
        " (extract(epoch FROM min(updated_at)) * 1000000)::bigint,"
        " (extract(epoch FROM max(updated_at)) * 1000000)::bigint FROM " +
        t +
        " WHERE gate = $1::text AND status IN ('failed', 'escalated')"
        " GROUP BY status, coalesce(reason, '')"
        " ORDER BY count(*) DESC, max(updated_at) DESC LIMIT $2::bigint";
    // One step of the primary key's index per gate, however many rows each holds. Every gate,
    // whatever the handle's ($1 is there because every statement gets it).
    s.gates = "WITH RECURSIVE g(name) AS (SELECT min(gate) FROM " + t +
              " WHERE gate > '' AND $1::text IS NOT NULL"
              " UNION ALL SELECT (SELECT min(gate) FROM " +
              t +
              " WHERE gate > g.name) FROM g WHERE g.name IS NOT NULL)"
              " SELECT name FROM g WHERE name IS NOT NULL";
    s.make_durable =
        "UPDATE " + t + " SET duplicates = duplicates WHERE gate = $1::text AND key = $2::bytea";
    s.batch_landed = "SELECT count(*) FROM " + t +
                     " AS log, unnest($2::bytea[], $3::bigint[]) AS v(key, fence)"
                     " WHERE log.gate = $1::text AND log.key = v.key AND log.fence = v.fence"
                     " AND log.status = 'committed'";
    s.purge = "WITH picked AS MATERIALIZED (SELECT key FROM " + t +
              " WHERE gate = $1::text AND status IN ('committed', 'failed')"
              " AND created_at < now() - $2::bigint * interval '1 second'"
              " AND updated_at < now() - $2::bigint * interval '1 second'"
              " LIMIT $3::bigint FOR UPDATE SKIP LOCKED) DELETE FROM " +
              t + " USING picked WHERE " + t + ".gate = $1::text AND " + t + ".key = picked.key";
    return s;
  }

  /// The oldest transaction open in this database besides the caller's own, as two more columns
  /// of the signals row: its age in whole seconds (0 when none is open) and who holds it. A
  /// session's transaction counts while it holds a snapshot or a transaction id (either keeps
  /// vacuum from removing what was deleted after it began), and so does a prepared transaction.
  /// Other roles' sessions are visible only to a role with pg_read_all_stats (or pg_monitor).
  [[nodiscard]] static std::string oldest_snapshot_columns() {
    return "coalesce(horizon.age, 0), coalesce(horizon.holder, '')"
           " FROM (SELECT 1) AS one LEFT JOIN LATERAL (SELECT"
           " floor(extract(epoch FROM now() - held.since))::bigint AS age, held.holder FROM ("
           "SELECT xact_start AS since,"
           " greatest(age(backend_xmin), age(backend_xid)) AS xids,"
           " format('session %s%s, %s', pid,"
           " coalesce(' (' || nullif(application_name, '') || ')', ''), state) AS holder"
           " FROM pg_stat_activity WHERE datname = current_database()"
           " AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
           " AND xact_start IS NOT NULL"
           " AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)"
           " UNION ALL SELECT prepared, age(transaction), format('prepared transaction %L', gid)"
           " FROM pg_prepared_xacts WHERE database = current_database()"
           ") AS held ORDER BY held.xids DESC, held.since LIMIT 1) AS horizon ON true";
  }

  /// A takeover's history: an entry when the holder's lease ran out, none when it was given back
  /// (released or re-driven: those wrote their own).
  [[nodiscard]] static std::string taken_over_history() {
    return "CASE WHEN lease_until <= 'epoch' THEN history ELSE " +
           history_with("'" + std::string(detail::taken_over_outcome) + "'",
                        "'" + std::string(detail::lease_expired) + "'") +
           " END";
  }

  /// A resolved row's history: the reason it was parked for.
  [[nodiscard]] static std::string resolved_history() {
    return history_with("'resolved'", "coalesce(reason, '')");
  }

  /// Whether reservations skip the WAL flush (`PostgresOptions::relaxed_reservations`).
  [[nodiscard]] bool relaxed_reservations() const noexcept { return relaxed_pool_ != nullptr; }

  /// Reserves many keys in one statement (`unnest` of the key array): one reservation per item,
  /// in order. Items whose row committed after the statement's snapshot, and expired leases,
  /// fall back to `reserve` one by one. Keys must be distinct.
  std::vector<Reservation> reserve_batch(std::span<const ReserveItem> items,
                                         std::chrono::milliseconds lease) {
    std::vector<std::string_view> keys, fingerprints, requests, labels;
    bool labelled = false;
    for (const ReserveItem& item : items) {
      keys.push_back(item.key.view());
      fingerprints.push_back(
          {reinterpret_cast<const char*>(item.fingerprint.data()), item.fingerprint.size()});
      requests.push_back(item.request);
      labels.push_back(item.label);
      labelled = labelled || !item.label.empty();
    }
    const std::int64_t holder = detail::new_holder_token();  // see reserve
    const std::int64_t lease_ms = detail::sql_duration<std::chrono::milliseconds>(lease);
    const pqxx::result rows =
        labelled ? reserve_statement(Statement::reserve_batch_labelled,
                                     detail::pq::bytea_array_param(keys),
                                     detail::pq::bytea_array_param(fingerprints),
                                     detail::pq::bytea_array_param(requests), lease_ms, holder,
                                     detail::pq::text_array_param(labels))
                 : reserve_statement(Statement::reserve_batch, detail::pq::bytea_array_param(keys),
                                     detail::pq::bytea_array_param(fingerprints),
                                     detail::pq::bytea_array_param(requests), lease_ms, holder);
    std::vector<std::optional<Reservation>> found(items.size());
    for (const detail::pq::row& row : rows) {
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
      if (existing.status == RecordStatus::in_flight && detail::pq::bool_field(row[8])) {
        found[index] = Reservation::acquired(fence);  // this batch's own row; its reply was lost
        continue;
      }
      const bool expired = existing.status == RecordStatus::in_flight && existing.same_request &&
                           !detail::pq::bool_field(row[5]);
      if (!expired) found[index] = std::move(existing);
    }
    std::vector<Reservation> reservations;
    reservations.reserve(items.size());
    try {
      for (std::size_t i = 0; i < items.size(); ++i)
        if (found[i] && found[i]->kind == Reservation::Kind::existing &&
            found[i]->status == RecordStatus::in_flight) {
          make_durable(detail::pq::bytea_param(items[i].key.view()));
          break;  // one synchronous commit flushes the WAL for all of them
        }
      for (std::size_t i = 0; i < items.size(); ++i)
        reservations.push_back(
            found[i] ? std::move(*found[i])
                     : reserve(items[i].key, items[i].fingerprint, items[i].request, lease));
    } catch (...) {
      // The caller gets no reservation at all: give back what this call holds, so that the
      // redeliveries take the events over at once instead of meeting live leases nobody works
      // under (best effort: with the store down, the leases run out and the reconciler takes over).
      for (std::size_t i = 0; i < items.size(); ++i) {
        const Reservation* held =
            i < reservations.size() ? &reservations[i] : (found[i] ? &*found[i] : nullptr);
        if (held == nullptr || held->kind == Reservation::Kind::existing) continue;
        try {
          release(items[i].key, held->fence, "the batch reservation failed");
        } catch (...) {
        }
      }
      throw;
    }
    return reservations;
  }

  /// Commits many outcomes in one transaction: `business(tx, index)` and the item's fenced update
  /// for every item, then one COMMIT (one WAL flush for the batch). All or nothing: when a fence
  /// no longer holds or a business write throws, nothing is written and the answer is nullopt —
  /// commit the items one by one instead (`Gate::process_batch` does). A business write that broke
  /// the transaction throws `BusinessWriteError` naming its key: then nothing may be retried item
  /// by item. After an in-doubt COMMIT it asks whether the batch landed before answering.
  template <class BusinessWrite>
  std::optional<std::vector<CommitStatus>> commit_batch(std::span<const CommitItem> items,
                                                        BusinessWrite&& business) {
    return commit_together(items, [&](pqxx::work& tx) {
      // Each business write is followed by its own fenced update, checked like commit's: a
      // business write that breaks the transaction is named, and no later item's write runs
      // outside the transaction.
      for (std::size_t i = 0; i < items.size(); ++i) {
        run_business_write(items[i].key, [&] { business(tx, i); });
        const pqxx::result updated = fenced_update(
            tx,
            in_open_transaction(fenced_update_sql(items[i].key, items[i].fence, items[i].result)),
            items[i].key);
        if (detail::pq::affected_rows(updated) == 0) return false;  // a fence moved
      }
      return true;
    });
  }

  /**
   * Like `commit_batch`, for a business write that writes every item's rows at once (one
   * multi-row statement): runs `business(tx)` once, then marks every item committed in one
   * fenced statement, and commits when that statement changed every item's row. All or nothing:
   * when a fence no longer holds or `business` throws (its SQL failed included), nothing is
   * written and the answer is nullopt — commit the items one by one instead
   * (`Gate::process_batch` does, with a `bulk_business_write`). A business write that broke the
   * transaction and went on throws `BusinessWriteError` naming the first item's key. After an
   * in-doubt COMMIT it asks whether the batch landed before answering.
   */
  template <class BusinessWrite>
  std::optional<std::vector<CommitStatus>> commit_bulk(std::span<const CommitItem> items,
                                                       BusinessWrite&& business) {
    if (items.empty()) return std::vector<CommitStatus>{};
    const std::string update = in_open_transaction(bulk_fenced_update_sql(items));
    return commit_together(items, [&](pqxx::work& tx) {
      run_business_write(items[0].key, [&] { business(tx); });
      // Sent through the checked path like every fenced update after a business write; one row
      // per item, or a fence moved (the keys of a batch are distinct).
      const pqxx::result updated = fenced_update(tx, update, items[0].key);
      return detail::pq::affected_rows(updated) == static_cast<std::int64_t>(items.size());
    });
  }

  /**
   * Commits many outcomes in one transaction (one WAL flush), each item under its own savepoint:
   * the item's fenced update, then `business(tx, index)` when the fence held. An item whose fence
   * no longer holds is not written, and one whose business write throws is rolled back to its
   * savepoint alone: the others commit. Answers one `ItemCommit` per item, in order; a thrown
   * item's answer carries what it threw. A business write that broke the whole transaction (see
   * `commit`) is answered with `BusinessWriteError` and the group runs again without it, from the
   * start. A broken connection is retried like `commit`'s, asking after an in-doubt COMMIT which
   * items landed; throws `StoreError` when `commit_attempts` run out. `Gate` uses it for group
   * commit
   * (`GateOptions::coalesce`).
   */
  template <class BusinessWrite>
  std::vector<ItemCommit> commit_each(std::span<const CommitItem> items, BusinessWrite&& business) {
    std::vector<ItemCommit> answers(items.size());
    std::vector<std::size_t> open(items.size());  // the items still to commit
    for (std::size_t i = 0; i < items.size(); ++i) open[i] = i;
    std::vector<std::string> key_params;
    key_params.reserve(items.size());
    for (const CommitItem& item : items)
      key_params.push_back(detail::pq::bytea_param(item.key.view()));
    // The items the last attempt's COMMIT carried, when it may have landed unheard.
    std::vector<std::size_t> in_doubt;
    std::size_t restarts = 0;
    for (int attempt = 1;;) {
      std::string why;
      try {
        auto lease = pool_.acquire();
        try {
          prepare_business_statements(lease);
          if (!in_doubt.empty()) {
            // One transaction: all of it landed, or none. Ask each item's row.
            pqxx::nontransaction check(lease.connection());
            std::vector<std::optional<CommitStatus>> settled;
            bool landed = false;
            for (std::size_t i : in_doubt) {
              settled.push_back(settled_state(lease, check, key_params[i], items[i].fence,
                                              RecordStatus::committed));
              landed = landed || settled.back() == CommitStatus::committed;
            }
            if (landed) {
              for (std::size_t k = 0; k < in_doubt.size(); ++k)
                answers[in_doubt[k]].status = settled[k].value_or(CommitStatus::lost_lease);
              for (std::size_t i : open)  // refused by that attempt
                if (std::find(in_doubt.begin(), in_doubt.end(), i) == in_doubt.end())
                  answers[i].status = settled_earlier(lease, check, key_params[i], items[i].fence,
                                                      RecordStatus::committed);
              return answers;
            }
            in_doubt.clear();
          }
          std::vector<std::size_t> included, refused;
          bool broke = false;  // an item broke the transaction: start again without it
          {
            pqxx::work tx(lease.connection());
            // Per item: one round trip for its savepoint and fenced update (the savepoint ends
            // the previous item's, and is sent through libpqxx's checked path: a previous
            // business write that broke the transaction is caught there), one or more for its
            // business write.
            std::optional<std::size_t> last;  // the item whose business write ran last
            for (std::size_t k = 0; k < open.size();) {
              const std::size_t i = open[k];
              std::string sql = k == 0 ? "SAVEPOINT idemgate_item; "
                                       : "RELEASE SAVEPOINT idemgate_item; "
                                         "SAVEPOINT idemgate_item; ";
              sql += fenced_update_sql(items[i].key, items[i].fence, items[i].result);
              pqxx::result updated;
              try {
                updated = fenced_update(tx, sql, last ? items[*last].key : items[i].key);
              } catch (const BusinessWriteError&) {
                if (!last) throw;
                answers[*last].error = std::current_exception();
                std::erase(open, *last);
                broke = true;
                break;
              }
              if (detail::pq::affected_rows(updated) == 0) {
                refused.push_back(i);  // its business write is not run
                last.reset();
                ++k;
                continue;
              }
              try {
                run_business_write(items[i].key, [&] { business(tx, i); });
                included.push_back(i);
                last = i;
                ++k;
                continue;
              } catch (const pqxx::broken_connection&) {
                throw;
              } catch (const BusinessWriteError&) {
                answers[i].error = std::current_exception();
                open.erase(open.begin() + static_cast<std::ptrdiff_t>(k));
                broke = true;
                break;
              } catch (const pqxx::sql_error& e) {
                if (reconnectable(e)) throw;
                throw_if_log_schema_error(e);
                answers[i].error = std::current_exception();
              } catch (...) {
                answers[i].error = std::current_exception();
              }
              open.erase(open.begin() + static_cast<std::ptrdiff_t>(k));
              last.reset();
              if (!rolled_back_to_savepoint(tx)) {
                broke = true;  // libpqxx ended the transaction with the failed statement
                break;
              }
            }
            if (!broke && last) {
              // The last business write is checked like the others: by a statement after it.
              try {
                fenced_update(tx, "RELEASE SAVEPOINT idemgate_item", items[*last].key);
              } catch (const BusinessWriteError&) {
                answers[*last].error = std::current_exception();
                std::erase(open, *last);
                broke = true;
              }
            }
            if (!broke) {
              in_doubt = included;  // from here on, the COMMIT may land whatever we hear back
              tx.commit();
              in_doubt.clear();
            }
          }
          if (broke) {
            if (++restarts > items.size())
              throw StoreError("idemgate: the group commit of " + std::to_string(items.size()) +
                               " events could not keep its transaction open; nothing was "
                               "committed. Do not ack: the redelivery or the reconciler "
                               "finishes them.");
            continue;  // nothing of this attempt committed; the others go again
          }
          for (std::size_t i : included) answers[i].status = CommitStatus::committed;
          if (!refused.empty()) {
            // Zero rows: this fence's own earlier attempt may have committed (a retried commit).
            pqxx::nontransaction check(lease.connection());
            for (std::size_t i : refused)
              answers[i].status = settled_earlier(lease, check, key_params[i], items[i].fence,
                                                  RecordStatus::committed);
          }
          return answers;
        } catch (...) {
          auto again = retry_reason(lease, std::current_exception());
          if (!again) throw;
          why = std::move(*again);
        }
      } catch (const detail::ConnectionUnavailable& e) {
        why = e.what();
      }
      pause_or_give_up("group commit", open.size(), attempt, why);
      ++attempt;
    }
  }

  /// Connections the store closed because a statement went unanswered for
  /// `PostgresOptions::reply_timeout` (a partition that nothing else reported).
  [[nodiscard]] std::size_t connections_cut() const noexcept {
    return pool_.silent_connections_cut() + renewal_pool_.silent_connections_cut() +
           (relaxed_pool_ ? relaxed_pool_->silent_connections_cut() : 0);
  }

  /// The table this store writes.
  [[nodiscard]] const std::string& table() const noexcept { return table_; }

  /// Checks a connection out of the store's pool, for work beside the gate (tests, tools). It
  /// goes back to the pool when the lease is destroyed; after a `pqxx::broken_connection`, call
  /// `mark_broken()` on the lease so the pool reopens it. The reply watchdog
  /// (`PostgresOptions::reply_timeout`) leaves this connection alone.
  detail::ConnectionPool::Lease connection() { return pool_.acquire(false); }

 private:
  using Lease = detail::ConnectionPool::Lease;

  // Everything the handles on one log share: options, statements and connection pools.
  struct Shared {
    PostgresOptions options;
    std::string table;
    Statements sql;
    std::optional<detail::ConnectionPool> pool;
    std::optional<detail::ConnectionPool> renewal_pool;
    std::unique_ptr<detail::ConnectionPool> relaxed_pool;
  };

  PostgresStore(std::shared_ptr<Shared> shared, std::string gate)
      : shared_(std::move(shared)),
        gate_(std::move(gate)),
        options_(shared_->options),
        table_(shared_->table),
        sql_(shared_->sql),
        pool_(*shared_->pool),
        renewal_pool_(*shared_->renewal_pool),
        relaxed_pool_(shared_->relaxed_pool) {}

  // `table`'s schema, if it names one, in front of `index`: an index lives in its table's schema.
  static std::string qualified_like(const std::string& table, const std::string& index) {
    const auto dot = table.find('.');
    return dot == std::string::npos ? index : table.substr(0, dot + 1) + index;
  }

  // A migration statement as it runs inside one transaction (behind a transaction pooler).
  static std::string without_concurrently(std::string sql) {
    const auto at = sql.find(" CONCURRENTLY");
    if (at != std::string::npos) sql.erase(at, std::string_view(" CONCURRENTLY").size());
    return sql;
  }

  // A CREATE INDEX CONCURRENTLY that was interrupted (a crash, a cancelled migration) leaves an
  // invalid index of that name behind, which IF NOT EXISTS would keep: drop it first.
  void drop_invalid_index(Lease& c, const std::string& sql) {
    const auto on = sql.find(" ON ");
    const auto exists = sql.find("IF NOT EXISTS ");
    if (sql.find("CREATE") == std::string::npos || on == std::string::npos ||
        exists == std::string::npos)
      return;
    const auto from = exists + std::string_view("IF NOT EXISTS ").size();
    const std::string index = qualified_like(table_, sql.substr(from, on - from));
    pqxx::nontransaction tx(c.connection());
    const pqxx::result invalid = detail::pq::exec_params(
        tx, "SELECT 1 FROM pg_index WHERE indexrelid = to_regclass($1::text) AND NOT indisvalid",
        index);
    if (!invalid.empty()) detail::pq::exec(tx, "DROP INDEX CONCURRENTLY IF EXISTS " + index);
  }

  // Whether the log's primary key is `key` alone (a log of an earlier version).
  template <class Transaction>
  bool keyed_by_key_alone(Transaction& tx) const {
    const pqxx::result rows = detail::pq::exec_params(
        tx, "SELECT indnatts FROM pg_index WHERE indrelid = to_regclass($1::text) AND indisprimary",
        table_);
    return !rows.empty() && detail::pq::int_field(rows[0][0]) == 1;
  }

  void unlock_migration(Lease& c) noexcept {
    try {
      pqxx::nontransaction tx(c.connection());
      detail::pq::exec(tx, "SELECT pg_advisory_unlock(7158029411)");
    } catch (...) {
      // A broken connection ended its session, and the session's lock with it.
    }
  }

  static PostgresOptions checked_options(PostgresOptions options) {
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
    using std::chrono::hours;
    using std::chrono::seconds;
    detail::require_in_range("PostgresOptions::connect_timeout", options.connect_timeout,
                             seconds(0), hours(1),
                             "It bounds opening a connection (default 5 s; 0: libpq's "
                             "own, no bound).");
    detail::require_in_range("PostgresOptions::keepalives_idle", options.keepalives_idle,
                             seconds(0), hours(1),
                             "It is the silence before a keepalive probe (default 10 s).");
    detail::require_in_range("PostgresOptions::keepalives_interval", options.keepalives_interval,
                             seconds(0), hours(1),
                             "It is the time between keepalive probes (default 3 s).");
    detail::require_in_range("PostgresOptions::keepalives_count", options.keepalives_count,
                             std::size_t{0}, std::size_t{1000},
                             "It is how many unanswered probes drop a connection "
                             "(default 3).");
    detail::require_in_range("PostgresOptions::tcp_user_timeout", options.tcp_user_timeout,
                             milliseconds(0), hours(1),
                             "It bounds unacknowledged sent data (default 15 s).");
    detail::require_in_range("PostgresOptions::statement_timeout", options.statement_timeout,
                             milliseconds(0), hours(24),
                             "It is the server's limit per statement (default 15 s).");
    detail::require_in_range("PostgresOptions::reply_timeout", options.reply_timeout,
                             milliseconds(0), hours(24),
                             "It is how long a statement may go unanswered (default 20 s).");
    if (options.reply_timeout.count() > 0 && options.statement_timeout.count() > 0 &&
        options.reply_timeout <= options.statement_timeout)
      throw std::invalid_argument(
          "idemgate: PostgresOptions::reply_timeout (" + detail::describe(options.reply_timeout) +
          ") must exceed PostgresOptions::statement_timeout (" +
          detail::describe(options.statement_timeout) +
          "), or statements the server would still finish are cut; raise it, or set it to "
          "0 to turn the reply watchdog off.");
    detail::require_in_range("PostgresOptions::retry_backoff", options.retry_backoff,
                             milliseconds(0), std::chrono::minutes(1),
                             "It is the first pause between commit attempts (default "
                             "250 ms).");
    detail::require_in_range("PostgresOptions::startup_wait", options.startup_wait, milliseconds(0),
                             hours(24),
                             "It is how long migrate() waits for the server (default "
                             "2 min).");
    if (options.business_statements.size() > PostgresOptions::max_business_statements)
      throw std::invalid_argument(
          "idemgate: PostgresOptions::business_statements holds " +
          std::to_string(options.business_statements.size()) + " statements, more than " +
          std::to_string(PostgresOptions::max_business_statements) +
          "; prepare the ones every event runs, and send the others unprepared.");
    if (!options.business_statements.empty() && options.pooling == PostgresPooling::transaction)
      throw std::invalid_argument(
          "idemgate: PostgresOptions::business_statements cannot be prepared behind a "
          "transaction pooler (PostgresPooling::transaction): a statement prepared in one "
          "transaction is not there in the next. Send them with idemgate::exec_params instead.");
    for (const auto& [name, sql] : options.business_statements)
      if (name.empty() || name.starts_with("idemgate_") || sql.empty())
        throw std::invalid_argument(
            "idemgate: PostgresOptions::business_statements needs a name and an SQL text for "
            "each statement, and names that do not start with idemgate_ (the store's own); got "
            "'" +
            name + "'.");
    return options;
  }

  static std::shared_ptr<Shared> open(std::string uri, PostgresOptions options) {
    auto shared = std::make_shared<Shared>();
    shared->options = checked_options(std::move(options));
    const PostgresOptions& o = shared->options;
    shared->table = detail::checked_table_name(o.table);
    shared->sql = statements(shared->table);
    shared->pool.emplace(uri, o.pool_size, o.checkout_timeout, connection_settings(o, {}));
    shared->renewal_pool.emplace(uri, 1, o.checkout_timeout, connection_settings(o, {}), false);
    // Behind a transaction pooler, a session-level SET would stay on whichever server
    // connection ran it and leave other clients' commits, this store's own included, without
    // the WAL flush: relaxed reservations set it per transaction there (reserve_statement).
    if (o.relaxed_reservations)
      shared->relaxed_pool = std::make_unique<detail::ConnectionPool>(
          uri, o.pool_size, o.checkout_timeout,
          connection_settings(o, o.pooling == PostgresPooling::transaction
                                     ? std::string()
                                     : std::string("SET synchronous_commit = off;")),
          false);
    return shared;
  }

  detail::ConnectionPool& reservation_pool() { return relaxed_pool_ ? *relaxed_pool_ : pool_; }

  [[nodiscard]] bool pooled_by_transaction() const noexcept {
    return options_.pooling == PostgresPooling::transaction;
  }

  // With relaxed reservations, an in-flight row another attempt reserved may not be flushed yet:
  // a database crash could still lose it, and with it the event, once the caller has acked the
  // "in flight" answer. Before that answer goes out, one synchronous commit on the durable pool
  // flushes the WAL up to here, the other attempt's reservation included: a no-op update of the
  // row (a commit that wrote nothing would not wait for the flush). Without relaxed reservations
  // every reservation is flushed before its answer: nothing to do.
  void make_durable(const std::string& key_param) {
    if (!relaxed_pool_) return;
    run([&](Lease& c) {
      pqxx::nontransaction tx(c.connection());
      return exec_prepared(c, tx, Statement::make_durable, key_param);
    });
  }

  // The statements the store prepares, by number: a connection records which of them it has
  // prepared (ConnectionPool::Lease::prepared).
  enum class Statement : std::size_t {
    reserve,
    take_over,
    commit,
    fail,
    escalate,
    release,
    find,
    take_stale,
    escalated,
    resolve,
    settled,
    signals,
    record_mismatch,
    mismatches,
    purge,
    reserve_batch,
    extend,
    make_durable,
    batch_landed,
    redrive_key,
    redrive_range,
    reserve_labelled,
    redrive_cause,
    rows,
    count_rows,
    causes,
    gates,
    reserve_batch_labelled,
    count
  };

  struct Prepared {
    Statement statement;  // its place in prepared_statements, checked below
    const char* name;
    std::string Statements::*sql;
  };

  static constexpr Prepared prepared_statements[] = {
      {Statement::reserve, "idemgate_reserve", &Statements::reserve},
      {Statement::take_over, "idemgate_take_over", &Statements::take_over},
      {Statement::commit, "idemgate_commit", &Statements::commit},
      {Statement::fail, "idemgate_fail", &Statements::fail},
      {Statement::escalate, "idemgate_escalate", &Statements::escalate},
      {Statement::release, "idemgate_release", &Statements::release},
      {Statement::find, "idemgate_find", &Statements::find},
      {Statement::take_stale, "idemgate_take_stale", &Statements::take_stale},
      {Statement::escalated, "idemgate_escalated", &Statements::escalated},
      {Statement::resolve, "idemgate_resolve", &Statements::resolve},
      {Statement::settled, "idemgate_settled", &Statements::settled},
      {Statement::signals, "idemgate_signals", &Statements::signals},
      {Statement::record_mismatch, "idemgate_record_mismatch", &Statements::record_mismatch},
      {Statement::mismatches, "idemgate_mismatches", &Statements::mismatches},
      {Statement::purge, "idemgate_purge", &Statements::purge},
      {Statement::reserve_batch, "idemgate_reserve_batch", &Statements::reserve_batch},
      {Statement::extend, "idemgate_extend", &Statements::extend},
      {Statement::make_durable, "idemgate_make_durable", &Statements::make_durable},
      {Statement::batch_landed, "idemgate_batch_landed", &Statements::batch_landed},
      {Statement::redrive_key, "idemgate_redrive_key", &Statements::redrive_key},
      {Statement::redrive_range, "idemgate_redrive_range", &Statements::redrive_range},
      {Statement::reserve_labelled, "idemgate_reserve_labelled", &Statements::reserve_labelled},
      {Statement::redrive_cause, "idemgate_redrive_cause", &Statements::redrive_cause},
      {Statement::rows, "idemgate_rows", &Statements::rows},
      {Statement::count_rows, "idemgate_count", &Statements::count},
      {Statement::causes, "idemgate_causes", &Statements::causes},
      {Statement::gates, "idemgate_gates", &Statements::gates},
      {Statement::reserve_batch_labelled, "idemgate_reserve_batch_labelled",
       &Statements::reserve_batch_labelled},
  };
  static_assert(std::size(prepared_statements) == static_cast<std::size_t>(Statement::count));
  static_assert(
      [] {
        for (std::size_t i = 0; i < std::size(prepared_statements); ++i)
          if (static_cast<std::size_t>(prepared_statements[i].statement) != i) return false;
        return true;
      }(),
      "prepared_statements lists the statements in the order of Statement");
  static_assert(std::size(prepared_statements) + PostgresOptions::max_business_statements <=
                detail::ConnectionPool::max_prepared);

  // Runs one of the store's statements on the lease's connection, preparing it there first if
  // this connection has not yet: lazily, per connection, at the statement's first use — so the
  // server sees it at the same moment whether libpqxx prepares at once (7.x, 8.x) or on first
  // use (6.4), and nothing is prepared before migrate() created the table. A missing or outdated
  // log table shows as the SQLSTATE of this, the store's own, statement on every version; the
  // statement is prepared again at its next use. Behind a transaction pooler nothing is
  // prepared: the statement goes unnamed, with its text and parameters, in one round trip.
  template <class Transaction, class... Args>
  pqxx::result exec_prepared(Lease& lease, Transaction& tx, Statement statement, Args&&... args) {
    const auto index = static_cast<std::size_t>(statement);
    const Prepared& prepared = prepared_statements[index];
    try {
      if (pooled_by_transaction())
        return detail::pq::exec_params(tx, sql_.*prepared.sql, gate_, std::forward<Args>(args)...);
      if (!lease.prepared(index)) {
        detail::pq::prepare(lease.connection(), prepared.name, sql_.*prepared.sql);
        lease.set_prepared(index);
      }
      return detail::pq::exec_prepared(tx, prepared.name, gate_, std::forward<Args>(args)...);
    } catch (const pqxx::undefined_table&) {
      throw missing_table();
    } catch (const pqxx::undefined_column&) {
      throw outdated_table();
    }
  }

  // Runs a reservation statement (reserve, take_over, reserve_batch) on the reservation pool.
  // Relaxed reservations behind a transaction pooler run as a transaction of their own that
  // turns the WAL flush off for itself alone (SET LOCAL): the pooler may give every transaction
  // another server connection, so the relaxed pool's session-level SET is not used there. An
  // unknown COMMIT is retried like a lost connection: each of these statements recognises its
  // own earlier work by its holder token.
  template <class... Args>
  pqxx::result reserve_statement(Statement statement, const Args&... args) {
    return run_on(reservation_pool(), [&](Lease& c) {
      if (relaxed_pool_ && pooled_by_transaction()) {
        try {
          pqxx::work tx(c.connection());
          detail::pq::exec(tx, "SET LOCAL synchronous_commit = off");
          pqxx::result rows = exec_prepared(c, tx, statement, args...);
          tx.commit();
          return rows;
        } catch (const pqxx::in_doubt_error& e) {
          throw pqxx::broken_connection(e.what());
        }
      }
      pqxx::nontransaction tx(c.connection());
      return exec_prepared(c, tx, statement, args...);
    });
  }

  // Runs a write transaction of `key` (commit, resolve) on a pooled connection. A connection that
  // broke, a COMMIT whose fate is unknown, or a connection that cannot be opened (the server is
  // down, or a failover is under way) is tried again, on a fresh connection and after a pause
  // (`backoff`), up to `commit_attempts` times in all; `attempt(connection, n)` gets the
  // attempt's number, so that a repeat first looks whether the previous one landed.
  template <class Attempt>
  auto with_commit_retries(const Key& key, Attempt&& attempt)
      -> std::invoke_result_t<Attempt&, Lease&, int> {
    for (int n = 1;; ++n) {
      std::string why;
      try {
        auto lease = pool_.acquire();
        try {
          prepare_business_statements(lease);
          return attempt(lease, n);
        } catch (...) {
          auto again = retry_reason(lease, std::current_exception());
          if (!again) throw;  // anything else, the business write's own errors included, unchanged
          why = std::move(*again);
        }
      } catch (const detail::ConnectionUnavailable& e) {
        why = e.what();
      }
      if (n >= options_.commit_attempts) throw commit_unknown(key, n, why);
      const auto pause = backoff(n);
      log("idemgate: commit attempt " + std::to_string(n) + " of " +
          std::to_string(options_.commit_attempts) + " for key " + key.hex() + " failed (" +
          trimmed(why) + "); trying again in " + detail::describe(pause) + ".");
      std::this_thread::sleep_for(pause);
    }
  }

  // The pause after failed commit attempt `n`: `retry_backoff` doubled per attempt, at most 5 s,
  // of which a random quarter is taken off so that workers that failed together retry apart.
  std::chrono::milliseconds backoff(int n) const {
    using std::chrono::milliseconds;
    milliseconds pause = options_.retry_backoff;
    for (int i = 1; i < n && pause < milliseconds(5000); ++i) pause *= 2;
    pause = std::min(pause, milliseconds(5000));
    const auto quarter = pause.count() / 4;
    if (quarter > 0)
      pause -= milliseconds(
          static_cast<std::int64_t>(static_cast<std::uint64_t>(detail::new_holder_token()) %
                                    static_cast<std::uint64_t>(quarter + 1)));
    return pause;
  }

  // Why a commit attempt that threw may go again on a fresh connection: the connection broke,
  // the COMMIT's outcome is unknown, or the server went away (a reconnectable SQL state); the
  // lease is marked broken then. A `StoreError` is rethrown, and an error of the log's schema
  // becomes one; anything else (the business write's own errors among them) comes back as
  // nullopt, for the caller to decide. Call it from a `catch (...)`.
  std::optional<std::string> retry_reason(Lease& lease, std::exception_ptr error) const {
    try {
      std::rethrow_exception(error);
    } catch (const StoreError&) {
      throw;
    } catch (const pqxx::broken_connection& e) {
      lease.mark_broken();
      return e.what();
    } catch (const pqxx::in_doubt_error& e) {
      lease.mark_broken();
      return e.what();
    } catch (const pqxx::sql_error& e) {
      if (!reconnectable(e)) {
        throw_if_log_schema_error(e);
        return std::nullopt;
      }
      lease.mark_broken();
      return e.what();
    } catch (...) {
      return std::nullopt;
    }
  }

  // Whether an SQL error says this connection is no use any more but another may be: the server
  // is shutting down or starting (57P0x), the connection failed (08xxx), or it reached a standby
  // (25006, read-only: after a failover, an old primary that came back as a standby). Nothing
  // was written: the work may run again on a fresh connection.
  static bool reconnectable(const pqxx::sql_error& e) {
    const std::string state = detail::pq::sqlstate(e);
    return state == "25006" || state.rfind("57P0", 0) == 0 || state.rfind("08", 0) == 0;
  }

  // The pool's guards against dead connections, from the options.
  static detail::ConnectionSettings connection_settings(const PostgresOptions& options,
                                                        std::string session_sql) {
    detail::ConnectionSettings settings;
    settings.connect_timeout = options.connect_timeout;
    settings.keepalives_idle = options.keepalives_idle;
    settings.keepalives_interval = options.keepalives_interval;
    settings.keepalives_count = static_cast<int>(options.keepalives_count);
    settings.tcp_user_timeout = options.tcp_user_timeout;
    // Behind a transaction pooler a session-level SET would stay on a server connection other
    // clients share: the statement timeout is then the role's or the server's to set.
    settings.statement_timeout = options.pooling == PostgresPooling::transaction
                                     ? std::chrono::milliseconds::zero()
                                     : options.statement_timeout;
    settings.reply_timeout = options.reply_timeout;
    settings.session_sql = std::move(session_sql);
    settings.log = options.log;
    return settings;
  }

  // Reports through `PostgresOptions::log`; a log that throws is ignored.
  void log(const std::string& line) const noexcept {
    if (!options_.log) return;
    try {
      options_.log(line);
    } catch (...) {
    }
  }

  static std::string trimmed(std::string text) {
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
    return text;
  }

  // Runs one unit of work on a pooled connection. A connection that broke before or during
  // the work is replaced and the work tried once more: every statement run this way is safe to
  // repeat (inserts conflict, updates are fenced).
  template <class Work>
  auto run(Work&& work) -> std::invoke_result_t<Work&, Lease&> {
    return run_on(pool_, std::forward<Work>(work));
  }

  template <class Work>
  auto run_on(detail::ConnectionPool& pool, Work&& work) -> std::invoke_result_t<Work&, Lease&> {
    for (int attempt = 1;; ++attempt) {
      auto lease = pool.acquire();
      try {
        return work(lease);
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
        if (!reconnectable(e) || attempt >= 2) {
          throw_if_log_schema_error(e);
          throw;  // anything else, the business write's own errors included, unchanged
        }
        lease.mark_broken();
      }
    }
  }

  // What a fenced write finds when it touched no row, or before it repeats a commit whose
  // COMMIT may have landed: nullopt when the row is still in flight under this fence (the write
  // may go ahead); `committed` when this fence's own earlier attempt landed; `lost_lease` when a
  // higher fence took the event over. A row gone, or in flight under a lower fence, means this
  // attempt's own reservation or takeover was lost in a database crash (relaxed reservations):
  // nobody holds the event, so it must not be acked. Asked on the caller's connection: a second
  // checkout could wait on a pool of one.
  template <class Transaction>
  std::optional<CommitStatus> settled_state(Lease& lease, Transaction& tx,
                                            const std::string& key_param, std::int64_t fence,
                                            RecordStatus target) {
    const pqxx::result rows = exec_prepared(lease, tx, Statement::settled, key_param);
    if (rows.empty())
      throw StoreError("idemgate: the reservation of this event is gone from " + table_ +
                       " (a reservation lost in a database crash?); nothing was committed. Do "
                       "not ack: the redelivery reserves it again and the downstream returns "
                       "the original outcome for the key.");
    const RecordStatus status = parse_record_status(detail::pq::text_field(rows[0][0]));
    const std::int64_t stored = detail::pq::int_field(rows[0][1]);
    const detail::Settled settled = detail::settled_state(status, stored, fence, target);
    if (settled == detail::Settled::fence_went_back)
      throw StoreError("idemgate: the event's row in " + table_ + " is back at fence " +
                       std::to_string(stored) + ", below this attempt's " + std::to_string(fence) +
                       ": this attempt's takeover was lost in a database crash and nobody holds "
                       "the event. Nothing was committed. Do not ack: the redelivery or the "
                       "reconciler takes it over again.");
    if (settled == detail::Settled::by_this_attempt) return CommitStatus::committed;
    if (settled == detail::Settled::still_held) return std::nullopt;
    return CommitStatus::lost_lease;
  }

  template <class Transaction>
  CommitStatus settled_earlier(Lease& lease, Transaction& tx, const std::string& key_param,
                               std::int64_t fence, RecordStatus target) {
    return settled_state(lease, tx, key_param, fence, target).value_or(CommitStatus::lost_lease);
  }

  // One transaction for `commit_batch` and `commit_bulk`: `write(tx)` runs the business writes
  // and fenced updates and says whether every fence held; then one COMMIT. Retried on a fresh
  // connection like `commit`, asking first, after a COMMIT that may have landed unheard, whether
  // the batch did land (one transaction: all of it, or none).
  template <class Write>
  std::optional<std::vector<CommitStatus>> commit_together(std::span<const CommitItem> items,
                                                           Write&& write) {
    std::vector<std::string_view> keys;
    std::vector<std::int64_t> fences;
    for (const CommitItem& item : items) {
      keys.push_back(item.key.view());
      fences.push_back(item.fence);
    }
    const std::string key_array = detail::pq::bytea_array_param(keys);
    const std::string fence_array = detail::pq::bigint_array_param(fences);
    bool may_have_landed = false;
    for (int attempt = 1;; ++attempt) {
      std::string why;
      try {
        auto lease = pool_.acquire();
        try {
          prepare_business_statements(lease);
          if (may_have_landed) {
            pqxx::nontransaction check(lease.connection());
            const std::int64_t landed = detail::pq::int_field(
                exec_prepared(lease, check, Statement::batch_landed, key_array, fence_array)[0][0]);
            if (landed == static_cast<std::int64_t>(items.size()))
              return std::vector<CommitStatus>(items.size(), CommitStatus::committed);
            if (landed != 0) return std::nullopt;  // fences moved meanwhile: item by item decides
            may_have_landed = false;
          }
          pqxx::work tx(lease.connection());
          if (!write(tx)) return std::nullopt;  // a fence moved: rolled back with `tx`
          may_have_landed = true;  // from here on, the COMMIT may land whatever we hear back
          tx.commit();
          return std::vector<CommitStatus>(items.size(), CommitStatus::committed);
        } catch (...) {
          auto again = retry_reason(lease, std::current_exception());
          // A business write refused or threw: item by item costs only its message.
          if (!again) return std::nullopt;
          why = std::move(*again);
        }
      } catch (const detail::ConnectionUnavailable& e) {
        why = e.what();
      }
      pause_or_give_up("batch commit", items.size(), attempt, why);
    }
  }

  // The fenced commit update of many keys in one statement, as literals (see fenced_update): it
  // changes one row per item whose fence still holds.
  std::string bulk_fenced_update_sql(std::span<const CommitItem> items) const {
    std::string sql = "UPDATE " + table_ +
                      " AS log SET status = 'committed', result = v.result, updated_at = now()"
                      " FROM (VALUES ";
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (i > 0) sql += ", ";
      sql += "(" + detail::pq::bytea_literal(items[i].key.view()) + ", " +
             std::to_string(items[i].fence) + "::bigint, " +
             detail::pq::bytea_literal(items[i].result) + ")";
    }
    sql += ") AS v(key, fence, result) WHERE log.gate = '" + gate_ +
           "' AND log.key = v.key AND log.status IN ('in_flight', '') AND log.fence = v.fence";
    return sql;
  }

  // The fenced commit update of `commit` for one key: the prepared `idemgate_commit` run by an
  // EXECUTE with the key's literals, so the server neither parses nor plans the UPDATE again for
  // every event (it still goes through fenced_update's checked path, which takes no parameters).
  // Behind a transaction pooler nothing is prepared: the UPDATE itself, as literals.
  std::string commit_update_sql(Lease& lease, const Key& key, std::int64_t fence,
                                std::string_view result) {
    if (pooled_by_transaction()) return fenced_update_sql(key, fence, result);
    prepare_at_once(lease, Statement::commit);
    return "EXECUTE idemgate_commit('" + gate_ + "', " + detail::pq::bytea_literal(key.view()) +
           ", " + std::to_string(fence) + ", " + detail::pq::bytea_literal(result) + ")";
  }

  // VACUUM of the log after a purge. Autovacuum alone visits a table at most once per
  // autovacuum_naptime (a minute by default): a log whose rows are purged as fast as they
  // arrive would meanwhile fill with dead rows that every scan of the purge steps over.
  void vacuum_log() {
    try {
      run([&](Lease& c) {
        pqxx::nontransaction tx(c.connection());
        detail::pq::exec(tx, "VACUUM (SKIP_LOCKED) " + table_);
        return 0;
      });
    } catch (const pqxx::sql_error& e) {
      log("idemgate: VACUUM of " + table_ + " after a purge failed: " + e.what() +
          " The purge stands; autovacuum reclaims the space on its own schedule.");
    }
  }

  // Prepares PostgresOptions::business_statements on the lease's connection, those not yet
  // prepared there, before a commit's transaction opens (their bits follow the store's own).
  void prepare_business_statements(Lease& lease) {
    const auto& statements = options_.business_statements;
    for (std::size_t i = 0; i < statements.size(); ++i) {
      const std::size_t bit = static_cast<std::size_t>(Statement::count) + i;
      if (lease.prepared(bit)) continue;
      detail::pq::prepare_at_once(lease.connection(), statements[i].first, statements[i].second);
      lease.set_prepared(bit);
    }
  }

  // Prepares one of the store's statements on the lease's connection now, if this connection
  // has not yet, for an SQL-level EXECUTE of it (libpqxx 6.4 would otherwise send it to the
  // server only at its first exec_prepared). Called outside any transaction on the connection.
  void prepare_at_once(Lease& lease, Statement statement) {
    const auto index = static_cast<std::size_t>(statement);
    if (lease.prepared(index)) return;
    const Prepared& prepared = prepared_statements[index];
    try {
      detail::pq::prepare_at_once(lease.connection(), prepared.name, sql_.*prepared.sql);
    } catch (const pqxx::undefined_table&) {
      throw missing_table();
    } catch (const pqxx::undefined_column&) {
      throw outdated_table();
    }
    lease.set_prepared(index);
  }

  // The fenced commit update for one key, as literals (see fenced_update; the status test as in
  // Statements::commit).
  std::string fenced_update_sql(const Key& key, std::int64_t fence, std::string_view result) const {
    return "UPDATE " + table_ +
           " SET status = 'committed', result = " + detail::pq::bytea_literal(result) +
           ", updated_at = now() WHERE gate = '" + gate_ +
           "' AND key = " + detail::pq::bytea_literal(key.view()) +
           " AND status IN ('in_flight', '') AND fence = " + std::to_string(fence);
  }

  // `sql` behind a statement that PostgreSQL refuses outside a transaction block (the implicit
  // block of a multi-statement query included): when a business write ended the transaction
  // itself (ROLLBACK, COMMIT) and went on, the statement after it fails instead of running, and
  // committing, on its own. One round trip with the statement.
  // Calls `exec` with an operator's query as the parameters $2 to $9 of `rows` and `count`: a
  // switch and a value for each filter (libpqxx 6.4 binds no NULL parameters).
  template <class Exec>
  static pqxx::result with_query(const RowQuery& query, Exec&& exec) {
    const auto micros = [](const std::optional<std::chrono::system_clock::time_point>& at) {
      return at ? detail::sql_micros(*at) : std::int64_t{0};
    };
    return exec(std::string(query.status ? to_string(*query.status) : std::string_view()),
                query.reason.has_value(), query.reason.value_or(std::string()),
                query.label_contains, query.changed_from.has_value(), micros(query.changed_from),
                query.changed_to.has_value(), micros(query.changed_to));
  }

  static std::string in_open_transaction(const std::string& sql) {
    return "SAVEPOINT idemgate_open; RELEASE SAVEPOINT idemgate_open; " + sql;
  }

  // Runs the status update that follows a business write. It goes through libpqxx's checked
  // path (a statement without parameters), which refuses to run once the transaction has
  // ended: with libpqxx 6.4, a failed statement that the business write caught ends the
  // transaction, and later parameterised statements would run — and commit — on their own.
  pqxx::result fenced_update(pqxx::work& tx, const std::string& sql, const Key& key) const {
    try {
      return detail::pq::exec(tx, sql);
    } catch (const pqxx::usage_error& e) {
      throw broken_transaction(key, e.what());
    } catch (const pqxx::sql_error& e) {
      if (ended_transaction(e)) throw broken_transaction(key, e.what());
      throw;
    }
  }

  // Runs a business write. A statement it sends after it swallowed an SQL error fails with
  // "current transaction is aborted" on libpqxx 7 and 8 (6.4 ended the transaction instead, see
  // fenced_update): either way the business write broke its transaction, and is named for it.
  template <class Write>
  void run_business_write(const Key& key, Write&& write) const {
    try {
      write();
    } catch (const pqxx::sql_error& e) {
      if (ended_transaction(e)) throw broken_transaction(key, e.what());
      throw;
    }
  }

  // After a failed attempt of a batch or group commit of `events` events: throws `StoreError`
  // once `commit_attempts` ran out, otherwise says so in the log and waits the backoff.
  void pause_or_give_up(const char* what, std::size_t events, int attempt, const std::string& why) {
    if (attempt >= options_.commit_attempts)
      throw StoreError(std::string("idemgate: the ") + what + " of " + std::to_string(events) +
                       " events failed " + std::to_string(attempt) + " times (" + trimmed(why) +
                       "); nothing was committed, or it could not be confirmed. Do not ack: "
                       "the redelivery or the reconciler finishes them.");
    const auto pause = backoff(attempt);
    log(std::string("idemgate: ") + what + " attempt " + std::to_string(attempt) + " of " +
        std::to_string(options_.commit_attempts) + " failed (" + trimmed(why) +
        "); trying again in " + detail::describe(pause) + ".");
    std::this_thread::sleep_for(pause);
  }

  // Undoes the current item of a group commit; false when the transaction is gone (libpqxx 6.4
  // ends it with a failed statement), so the group must start again.
  static bool rolled_back_to_savepoint(pqxx::work& tx) {
    try {
      detail::pq::exec(tx, "ROLLBACK TO SAVEPOINT idemgate_item");
      return true;
    } catch (const pqxx::broken_connection&) {
      throw;
    } catch (const std::exception&) {
      return false;
    }
  }

  // Whether an error says the transaction was aborted earlier, or is gone.
  static bool ended_transaction(const pqxx::sql_error& e) {
    const std::string state = detail::pq::sqlstate(e);
    return state == "25P02" || state == "25P01";
  }

  BusinessWriteError broken_transaction(const Key& key, const std::string& detail) const {
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

  CommitStatus settle(Statement statement, const Key& key, std::int64_t fence,
                      std::string_view reason, RecordStatus target) {
    const std::string key_param = detail::pq::bytea_param(key.view());
    const std::string reason_text(reason);
    return run([&](Lease& c) {
      pqxx::nontransaction tx(c.connection());
      if (detail::pq::affected_rows(
              exec_prepared(c, tx, statement, key_param, fence, reason_text)) > 0)
        return CommitStatus::committed;
      return settled_earlier(c, tx, key_param, fence, target);
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
    const std::string query = detail::pq::failed_query(e);
    const std::string message = e.what();
    return query.find(detail::unqualified(table_)) != std::string::npos ||
           message.find(detail::unqualified(table_)) != std::string::npos;
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

  StoreError commit_unknown(const Key& key, int attempts, const std::string& why) const {
    return StoreError("idemgate: the commit of key " + key.hex() +
                      " could not be confirmed after " + std::to_string(attempts) + " attempts (" +
                      trimmed(why) +
                      "). Do not ack: the row stays in flight and a redelivery after its lease, "
                      "or the reconciler, finishes it.");
  }

  std::shared_ptr<Shared> shared_;
  std::string gate_;  // bound as $1 of every statement
  // This handle's view of the shared state.
  PostgresOptions& options_;
  std::string& table_;
  Statements& sql_;
  detail::ConnectionPool& pool_;
  detail::ConnectionPool& renewal_pool_;  // lease renewals only (extend)
  std::unique_ptr<detail::ConnectionPool>& relaxed_pool_;
};

static_assert(store<PostgresStore>);
static_assert(monitored_store<PostgresStore>);
static_assert(explaining_store<PostgresStore>);
static_assert(lease_extending_store<PostgresStore>);
static_assert(lease_renewing_store<PostgresStore>);
static_assert(redrivable_store<PostgresStore>);
static_assert(labelling_store<PostgresStore>);
static_assert(operable_store<PostgresStore>);

}  // namespace idemgate
