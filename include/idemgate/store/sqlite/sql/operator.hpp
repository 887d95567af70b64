// SPDX-License-Identifier: MIT
// SQLite: the statements of the operator's queue and history, as data.
#pragma once

#include "../../sql.hpp"

namespace idemgate::sql::sqlite {

/// Lists the manual queue, oldest first (rowid breaks ties within a microsecond).
inline constexpr Statement escalated{"escalated", "?1 gate, ?2 limit", R"sql(
SELECT {record_columns} FROM {log}
 WHERE gate = ?1 AND status = 'escalated' ORDER BY updated_at, rowid LIMIT ?2
)sql"};

/// Commits an escalated row; its history keeps the reason it was parked for.
inline constexpr Statement resolve{"resolve", "?1 gate, ?2 key, ?3 result, ?4 now (µs)", R"sql(
UPDATE {log}
   SET status = 'committed', result = ?3, updated_at = ?4,
       history = {history_with('resolved', coalesce(reason, ''), ?4)}
 WHERE gate = ?1 AND key = ?2 AND status = 'escalated'
RETURNING fence
)sql"};

/// What a re-drive sets: the row back in flight under a new fence with its lease ended, so the
/// next delivery takes it over at once, or the reconciler does. The history keeps the reason the
/// re-drive clears.
inline constexpr Fragment redriven{"redriven", "{1} ended lease, {2} now", R"sql(
status = 'in_flight', fence = fence + 1, attempts = attempts + 1, reason = NULL,
history = {history_with('redriven', coalesce(reason, ''), {2})},
lease_until = {1}, updated_at = {2}
)sql"};

/// Re-drives one failed key.
inline constexpr Statement redrive_key{"redrive_key",
                                       "?1 gate, ?2 key, ?3 ended lease (µs), ?4 now (µs)", R"sql(
UPDATE {log} SET {redriven(?3, ?4)} WHERE gate = ?1 AND key = ?2 AND status = 'failed'
)sql"};

/// Re-drives the failed keys of a time range, oldest failure first.
inline constexpr Statement redrive_range{
    "redrive_range",
    "?1 gate, ?2 from (µs), ?3 to (µs), ?4 limit, ?5 ended lease (µs), ?6 now (µs)", R"sql(
UPDATE {log} SET {redriven(?5, ?6)}
 WHERE gate = ?1 AND key IN (SELECT key FROM {log}
                              WHERE gate = ?1 AND status = 'failed'
                                AND updated_at >= ?2 AND updated_at < ?3
                              ORDER BY updated_at LIMIT ?4)
)sql"};

/// Re-drives the failed keys of one reason, oldest failure first.
inline constexpr Statement redrive_cause{
    "redrive_cause", "?1 gate, ?2 reason or cause, ?3 limit, ?4 ended lease (µs), ?5 now (µs)",
    R"sql(
UPDATE {log} SET {redriven(?4, ?5)}
 WHERE gate = ?1 AND key IN (SELECT key FROM {log}
                              WHERE gate = ?1 AND status = 'failed'
                                AND {reason_or_cause_is(?2)}
                              ORDER BY updated_at LIMIT ?3)
)sql"};

/// A row's cause: the first line of its reason ('' for none). See `idemgate::cause_of`.
inline constexpr Fragment cause{"cause", "", R"sql(
substr(coalesce(reason, ''), 1, instr(coalesce(reason, '') || char(10), char(10)) - 1)
)sql"};

/// Whether the row's reason is `{1}`, or its cause is.
inline constexpr Fragment reason_or_cause_is{"reason_or_cause_is", "{1} reason or cause", R"sql(
(coalesce(reason, '') = {1} OR {cause()} = {1})
)sql"};

/// An operator's filters: each parameter that is NULL (or '' for the label) matches any row.
inline constexpr Fragment row_filter{"row_filter", "", R"sql(
WHERE gate = ?1 AND (?2 IS NULL OR status = ?2)
  AND (?3 IS NULL OR {reason_or_cause_is(?3)})
  AND (?4 = '' OR instr(coalesce(label, ''), ?4) > 0)
  AND (?5 IS NULL OR updated_at >= ?5) AND (?6 IS NULL OR updated_at < ?6)
)sql"};

/// Lists rows by an operator's filters, the newest change first.
inline constexpr Statement rows{
    "rows",
    "?1 gate, ?2 status (NULL for any), ?3 reason (NULL for any), ?4 label contains ('' for "
    "any), ?5 from (µs, NULL for none), ?6 to (µs, NULL for none), ?7 limit",
    R"sql(
SELECT {record_columns} FROM {log} {row_filter()} ORDER BY updated_at DESC, key LIMIT ?7
)sql"};

/// Counts rows by an operator's filters. It takes `rows`' parameters, the limit included, so that
/// both bind the same list.
inline constexpr Statement count{
    "count",
    "?1 gate, ?2 status (NULL for any), ?3 reason (NULL for any), ?4 label contains ('' for "
    "any), ?5 from (µs, NULL for none), ?6 to (µs, NULL for none), ?7 limit (unused)",
    "SELECT count(*) FROM {log} {row_filter()} AND ?7 IS NOT NULL"};

/// Groups the failed and escalated rows by cause, most rows first (then the most recent).
inline constexpr Statement causes{"causes", "?1 gate, ?2 limit", R"sql(
SELECT status, {cause()}, count(*), min(updated_at), max(updated_at) FROM {log}
 WHERE gate = ?1 AND status IN ('failed', 'escalated')
 GROUP BY status, {cause()}
 ORDER BY count(*) DESC, max(updated_at) DESC LIMIT ?2
)sql"};

/// Lists the gates that have rows: one step of the primary key's index per gate, however many
/// rows each holds. Every gate, whatever the handle's.
inline constexpr Statement gates{"gates", "?1 gate (unused)", R"sql(
WITH RECURSIVE g(name) AS (
  SELECT min(gate) FROM {log} WHERE gate > '' AND ?1 IS NOT NULL
  UNION ALL
  SELECT (SELECT min(gate) FROM {log} WHERE gate > g.name) FROM g WHERE g.name IS NOT NULL)
SELECT name FROM g WHERE name IS NOT NULL
)sql"};

}  // namespace idemgate::sql::sqlite
