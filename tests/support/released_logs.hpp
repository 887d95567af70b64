#pragma once

// Every earlier released shape of the idempotency log, on PostgreSQL and on SQLite, exactly as a
// fresh migrate() of that version created it on an empty database, and rows to fill each shape
// with, as that version wrote them. For the upgrade tests: create an old log, fill it, then run
// the current migrate() on it.
//
// The DDL is each commit's own text (`git show <commit>:include/idemgate/store/postgres.hpp` or
// `sqlite.hpp`), with the table name substituted. Left out, because they change nothing on an
// empty database: PostgreSQL's `ALTER TABLE ... ADD COLUMN IF NOT EXISTS` for columns the CREATE
// TABLE just made, the `DROP INDEX ... IF EXISTS` of an earlier version's indexes, the key
// migration (run only on a log keyed by key alone) and the advisory lock. SQLite's column
// additions ran only on a log that existed and lacked them, so its scripts are its schema_sql()
// whole. Shapes 4 and 5 on PostgreSQL run index_sql() without CONCURRENTLY, as that version's
// migrate() itself ran it behind a transaction pooler, so each script runs in one transaction.
//
// The last version before numbered migrations (869246a) created shape 5 on both stores: its
// schema_sql() and index_sql() were 16f1eac's.

#include <idemgate/detail/crypto/sha256.hpp>
#include <idemgate/key.hpp>
#include <idemgate/record.hpp>

#include <cctype>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace idemgate::test {

/// The released shapes of the log, oldest first (1..5).
inline constexpr int released_shapes = 5;

