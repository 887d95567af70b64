// SPDX-License-Identifier: MIT
// SQLite: the statements of the signals, the mismatches and retention, as data.
#pragma once

#include "../../sql.hpp"

namespace idemgate::sql::sqlite {

/// The three signals over the events reserved since `?2`, as the columns `signals_from` reads:
/// one statement, one consistent snapshot.
inline constexpr Statement signals{"signals", "?1 gate, ?2 since (µs)", R"sql(
SELECT w.events, w.duplicates, f.n, f.oldest, e.n, m.keys, a.n, f.retrying FROM
  (SELECT count(*) AS events, coalesce(sum(duplicates), 0) AS duplicates FROM {log}
    WHERE gate = ?1 AND created_at >= ?2) AS w,
  (SELECT count(*) AS n, min(created_at) AS oldest,
          coalesce(sum(attempts > 1), 0) AS retrying FROM {log}
    WHERE gate = ?1 AND status = 'in_flight') AS f,
  (SELECT count(*) AS n FROM {log} WHERE gate = ?1 AND status = 'escalated') AS e,
  (SELECT count(DISTINCT key) AS keys FROM {mismatches} WHERE gate = ?1 AND at >= ?2) AS m,
  (SELECT count(*) AS n FROM {mismatches} WHERE gate = ?1) AS a
)sql"};

/// Keeps a downstream answer that differed from the stored one.
inline constexpr Statement record_mismatch{
    "record_mismatch", "?1 gate, ?2 key, ?3 stored, ?4 observed, ?5 source, ?6 now (µs)", R"sql(
INSERT INTO {mismatches} (gate, key, stored, observed, source, at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6)
)sql"};

/// Lists mismatches, newest first (rowid breaks ties within a microsecond).
inline constexpr Statement mismatches{"mismatches", "?1 gate, ?2 limit", R"sql(
SELECT key, stored, observed, source, at FROM {mismatches}
 WHERE gate = ?1 ORDER BY at DESC, rowid DESC LIMIT ?2
)sql"};

/// Deletes one batch of finished rows past the cutoff.
inline constexpr Statement purge{"purge", "?1 gate, ?2 cutoff (µs), ?3 limit", R"sql(
DELETE FROM {log}
 WHERE gate = ?1 AND key IN (SELECT key FROM {log}
                              WHERE gate = ?1 AND created_at < ?2 AND updated_at < ?2
                                AND status IN ('committed', 'failed') LIMIT ?3)
)sql"};

/// Deletes one batch of abandoned attempts: rows in flight whose lease ended and that nothing
/// touched since the cutoff (no retry, no takeover, no reconciler pass).
inline constexpr Statement purge_abandoned{"purge_abandoned",
                                           "?1 gate, ?2 cutoff (µs), ?3 now (µs), ?4 limit", R"sql(
DELETE FROM {log}
 WHERE gate = ?1 AND key IN (SELECT key FROM {log}
                              WHERE gate = ?1 AND status = 'in_flight' AND lease_until < ?3
                                AND updated_at < ?2 LIMIT ?4)
)sql"};

/// Deletes one key's row when its life is over: finished (committed or failed) before the
/// cutoff, or in flight with its lease ended and untouched since. An escalated row or a live
/// lease stays.
inline constexpr Statement expire{"expire", "?1 gate, ?2 key, ?3 cutoff (µs), ?4 now (µs)", R"sql(
DELETE FROM {log}
 WHERE gate = ?1 AND key = ?2 AND status IN ('committed', 'failed', 'in_flight')
   AND (status <> 'in_flight' OR lease_until < ?4) AND updated_at < ?3
)sql"};

}  // namespace idemgate::sql::sqlite
