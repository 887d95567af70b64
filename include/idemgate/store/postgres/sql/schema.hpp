// SPDX-License-Identifier: MIT
// PostgreSQL: the log's schema as numbered migrations, and the statements that apply and record
// them and adopt rows of no gate, as data.
#pragma once

#include "../../sql.hpp"

#include <string_view>

namespace idemgate::sql::postgres {

/// Step 1: the first log, keyed by the key alone.
inline constexpr std::string_view log_v1[] = {
    R"sql(
CREATE TABLE IF NOT EXISTS {log} (
  key         bytea       PRIMARY KEY CHECK (octet_length(key) = 32),
  status      text        NOT NULL
              CHECK (status IN ('in_flight', 'committed', 'failed', 'escalated')),
  fence       bigint      NOT NULL DEFAULT 1 CHECK (fence > 0),
  lease_until timestamptz NOT NULL,
  fingerprint bytea       NOT NULL CHECK (octet_length(fingerprint) = 32),
  request     bytea       NOT NULL,
  result      bytea,
  reason      text,
  created_at  timestamptz NOT NULL DEFAULT now(),
  updated_at  timestamptz NOT NULL DEFAULT now(),
  CHECK (status <> 'committed' OR result IS NOT NULL)
))sql",
    R"sql(
CREATE INDEX CONCURRENTLY IF NOT EXISTS {log_name}_in_flight ON {log} (lease_until)
  WHERE status = 'in_flight')sql"};

/// Step 2: the duplicates each row met, the manual queue's and retention's indexes, and the table
/// of downstream answers that differed from the stored one (healthy: empty).
inline constexpr std::string_view duplicates_v2[] = {
    // A constant default: PostgreSQL stores it once instead of rewriting every row.
    "ALTER TABLE {log} ADD COLUMN IF NOT EXISTS duplicates bigint NOT NULL DEFAULT 0",
    R"sql(
CREATE INDEX CONCURRENTLY IF NOT EXISTS {log_name}_escalated ON {log} (updated_at)
  WHERE status = 'escalated')sql",
    // BRIN stays tiny on an append-mostly column.
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS {log_name}_created ON {log} USING brin (created_at)",
    R"sql(
CREATE TABLE IF NOT EXISTS {mismatches} (
  key         bytea       NOT NULL,
  stored      bytea       NOT NULL,
  observed    bytea       NOT NULL,
  source      text        NOT NULL,
  at          timestamptz NOT NULL DEFAULT now()
))sql",
    "CREATE INDEX IF NOT EXISTS {log_name}_mismatches_at ON {mismatches} (at)"};

/// Step 3: the attempt that holds a row (its token), and how many attempts held it.
inline constexpr std::string_view attempts_v3[] = {
    "ALTER TABLE {log} ADD COLUMN IF NOT EXISTS holder bigint NOT NULL DEFAULT 0",
    "ALTER TABLE {log} ADD COLUMN IF NOT EXISTS attempts bigint NOT NULL DEFAULT 1"};

/// Step 4: the gate a row belongs to, and the primary key (gate, key), built while other sessions
/// go on writing: the new key beside the old one, then swapped in one short step (a brief lock,
/// no scan). Rows written before belong to no gate ('') until an operator adopts them.
inline constexpr std::string_view gates_v4[] = {
    "ALTER TABLE {log} ADD COLUMN IF NOT EXISTS gate text NOT NULL DEFAULT ''",
    // Added unchecked and validated apart: validating scans the log, under a lock that lets
    // writers go on.
    R"sql(
DO $$ BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_constraint
                  WHERE conrelid = to_regclass('{log}') AND conname = '{log_name}_gate_check') THEN
    ALTER TABLE {log} ADD CONSTRAINT {log_name}_gate_check CHECK (octet_length(gate) <= 64)
      NOT VALID;
  END IF;
END $$)sql",
    "ALTER TABLE {log} VALIDATE CONSTRAINT {log_name}_gate_check",
    "ALTER TABLE {mismatches} ADD COLUMN IF NOT EXISTS gate text NOT NULL DEFAULT ''",
    "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS {log_name}_gate_key ON {log} (gate, key)",
    R"sql(
DO $$ BEGIN
  IF (SELECT indnatts FROM pg_index
       WHERE indrelid = to_regclass('{log}') AND indisprimary) = 1 THEN
    ALTER TABLE {log} DROP CONSTRAINT {log_name}_pkey,
      ADD CONSTRAINT {log_name}_pkey PRIMARY KEY USING INDEX {log_name}_gate_key;
  END IF;
END $$)sql",
    // Stranded work, per gate: the reconciler's scan and the oldest in-flight row.
    R"sql(
CREATE INDEX CONCURRENTLY IF NOT EXISTS {log_name}_gate_in_flight ON {log} (gate, lease_until)
  WHERE status = 'in_flight')sql",
    // The manual queue, per gate.
    R"sql(
CREATE INDEX CONCURRENTLY IF NOT EXISTS {log_name}_gate_escalated ON {log} (gate, updated_at)
  WHERE status = 'escalated')sql",
    "DROP INDEX CONCURRENTLY IF EXISTS {log_schema}{log_name}_in_flight",
    "DROP INDEX CONCURRENTLY IF EXISTS {log_schema}{log_name}_escalated"};

