// SPDX-License-Identifier: MIT
// SQLite: the log's schema as numbered migrations, and the statements that record them and adopt
// rows of no gate, as data. Timestamps are integer microseconds since the Unix epoch.
#pragma once

#include "../../sql.hpp"

#include <string_view>

namespace idemgate::sql::sqlite {

/// Step 1: the first log, keyed by the key alone.
inline constexpr std::string_view log_v1[] = {
    R"sql(
CREATE TABLE IF NOT EXISTS {log} (
  key         BLOB    NOT NULL PRIMARY KEY
              CHECK (typeof(key) = 'blob' AND length(key) = 32),
  status      TEXT    NOT NULL
              CHECK (status IN ('in_flight', 'committed', 'failed', 'escalated')),
  fence       INTEGER NOT NULL DEFAULT 1 CHECK (fence > 0),
  lease_until INTEGER NOT NULL,
  fingerprint BLOB    NOT NULL
              CHECK (typeof(fingerprint) = 'blob' AND length(fingerprint) = 32),
  request     BLOB    NOT NULL,
  result      BLOB,
  reason      TEXT,
  created_at  INTEGER NOT NULL,
  updated_at  INTEGER NOT NULL,
  CHECK (status <> 'committed' OR result IS NOT NULL)
))sql",
    "CREATE INDEX IF NOT EXISTS {log}_in_flight ON {log} (lease_until) WHERE status = 'in_flight'"};

/// Step 2: the duplicates each row met, the manual queue's and retention's indexes, and the table
/// of downstream answers that differed from the stored one (healthy: empty).
inline constexpr std::string_view duplicates_v2[] = {
    "ALTER TABLE {log} ADD COLUMN duplicates INTEGER NOT NULL DEFAULT 0",
    "CREATE INDEX IF NOT EXISTS {log}_escalated ON {log} (updated_at) WHERE status = 'escalated'",
    "CREATE INDEX IF NOT EXISTS {log}_created ON {log} (created_at)",
    R"sql(
CREATE TABLE IF NOT EXISTS {mismatches} (
  key         BLOB    NOT NULL CHECK (typeof(key) = 'blob' AND length(key) = 32),
  stored      BLOB    NOT NULL,
  observed    BLOB    NOT NULL,
  source      TEXT    NOT NULL,
  at          INTEGER NOT NULL
))sql",
    "CREATE INDEX IF NOT EXISTS {log}_mismatches_at ON {mismatches} (at)"};

/// Step 3: how many attempts held each row, and failed rows by when they failed.
inline constexpr std::string_view attempts_v3[] = {
    "ALTER TABLE {log} ADD COLUMN attempts INTEGER NOT NULL DEFAULT 1",
    "CREATE INDEX IF NOT EXISTS {log}_failed ON {log} (updated_at) WHERE status = 'failed'"};

/// Step 4: the gate a row belongs to, and the primary key (gate, key). SQLite cannot change a
/// primary key in place: the log is rebuilt, its rows copied as rows of no gate ('') until an
/// operator adopts them; dropping the old table drops its indexes, and every new one leads with
/// the gate, so each scan reads only its own gate's rows.
inline constexpr std::string_view gates_v4[] = {
    R"sql(
CREATE TABLE {log}_with_gates (
  gate        TEXT    NOT NULL DEFAULT '',
  key         BLOB    NOT NULL CHECK (typeof(key) = 'blob' AND length(key) = 32),
  status      TEXT    NOT NULL
              CHECK (status IN ('in_flight', 'committed', 'failed', 'escalated')),
  fence       INTEGER NOT NULL DEFAULT 1 CHECK (fence > 0),
  lease_until INTEGER NOT NULL,
  fingerprint BLOB    NOT NULL
              CHECK (typeof(fingerprint) = 'blob' AND length(fingerprint) = 32),
  request     BLOB    NOT NULL,
  result      BLOB,
  reason      TEXT,
  duplicates  INTEGER NOT NULL DEFAULT 0,
  attempts    INTEGER NOT NULL DEFAULT 1,
  created_at  INTEGER NOT NULL,
  updated_at  INTEGER NOT NULL,
  PRIMARY KEY (gate, key),
  CHECK (status <> 'committed' OR result IS NOT NULL)
))sql",
    R"sql(
INSERT INTO {log}_with_gates (gate, key, status, fence, lease_until, fingerprint, request, result,
                              reason, duplicates, attempts, created_at, updated_at)
SELECT '', key, status, fence, lease_until, fingerprint, request, result, reason, duplicates,
       attempts, created_at, updated_at
  FROM {log})sql",
    "DROP TABLE {log}",
    "ALTER TABLE {log}_with_gates RENAME TO {log}",
    R"sql(