namespace released_detail {

inline void check_shape(int shape) {
  if (shape < 1 || shape > released_shapes)
    throw std::invalid_argument("released log shape " + std::to_string(shape) +
                                " does not exist; shapes run from 1 to " +
                                std::to_string(released_shapes));
}

inline bool is_identifier(const std::string& part, std::size_t longest) {
  if (part.empty() || part.size() > longest) return false;
  if (!(std::isalpha(static_cast<unsigned char>(part.front())) || part.front() == '_'))
    return false;
  for (char c : part)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

/// A PostgreSQL table name as the store accepts it: an identifier of up to 48 characters (the
/// index names add to it), optionally schema.table.
inline const std::string& pg_table(const std::string& t) {
  const auto dot = t.find('.');
  const bool ok = dot == std::string::npos
                      ? is_identifier(t, 48)
                      : is_identifier(t.substr(0, dot), 48) && is_identifier(t.substr(dot + 1), 48);
  if (!ok) throw std::invalid_argument("\"" + t + "\" is not a usable PostgreSQL table name");
  return t;
}

/// A SQLite table name as the store accepts it: one identifier of up to 63 characters.
inline const std::string& sqlite_table(const std::string& t) {
  if (!is_identifier(t, 63))
    throw std::invalid_argument("\"" + t + "\" is not a usable table name");
  return t;
}

/// The table's name without its schema: what the PostgreSQL store named its indexes after.
inline std::string unqualified(const std::string& t) {
  const auto dot = t.find('.');
  return dot == std::string::npos ? t : t.substr(dot + 1);
}

inline std::string count(int n) {
  if (n < 0) throw std::invalid_argument("a negative number of rows");
  return std::to_string(n);
}

}  // namespace released_detail

// ---------------------------------------------------------------------------------------------
// PostgreSQL

/// PostgreSQL shape 1, dc3a4fb (the first log, unchanged through 4c48a90): keyed by `key` alone,
/// no duplicates, one partial index on in-flight leases, no mismatches table.
inline std::string released_pg_log_1(const std::string& t) {
  const std::string index =
      released_detail::unqualified(released_detail::pg_table(t)) + "_in_flight";
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

namespace released_detail {

/// The log of PostgreSQL shape 2 with `duplicates` of the given type (padded to the column's
/// width): the rest of d5292cb's schema_sql() as it wrote it (its ALTER TABLE ... ADD COLUMN IF
/// NOT EXISTS duplicates left out). 9b5b69e wrote the same with bigint.
inline std::string pg_log_2(const std::string& t, const char* duplicates_type) {
  const std::string name = unqualified(pg_table(t));
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
         "  duplicates  " +
         duplicates_type +
         " NOT NULL DEFAULT 0,\n"
         "  created_at  timestamptz NOT NULL DEFAULT now(),\n"
         "  updated_at  timestamptz NOT NULL DEFAULT now(),\n"
         "  CHECK (status <> 'committed' OR result IS NOT NULL)\n"
         ");\n"
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

}  // namespace released_detail

/// PostgreSQL shape 2, d5292cb (also 6b6724e and 939653b): adds `duplicates integer`, the
/// escalated index, the BRIN index on created_at and the mismatches table with its index on at.
inline std::string released_pg_log_2(const std::string& t) {
  return released_detail::pg_log_2(t, "integer    ");
}

/// PostgreSQL shape 2 as 9b5b69e (and a9983aa after it) created it: shape 2 with `duplicates
/// bigint`. 9b5b69e changed the column's type in the CREATE TABLE (and in its ADD COLUMN) two
/// commits before 2d93ceb added holder and attempts; no later migrate() changes the type of an
/// `integer` column, so a log created by d5292cb keeps it. Rows of shape 2
/// (`released_pg_rows(2, ...)`) fit it.
inline std::string released_pg_log_2_bigint(const std::string& t) {
  return released_detail::pg_log_2(t, "bigint     ");
}

/// PostgreSQL shape 3, 2d93ceb (unchanged through 280c141's parent): `duplicates bigint`, adds
/// `holder` and `attempts`; the same indexes and mismatches table as shape 2.
inline std::string released_pg_log_3(const std::string& t) {
  const std::string name = released_detail::unqualified(released_detail::pg_table(t));
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
         "  holder      bigint      NOT NULL DEFAULT 0,\n"
         "  attempts    bigint      NOT NULL DEFAULT 1,\n"
         "  created_at  timestamptz NOT NULL DEFAULT now(),\n"
         "  updated_at  timestamptz NOT NULL DEFAULT now(),\n"
         "  CHECK (status <> 'committed' OR result IS NOT NULL)\n"
         ");\n"
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

/// PostgreSQL shape 4, 280c141: adds `gate text NOT NULL DEFAULT '' CHECK (octet_length(gate) <=
/// 64)` as the first column, PRIMARY KEY (gate, key) and mismatches.gate; the in-flight and
/// escalated indexes become index_sql()'s per-gate `_gate_in_flight` and `_gate_escalated`
/// (the BRIN index on created_at stays).
inline std::string released_pg_log_4(const std::string& t) {
  const std::string name = released_detail::unqualified(released_detail::pg_table(t));
  // schema_sql()
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
         "  created_at  timestamptz NOT NULL DEFAULT now(),\n"
         "  updated_at  timestamptz NOT NULL DEFAULT now(),\n"
         "  PRIMARY KEY (gate, key),\n"
         "  CHECK (status <> 'committed' OR result IS NOT NULL)\n"
         ");\n"
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
         "CREATE INDEX IF NOT EXISTS " +
         name + "_mismatches_at ON " + t +
         "_mismatches (at);\n"
         // index_sql(), without CONCURRENTLY
         "CREATE INDEX IF NOT EXISTS " +
         name + "_gate_in_flight ON " + t +
         " (gate, lease_until) WHERE status = 'in_flight';\n"
         "CREATE INDEX IF NOT EXISTS " +
         name + "_gate_escalated ON " + t +
         " (gate, updated_at) WHERE status = 'escalated';\n"
         "CREATE INDEX IF NOT EXISTS " +
         name + "_created ON " + t + " USING brin (created_at);\n";
}

/// PostgreSQL shape 5, 16f1eac (unchanged up to 869246a): adds `label text` and `history jsonb`
/// after attempts, and index_sql()'s `_gate_failed` index (gate, updated_at) WHERE status =
/// 'failed'.
inline std::string released_pg_log_5(const std::string& t) {
  const std::string name = released_detail::unqualified(released_detail::pg_table(t));
  // schema_sql()
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
         "CREATE INDEX IF NOT EXISTS " +
         name + "_mismatches_at ON " + t +
         "_mismatches (at);\n"
         // index_sql(), without CONCURRENTLY
         "CREATE INDEX IF NOT EXISTS " +
         name + "_gate_in_flight ON " + t +
         " (gate, lease_until) WHERE status = 'in_flight';\n"
         "CREATE INDEX IF NOT EXISTS " +
         name + "_gate_escalated ON " + t +
         " (gate, updated_at) WHERE status = 'escalated';\n"
         "CREATE INDEX IF NOT EXISTS " +
         name + "_gate_failed ON " + t +
         " (gate, updated_at) WHERE status = 'failed';\n"
         "CREATE INDEX IF NOT EXISTS " +
         name + "_created ON " + t + " USING brin (created_at);\n";
}

/// The DDL that shape `k`'s migrate() ran on an empty PostgreSQL database for log table `t`, as
/// one script of statements separated by ';' (no CONCURRENTLY, so it runs in one transaction).
/// Shapes: 1 dc3a4fb (first log), 2 d5292cb (+ duplicates integer, escalated and BRIN created
/// indexes, mismatches table), 3 2d93ceb (duplicates bigint, + holder, attempts), 4 280c141
/// (+ gate, primary key (gate, key), mismatches.gate, per-gate indexes), 5 16f1eac (+ label,
/// history, the _gate_failed index). See `released_pg_log_2_bigint` for 9b5b69e's shape 2.
inline std::string released_pg_log(int shape, const std::string& t) {
  released_detail::check_shape(shape);
  released_detail::pg_table(t);
  switch (shape) {
    case 1:
      return released_pg_log_1(t);
    case 2:
      return released_pg_log_2(t);
    case 3:
      return released_pg_log_3(t);
    case 4:
      return released_pg_log_4(t);
    default:
      return released_pg_log_5(t);
  }
}

/// The key `released_pg_rows` gives event `i`: sha256 of its number as 4 big-endian bytes.
inline Key released_pg_key(int i) {
  const auto u = static_cast<std::uint32_t>(i);
  const char bytes[] = {static_cast<char>(u >> 24), static_cast<char>(u >> 16),
                        static_cast<char>(u >> 8), static_cast<char>(u)};
  return Key(detail::sha256(std::string_view(bytes, 4)));
}

/// The fingerprint `released_pg_rows` gives event `i`: sha256 of its request.
inline Fingerprint released_pg_fingerprint(int i) {
  return detail::sha256("{\"order\":" + std::to_string(i) + "}");
}

/// Rows to fill a PostgreSQL log of shape `shape` (as `released_pg_log` made it), as the
/// version of that shape wrote them: `n` rows, i = 1..n from generate_series, key
/// sha256(int4send(i)), request '{"order":i}', fingerprint sha256(request), fence 1 + i % 3. By
/// i % 4: 1 committed (result '{"booking":i}'), 2 failed, 3 escalated (both with a reason), 0 in
/// flight with an expired lease. created_at an hour ago plus i microseconds, updated_at 5 ms
/// later, lease_until 30 s after created_at. From shape 2: duplicates = i % 3, and two mismatch
/// rows (source 'lost_lease', the keys of i = 1 and 5). From shape 3: holder 1000000 + i, attempts
/// 5 on escalated rows, 1 on committed ones, 1 or 2 (by i / 4 % 2) on failed and in-flight ones.
/// From shape 4: gate = '' on every row and mismatch. Shape 5: label 'order i' on every third row,
/// and the history that version kept (one jsonb entry for a failed or escalated row, a
/// 'taken_over' entry for an in-flight row on its second attempt, none otherwise).
inline std::string released_pg_rows(int shape, const std::string& t, int n) {
  released_detail::check_shape(shape);
  released_detail::pg_table(t);
  std::string columns = "key, status, fence, lease_until, fingerprint, request, result, reason";
  std::string values =
      "sha256(int4send(i)), status, 1 + i % 3, at + interval '30 seconds', sha256(request), "
      "request, CASE WHEN status = 'committed' THEN convert_to('{\"booking\":' || i || '}', "
      "'UTF8') END, reason";
  if (shape >= 2) {
    columns += ", duplicates";
    values += ", i % 3";
  }
  if (shape >= 3) {
    columns += ", holder, attempts";
    values += ", 1000000 + i, attempts";
  }
  if (shape >= 4) {
    columns += ", gate";
    values += ", ''";
  }
  if (shape >= 5) {
    const auto at = [](const std::string& when) {
      return "(extract(epoch FROM " + when + ") * 1000000)::bigint";
    };
    columns += ", label, history";
    values +=
        ", CASE WHEN i % 3 = 0 THEN 'order ' || i END, CASE WHEN status IN ('failed', "
        "'escalated') THEN jsonb_build_array(jsonb_build_object('attempt', attempts, 'outcome', "
        "status, 'reason', reason, 'at', " +
        at("at + interval '5 milliseconds'") +
        ")) WHEN status = 'in_flight' AND attempts > 1 THEN "
        "jsonb_build_array(jsonb_build_object('attempt', attempts - 1, 'outcome', 'taken_over', "
        "'reason', 'lease expired', 'at', " +
        at("at") + ")) END";
  }
  columns += ", created_at, updated_at";
  values += ", at, at + interval '5 milliseconds'";
  std::string sql =
      "INSERT INTO " + t + " (" + columns + ") SELECT " + values +
      " FROM (SELECT i, status, convert_to('{\"order\":' || i || '}', 'UTF8') AS request,"
      " now() - interval '1 hour' + i * interval '1 microsecond' AS at,"
      " CASE status WHEN 'failed' THEN 'downstream answered 422'"
      " WHEN 'escalated' THEN 'poison: gave up after 5 attempts' END AS reason,"
      " CASE status WHEN 'escalated' THEN 5 WHEN 'committed' THEN 1 ELSE 1 + i / 4 % 2 END"
      " AS attempts"
      " FROM generate_series(1, " +
      released_detail::count(n) +
      ") AS i, LATERAL (SELECT (ARRAY['in_flight', 'committed', 'failed', 'escalated'])"
      "[i % 4 + 1] AS status) AS s) AS r;\n";
  if (shape >= 2) {
    const std::string gate = shape >= 4 ? "''::text, " : "";
    const auto mismatch = [&](int i) {
      const std::string k = std::to_string(i);
      return "(" + gate + "sha256(int4send(" + k + ")), convert_to('{\"booking\":" + k +
             "}', 'UTF8'), convert_to('{\"booking\":" + k + ",\"again\":true}', 'UTF8'), " +
             "'lost_lease')";
    };
    sql += "INSERT INTO " + t + "_mismatches (" + (shape >= 4 ? "gate, " : "") +
           "key, stored, observed, source) VALUES " + mismatch(1) + ", " + mismatch(5) + ";\n";
  }
  return sql;
}

// ---------------------------------------------------------------------------------------------
// SQLite

/// SQLite shape 1, 4c48a90 (the first SQLite log): keyed by `key` alone, no duplicates, one
/// partial index on in-flight leases, no mismatches table.
inline std::string released_sqlite_log_1(const std::string& t) {
  released_detail::sqlite_table(t);
  return "CREATE TABLE IF NOT EXISTS " + t +
         " (\n"
         "  key         BLOB    NOT NULL PRIMARY KEY\n"
         "              CHECK (typeof(key) = 'blob' AND length(key) = 32),\n"
         "  status      TEXT    NOT NULL\n"
         "              CHECK (status IN ('in_flight', 'committed', 'failed', 'escalated')),\n"
         "  fence       INTEGER NOT NULL DEFAULT 1 CHECK (fence > 0),\n"
         "  lease_until INTEGER NOT NULL,  -- microseconds since the Unix epoch\n"
         "  fingerprint BLOB    NOT NULL\n"
         "              CHECK (typeof(fingerprint) = 'blob' AND length(fingerprint) = 32),\n"
         "  request     BLOB    NOT NULL,\n"
         "  result      BLOB,\n"
         "  reason      TEXT,\n"
         "  created_at  INTEGER NOT NULL,  -- microseconds since the Unix epoch\n"
         "  updated_at  INTEGER NOT NULL,  -- microseconds since the Unix epoch\n"
         "  CHECK (status <> 'committed' OR result IS NOT NULL)\n"
         ");\n"
         "CREATE INDEX IF NOT EXISTS " +
         t + "_in_flight ON " + t + " (lease_until) WHERE status = 'in_flight';\n";
}

/// SQLite shape 2, d5292cb (unchanged through 2d93ceb): adds `duplicates`, the escalated and
/// created_at indexes and the mismatches table with its index on at.
inline std::string released_sqlite_log_2(const std::string& t) {
  released_detail::sqlite_table(t);
  return "CREATE TABLE IF NOT EXISTS " + t +
         " (\n"
         "  key         BLOB    NOT NULL PRIMARY KEY\n"
         "              CHECK (typeof(key) = 'blob' AND length(key) = 32),\n"
         "  status      TEXT    NOT NULL\n"
         "              CHECK (status IN ('in_flight', 'committed', 'failed', 'escalated')),\n"
         "  fence       INTEGER NOT NULL DEFAULT 1 CHECK (fence > 0),\n"
         "  lease_until INTEGER NOT NULL,  -- microseconds since the Unix epoch\n"
         "  fingerprint BLOB    NOT NULL\n"
         "              CHECK (typeof(fingerprint) = 'blob' AND length(fingerprint) = 32),\n"
         "  request     BLOB    NOT NULL,\n"
         "  result      BLOB,\n"
         "  reason      TEXT,\n"
         "  duplicates  INTEGER NOT NULL DEFAULT 0,  -- reservations that met this key\n"
         "  created_at  INTEGER NOT NULL,  -- microseconds since the Unix epoch\n"
         "  updated_at  INTEGER NOT NULL,  -- microseconds since the Unix epoch\n"
         "  CHECK (status <> 'committed' OR result IS NOT NULL)\n"
         ");\n"
         // indexes_sql()
         "-- Stranded work: the reconciler's scan, the in-flight count and the oldest row.\n"
         "CREATE INDEX IF NOT EXISTS " +
         t + "_in_flight ON " + t +
         " (lease_until) WHERE status = 'in_flight';\n"
         "-- The manual queue and its count.\n"
         "CREATE INDEX IF NOT EXISTS " +
         t + "_escalated ON " + t +
         " (updated_at) WHERE status = 'escalated';\n"
         "-- Retention and the signals' window.\n"
         "CREATE INDEX IF NOT EXISTS " +
         t + "_created ON " + t +
         " (created_at);\n"
         "-- Downstream answers that differed from the stored one (healthy: empty).\n"
         "CREATE TABLE IF NOT EXISTS " +
         t +
         "_mismatches (\n"
         "  key         BLOB    NOT NULL CHECK (typeof(key) = 'blob' AND length(key) = 32),\n"
         "  stored      BLOB    NOT NULL,\n"
         "  observed    BLOB    NOT NULL,\n"
         "  source      TEXT    NOT NULL,\n"
         "  at          INTEGER NOT NULL   -- microseconds since the Unix epoch\n"
         ");\n"
         "CREATE INDEX IF NOT EXISTS " +
         t + "_mismatches_at ON " + t + "_mismatches (at);\n";
}

/// SQLite shape 3, c3e4733 (unchanged through 280c141's parent): adds `attempts` and the partial
/// `_failed` index on updated_at.
inline std::string released_sqlite_log_3(const std::string& t) {
  released_detail::sqlite_table(t);
  return "CREATE TABLE IF NOT EXISTS " + t +
         " (\n"
         "  key         BLOB    NOT NULL PRIMARY KEY\n"
         "              CHECK (typeof(key) = 'blob' AND length(key) = 32),\n"
         "  status      TEXT    NOT NULL\n"
         "              CHECK (status IN ('in_flight', 'committed', 'failed', 'escalated')),\n"
         "  fence       INTEGER NOT NULL DEFAULT 1 CHECK (fence > 0),\n"
         "  lease_until INTEGER NOT NULL,  -- microseconds since the Unix epoch\n"
         "  fingerprint BLOB    NOT NULL\n"
         "              CHECK (typeof(fingerprint) = 'blob' AND length(fingerprint) = 32),\n"
         "  request     BLOB    NOT NULL,\n"
         "  result      BLOB,\n"
         "  reason      TEXT,\n"
         "  duplicates  INTEGER NOT NULL DEFAULT 0,  -- reservations that met this key\n"
         "  attempts    INTEGER NOT NULL DEFAULT 1,  -- 1 + takeovers and re-drives\n"
         "  created_at  INTEGER NOT NULL,  -- microseconds since the Unix epoch\n"
         "  updated_at  INTEGER NOT NULL,  -- microseconds since the Unix epoch\n"
         "  CHECK (status <> 'committed' OR result IS NOT NULL)\n"
         ");\n"
         // indexes_sql()
         "-- Stranded work: the reconciler's scan, the in-flight count and the oldest row.\n"
         "CREATE INDEX IF NOT EXISTS " +
         t + "_in_flight ON " + t +
         " (lease_until) WHERE status = 'in_flight';\n"
         "-- The manual queue and its count.\n"
         "CREATE INDEX IF NOT EXISTS " +
         t + "_escalated ON " + t +
         " (updated_at) WHERE status = 'escalated';\n"
         "-- Re-driving failed rows by when they failed.\n"
         "CREATE INDEX IF NOT EXISTS " +
         t + "_failed ON " + t +
         " (updated_at) WHERE status = 'failed';\n"
         "-- Retention and the signals' window.\n"
         "CREATE INDEX IF NOT EXISTS " +
         t + "_created ON " + t +
         " (created_at);\n"
         "-- Downstream answers that differed from the stored one (healthy: empty).\n"
         "CREATE TABLE IF NOT EXISTS " +
         t +
         "_mismatches (\n"
         "  key         BLOB    NOT NULL CHECK (typeof(key) = 'blob' AND length(key) = 32),\n"
         "  stored      BLOB    NOT NULL,\n"
         "  observed    BLOB    NOT NULL,\n"
         "  source      TEXT    NOT NULL,\n"
         "  at          INTEGER NOT NULL   -- microseconds since the Unix epoch\n"
         ");\n"
         "CREATE INDEX IF NOT EXISTS " +
         t + "_mismatches_at ON " + t + "_mismatches (at);\n";
}

/// SQLite shape 4, 280c141: adds `gate TEXT NOT NULL DEFAULT ''` as the first column with
/// PRIMARY KEY (gate, key); every index leads with gate (same names); the mismatches table gains
/// `gate` as its last column and its index becomes (gate, at).
inline std::string released_sqlite_log_4(const std::string& t) {
  released_detail::sqlite_table(t);
  // log_table_sql("CREATE TABLE IF NOT EXISTS ", t)
  return "CREATE TABLE IF NOT EXISTS " + t +
         " (\n"
         "  gate        TEXT    NOT NULL DEFAULT '',  -- the gate the row belongs to ('': none)\n"
         "  key         BLOB    NOT NULL\n"
         "              CHECK (typeof(key) = 'blob' AND length(key) = 32),\n"
         "  status      TEXT    NOT NULL\n"
         "              CHECK (status IN ('in_flight', 'committed', 'failed', 'escalated')),\n"
         "  fence       INTEGER NOT NULL DEFAULT 1 CHECK (fence > 0),\n"
         "  lease_until INTEGER NOT NULL,  -- microseconds since the Unix epoch\n"
         "  fingerprint BLOB    NOT NULL\n"
         "              CHECK (typeof(fingerprint) = 'blob' AND length(fingerprint) = 32),\n"
         "  request     BLOB    NOT NULL,\n"
         "  result      BLOB,\n"
         "  reason      TEXT,\n"
         "  duplicates  INTEGER NOT NULL DEFAULT 0,  -- reservations that met this key\n"
         "  attempts    INTEGER NOT NULL DEFAULT 1,  -- 1 + takeovers and re-drives\n"
         "  created_at  INTEGER NOT NULL,  -- microseconds since the Unix epoch\n"
         "  updated_at  INTEGER NOT NULL,  -- microseconds since the Unix epoch\n"
         "  PRIMARY KEY (gate, key),  -- two gates may hold the same key\n"
         "  CHECK (status <> 'committed' OR result IS NOT NULL)\n"
         ");\n"
         // indexes_sql()
         "-- Stranded work: the reconciler's scan, the in-flight count and the oldest row.\n"
         "CREATE INDEX IF NOT EXISTS " +
         t + "_in_flight ON " + t +
         " (gate, lease_until) WHERE status = 'in_flight';\n"
         "-- The manual queue and its count.\n"
         "CREATE INDEX IF NOT EXISTS " +
         t + "_escalated ON " + t +
         " (gate, updated_at) WHERE status = 'escalated';\n"
         "-- Re-driving failed rows by when they failed.\n"
         "CREATE INDEX IF NOT EXISTS " +
         t + "_failed ON " + t +
         " (gate, updated_at) WHERE status = 'failed';\n"
         "-- Retention and the signals' window.\n"
         "CREATE INDEX IF NOT EXISTS " +
         t + "_created ON " + t +
         " (gate, created_at);\n"
         "-- Downstream answers that differed from the stored one (healthy: empty).\n"
         "CREATE TABLE IF NOT EXISTS " +
         t +
         "_mismatches (\n"
         "  key         BLOB    NOT NULL CHECK (typeof(key) = 'blob' AND length(key) = 32),\n"
         "  stored      BLOB    NOT NULL,\n"
         "  observed    BLOB    NOT NULL,\n"
         "  source      TEXT    NOT NULL,\n"
         "  at          INTEGER NOT NULL,  -- microseconds since the Unix epoch\n"
         "  gate        TEXT    NOT NULL DEFAULT ''  -- the gate that saw it\n"
         ");\n"
         "CREATE INDEX IF NOT EXISTS " +
         t + "_mismatches_at ON " + t + "_mismatches (gate, at);\n";
}

/// SQLite shape 5, 16f1eac (unchanged up to 869246a): adds `label TEXT` and `history TEXT` (JSON)
/// after attempts; indexes and mismatches table as in shape 4.
inline std::string released_sqlite_log_5(const std::string& t) {
  released_detail::sqlite_table(t);
  // log_table_sql("CREATE TABLE IF NOT EXISTS ", t)
  return "CREATE TABLE IF NOT EXISTS " + t +
         " (\n"
         "  gate        TEXT    NOT NULL DEFAULT '',  -- the gate the row belongs to ('': none)\n"
         "  key         BLOB    NOT NULL\n"
         "              CHECK (typeof(key) = 'blob' AND length(key) = 32),\n"
         "  status      TEXT    NOT NULL\n"
         "              CHECK (status IN ('in_flight', 'committed', 'failed', 'escalated')),\n"
         "  fence       INTEGER NOT NULL DEFAULT 1 CHECK (fence > 0),\n"
         "  lease_until INTEGER NOT NULL,  -- microseconds since the Unix epoch\n"
         "  fingerprint BLOB    NOT NULL\n"
         "              CHECK (typeof(fingerprint) = 'blob' AND length(fingerprint) = 32),\n"
         "  request     BLOB    NOT NULL,\n"
         "  result      BLOB,\n"
         "  reason      TEXT,\n"
         "  duplicates  INTEGER NOT NULL DEFAULT 0,  -- reservations that met this key\n"
         "  attempts    INTEGER NOT NULL DEFAULT 1,  -- 1 + takeovers and re-drives\n"
         "  label       TEXT,  -- a readable label, kept only when asked (GateOptions)\n"
         "  history     TEXT,  -- JSON: the newest ends of attempts and operators' actions\n"
         "  created_at  INTEGER NOT NULL,  -- microseconds since the Unix epoch\n"
         "  updated_at  INTEGER NOT NULL,  -- microseconds since the Unix epoch\n"
         "  PRIMARY KEY (gate, key),  -- two gates may hold the same key\n"
         "  CHECK (status <> 'committed' OR result IS NOT NULL)\n"
         ");\n"
         // indexes_sql()
         "-- Stranded work: the reconciler's scan, the in-flight count and the oldest row.\n"
         "CREATE INDEX IF NOT EXISTS " +
         t + "_in_flight ON " + t +
         " (gate, lease_until) WHERE status = 'in_flight';\n"
         "-- The manual queue and its count.\n"
         "CREATE INDEX IF NOT EXISTS " +
         t + "_escalated ON " + t +
         " (gate, updated_at) WHERE status = 'escalated';\n"
         "-- Re-driving failed rows by when they failed.\n"
         "CREATE INDEX IF NOT EXISTS " +
         t + "_failed ON " + t +
         " (gate, updated_at) WHERE status = 'failed';\n"
         "-- Retention and the signals' window.\n"
         "CREATE INDEX IF NOT EXISTS " +
         t + "_created ON " + t +
         " (gate, created_at);\n"
         "-- Downstream answers that differed from the stored one (healthy: empty).\n"
         "CREATE TABLE IF NOT EXISTS " +
         t +
         "_mismatches (\n"
         "  key         BLOB    NOT NULL CHECK (typeof(key) = 'blob' AND length(key) = 32),\n"
         "  stored      BLOB    NOT NULL,\n"
         "  observed    BLOB    NOT NULL,\n"
         "  source      TEXT    NOT NULL,\n"
         "  at          INTEGER NOT NULL,  -- microseconds since the Unix epoch\n"
         "  gate        TEXT    NOT NULL DEFAULT ''  -- the gate that saw it\n"
         ");\n"
         "CREATE INDEX IF NOT EXISTS " +
         t + "_mismatches_at ON " + t + "_mismatches (gate, at);\n";
}

/// The DDL that shape `k`'s migrate() ran on an empty SQLite database for log table `t`: that
/// version's schema_sql() as it wrote it. Shapes: 1 4c48a90 (first SQLite log), 2 d5292cb
/// (+ duplicates, escalated and created indexes, mismatches table), 3 c3e4733 (+ attempts, the
/// _failed index), 4 280c141 (+ gate, primary key (gate, key), gate-led indexes, mismatches.gate),
/// 5 16f1eac (+ label, history).
inline std::string released_sqlite_log(int shape, const std::string& t) {
  released_detail::check_shape(shape);
  released_detail::sqlite_table(t);
  switch (shape) {
    case 1:
      return released_sqlite_log_1(t);
    case 2:
      return released_sqlite_log_2(t);
    case 3:
      return released_sqlite_log_3(t);
    case 4:
      return released_sqlite_log_4(t);
    default:
      return released_sqlite_log_5(t);
  }
}

/// Rows to fill a SQLite log of shape `shape` (as `released_sqlite_log` made it), as the
/// version of that shape wrote them: `n` rows, i = 1..n from a recursive CTE, key the 32 ASCII
/// digits of i zero-padded (CAST(printf('%032d', i) AS BLOB)), fingerprint 'f' and 31 digits the
/// same way, request '{"order":i}', fence 1 + i % 3. By i % 4: 1 committed (result
/// '{"booking":i}'), 2 failed, 3 escalated (both with a reason), 0 in flight with an expired lease.
/// created_at 1700000000000000 + i microseconds, updated_at 5 ms later, lease_until 30 s after
/// created_at (all long past). From shape 2: duplicates = i % 3, and two mismatch rows (source
/// 'lost_lease', the keys of i = 1 and 5). From shape 3: attempts 5 on escalated rows, 1 on
/// committed ones, 1 or 2 (by i / 4 % 2) on failed and in-flight ones. From shape 4: gate = '' on
/// every row and mismatch. Shape 5: label 'order i' on every third row, and the JSON history that
/// version kept (one entry for a failed or escalated row, a 'taken_over' entry for an in-flight
/// row on its second attempt, none otherwise).
inline std::string released_sqlite_rows(int shape, const std::string& t, int n) {
  released_detail::check_shape(shape);
  released_detail::sqlite_table(t);
  std::string columns = "key, status, fence, lease_until, fingerprint, request, result, reason";
  std::string values =
      "CAST(printf('%032d', i) AS BLOB), status, 1 + i % 3, at + 30000000, "
      "CAST(printf('f%031d', i) AS BLOB), request, CASE WHEN status = 'committed' THEN "
      "CAST('{\"booking\":' || i || '}' AS BLOB) END, reason";
  if (shape >= 2) {
    columns += ", duplicates";
    values += ", i % 3";
  }
  if (shape >= 3) {
    columns += ", attempts";
    values += ", attempts";
  }
  if (shape >= 4) {
    columns += ", gate";
    values += ", ''";
  }
  if (shape >= 5) {
    columns += ", label, history";
    values +=
        ", CASE WHEN i % 3 = 0 THEN 'order ' || i END, CASE WHEN status IN ('failed', "
        "'escalated') THEN json_array(json_object('attempt', attempts, 'outcome', status, "
        "'reason', reason, 'at', at + 5000)) WHEN status = 'in_flight' AND attempts > 1 THEN "
        "json_array(json_object('attempt', attempts - 1, 'outcome', 'taken_over', 'reason', "
        "'lease expired', 'at', at)) END";
  }
  columns += ", created_at, updated_at";
  values += ", at, at + 5000";
  const std::string rows = released_detail::count(n);
  std::string sql =
      "WITH RECURSIVE s(i) AS (SELECT 1 WHERE " + rows + " >= 1 UNION ALL SELECT i + 1 FROM s" +
      " WHERE i < " + rows +
      "), r AS (SELECT i, status, CAST('{\"order\":' || i || '}' AS BLOB) AS request,"
      " 1700000000000000 + i AS at,"
      " CASE status WHEN 'failed' THEN 'downstream answered 422'"
      " WHEN 'escalated' THEN 'poison: gave up after 5 attempts' END AS reason,"
      " CASE status WHEN 'escalated' THEN 5 WHEN 'committed' THEN 1 ELSE 1 + i / 4 % 2 END"
      " AS attempts"
      " FROM (SELECT i, CASE i % 4 WHEN 0 THEN 'in_flight' WHEN 1 THEN 'committed'"
      " WHEN 2 THEN 'failed' ELSE 'escalated' END AS status FROM s))"
      " INSERT INTO " +
      t + " (" + columns + ") SELECT " + values + " FROM r;\n";
  if (shape >= 2) {
    const std::string gate = shape >= 4 ? ", ''" : "";
    const auto mismatch = [&](int i) {
      const std::string k = std::to_string(i);
      return "(CAST(printf('%032d', " + k + ") AS BLOB), CAST('{\"booking\":" + k +
             "}' AS BLOB), CAST('{\"booking\":" + k + ",\"again\":true}' AS BLOB), 'lost_lease', " +
             std::to_string(1700000000000000LL + 60000000LL * i) + gate + ")";
    };
    sql += "INSERT INTO " + t + "_mismatches (key, stored, observed, source, at" +
           (shape >= 4 ? ", gate" : "") + ") VALUES " + mismatch(1) + ", " + mismatch(5) + ";\n";
  }
  return sql;
}

}  // namespace idemgate::test