/// Step 5: a readable label, kept only when asked, and the newest ends of attempts and operators'
/// actions (NULL by default: no row is rewritten); failed rows by gate, for re-drives and an
/// operator's lists and causes (a commit never writes to that index).
inline constexpr std::string_view labels_v5[] = {
    "ALTER TABLE {log} ADD COLUMN IF NOT EXISTS label text",
    "ALTER TABLE {log} ADD COLUMN IF NOT EXISTS history jsonb",
    R"sql(
CREATE INDEX CONCURRENTLY IF NOT EXISTS {log_name}_gate_failed ON {log} (gate, updated_at)
  WHERE status = 'failed')sql"};

/// Whether the log has column `{1}`.
inline constexpr Fragment has_column{"has_column", "{1} column name", R"sql(
EXISTS (SELECT 1 FROM pg_attribute
         WHERE attrelid = to_regclass('{log}') AND attname = '{1}' AND NOT attisdropped)
)sql"};

/// Every step, oldest first.
inline constexpr Migration migrations[] = {
    {1, "log", "the log, keyed by the key", "SELECT to_regclass('{log}') IS NOT NULL", log_v1},
    {2, "duplicates",
     "duplicates per row, the mismatches table, indexes for the manual queue and retention",
     "SELECT {has_column(duplicates)} AND to_regclass('{mismatches}') IS NOT NULL", duplicates_v2},
    {3, "attempts", "the holder token and the attempts of each row",
     "SELECT {has_column(holder)} AND {has_column(attempts)}", attempts_v3},
    {4, "gates", "the gate of each row, the primary key (gate, key), indexes per gate",
     R"sql(
SELECT {has_column(gate)}
   AND (SELECT indnatts FROM pg_index WHERE indrelid = to_regclass('{log}') AND indisprimary) = 2
)sql",
     gates_v4},
    {5, "labels", "labels, the history of each row, the index of failed rows per gate",
     R"sql(
SELECT {has_column(label)} AND {has_column(history)}
   AND to_regclass('{log_schema}{log_name}_gate_failed') IS NOT NULL
)sql",
     labels_v5},
};

/// The table that records which steps a log has.
inline constexpr Statement create_migrations{"create_migrations", "", R"sql(
CREATE TABLE IF NOT EXISTS {migrations} (
  version     integer     PRIMARY KEY,
  name        text        NOT NULL,
  note        text        NOT NULL DEFAULT '',
  applied_at  timestamptz NOT NULL DEFAULT now()
))sql"};

/// The newest step recorded (0: none), and whether the log exists.
inline constexpr Statement migrated_version{"migrated_version", "", R"sql(
SELECT (SELECT coalesce(max(version), 0) FROM {migrations}), to_regclass('{log}') IS NOT NULL
)sql"};

/// Whether the log exists.
inline constexpr Statement log_exists{"log_exists", "", "SELECT to_regclass('{log}') IS NOT NULL"};

/// Records one step ('found in place' for a step a log made before versions already had).
inline constexpr Statement record_migration{"record_migration", "$1 version, $2 name, $3 note",
                                            R"sql(
INSERT INTO {migrations} (version, name, note) VALUES ($1::integer, $2::text, $3::text)
ON CONFLICT (version) DO NOTHING
)sql"};

/// Serialises migrations of one database: a lock held to its transaction's end (behind a
/// transaction pooler) ...
inline constexpr Statement migration_lock{"migration_lock", "",
                                          "SELECT pg_advisory_xact_lock(7158029411)"};
/// ... or a session lock, taken without waiting inside a statement: a session waiting for it
/// inside a statement would hold a snapshot that CREATE INDEX CONCURRENTLY waits for.
inline constexpr Statement try_migration_lock{"try_migration_lock", "",
                                              "SELECT pg_try_advisory_lock(7158029411)"};
/// Gives the session lock back.
inline constexpr Statement migration_unlock{"migration_unlock", "",
                                            "SELECT pg_advisory_unlock(7158029411)"};

/// Whether index `$1` is left invalid by an interrupted CREATE INDEX CONCURRENTLY (IF NOT EXISTS
/// would keep it: it is dropped first).
inline constexpr Statement invalid_index{"invalid_index", "$1 index (schema-qualified)", R"sql(
SELECT 1 FROM pg_index WHERE indexrelid = to_regclass($1::text) AND NOT indisvalid
)sql"};

/// Gives the handle's gate rows that belong to no gate, except keys it already holds.
inline constexpr Statement adopt{"idemgate_adopt", "$1 gate, $2 limit", R"sql(
WITH picked AS MATERIALIZED (
  SELECT u.key FROM {log} AS u
   WHERE u.gate = '' AND NOT EXISTS (SELECT 1 FROM {log} AS g
                                      WHERE g.gate = $1::text AND g.key = u.key)
   LIMIT $2::bigint FOR UPDATE SKIP LOCKED)
UPDATE {log} AS log SET gate = $1::text FROM picked
 WHERE log.gate = '' AND log.key = picked.key
)sql"};

/// Gives the handle's gate the mismatches of no gate whose key it holds and no row of no gate
/// holds (after `adopt`, or after reservations took rows of no gate over one by one).
inline constexpr Statement adopt_mismatches{"idemgate_adopt_mismatches", "$1 gate", R"sql(
UPDATE {mismatches} SET gate = $1::text
 WHERE gate = '' AND EXISTS (SELECT 1 FROM {log} AS held WHERE held.gate = $1::text
                                                          AND held.key = {mismatches}.key)
   AND NOT EXISTS (SELECT 1 FROM {log} AS unowned WHERE unowned.gate = ''
                                                  AND unowned.key = {mismatches}.key)
)sql"};

}  // namespace idemgate::sql::postgres