CREATE INDEX IF NOT EXISTS {log}_in_flight ON {log} (gate, lease_until)
  WHERE status = 'in_flight')sql",
    R"sql(
CREATE INDEX IF NOT EXISTS {log}_escalated ON {log} (gate, updated_at)
  WHERE status = 'escalated')sql",
    "CREATE INDEX IF NOT EXISTS {log}_failed ON {log} (gate, updated_at) WHERE status = 'failed'",
    "CREATE INDEX IF NOT EXISTS {log}_created ON {log} (gate, created_at)",
    "ALTER TABLE {mismatches} ADD COLUMN gate TEXT NOT NULL DEFAULT ''",
    "DROP INDEX IF EXISTS {log}_mismatches_at",
    "CREATE INDEX IF NOT EXISTS {log}_mismatches_at ON {mismatches} (gate, at)"};

/// Step 5: a readable label, kept only when asked, and the newest ends of attempts and operators'
/// actions (JSON).
inline constexpr std::string_view labels_v5[] = {"ALTER TABLE {log} ADD COLUMN label TEXT",
                                                 "ALTER TABLE {log} ADD COLUMN history TEXT"};

/// Whether table `{1}` has column `{2}`.
inline constexpr Fragment has_column{
    "has_column", "{1} table, {2} column",
    "EXISTS (SELECT 1 FROM pragma_table_info('{1}') WHERE name = '{2}')"};

/// Every step, oldest first.
inline constexpr Migration migrations[] = {
    {1, "log", "the log, keyed by the key",
     "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '{log}')", log_v1},
    {2, "duplicates",
     "duplicates per row, the mismatches table, indexes for the manual queue and retention",
     "SELECT {has_column({log}, duplicates)} AND {has_column({mismatches}, at)}", duplicates_v2},
    {3, "attempts", "the attempts of each row, the index of failed rows",
     "SELECT {has_column({log}, attempts)}", attempts_v3},
    {4, "gates", "the gate of each row, the primary key (gate, key), indexes per gate",
     "SELECT {has_column({log}, gate)} AND {has_column({mismatches}, gate)}", gates_v4},
    {5, "labels", "labels and the history of each row",
     "SELECT {has_column({log}, label)} AND {has_column({log}, history)}", labels_v5},
};

/// The table that records which steps a log has.
inline constexpr Statement create_migrations{"create_migrations", "", R"sql(
CREATE TABLE IF NOT EXISTS {migrations} (
  version     INTEGER PRIMARY KEY,
  name        TEXT    NOT NULL,
  note        TEXT    NOT NULL DEFAULT '',
  applied_at  INTEGER NOT NULL
))sql"};

/// The newest step recorded (0: none), and whether the log exists.
inline constexpr Statement migrated_version{"migrated_version", "", R"sql(
SELECT (SELECT coalesce(max(version), 0) FROM {migrations}),
       EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '{log}')
)sql"};

/// Records one step ('found in place' for a step a log made before versions already had).
inline constexpr Statement record_migration{"record_migration",
                                            "?1 version, ?2 name, ?3 note, ?4 now (µs)", R"sql(
INSERT INTO {migrations} (version, name, note, applied_at) VALUES (?1, ?2, ?3, ?4)
ON CONFLICT (version) DO NOTHING
)sql"};

/// Gives the handle's gate rows that belong to no gate, except keys it already holds.
inline constexpr Statement adopt{"adopt", "?1 gate, ?2 limit", R"sql(
UPDATE {log} SET gate = ?1
 WHERE gate = '' AND key IN (SELECT u.key FROM {log} AS u
                              WHERE u.gate = '' AND NOT EXISTS (SELECT 1 FROM {log} AS held
                                                                 WHERE held.gate = ?1
                                                                   AND held.key = u.key)
                              LIMIT ?2)
)sql"};

/// Gives the handle's gate the mismatches of no gate whose key it holds and no row of no gate
/// holds (after `adopt`, or after reservations took rows of no gate over one by one).
inline constexpr Statement adopt_mismatches{"adopt_mismatches", "?1 gate", R"sql(
UPDATE {mismatches} SET gate = ?1
 WHERE gate = '' AND EXISTS (SELECT 1 FROM {log} AS held WHERE held.gate = ?1
                                                          AND held.key = {mismatches}.key)
   AND NOT EXISTS (SELECT 1 FROM {log} AS unowned WHERE unowned.gate = ''
                                                  AND unowned.key = {mismatches}.key)
)sql"};

}  // namespace idemgate::sql::sqlite
