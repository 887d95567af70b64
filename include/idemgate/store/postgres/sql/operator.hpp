// SPDX-License-Identifier: MIT
// PostgreSQL: the statements of the operator's queue and history, as data.
#pragma once

#include "../../sql.hpp"

namespace idemgate::sql::postgres {

/// Lists the manual queue, oldest first.
inline constexpr Statement escalated{"idemgate_escalated", "$1 gate, $2 limit", R"sql(
SELECT {record_columns} FROM {log}
 WHERE gate = $1::text AND status = 'escalated' ORDER BY updated_at LIMIT $2::bigint
)sql"};

/// Commits an escalated row; its history keeps the reason it was parked for. Sent with its
/// parameters as literals, after the business write.
inline constexpr Statement resolve{"idemgate_resolve", "$1 gate, $2 key, $3 result", R"sql(
UPDATE {log}
   SET status = 'committed', result = $3::bytea, updated_at = now(),
       history = {history_with('resolved', coalesce(reason, ''))}
 WHERE gate = $1::text AND key = $2::bytea AND status = 'escalated'
)sql"};

/// What a re-drive sets: the row back in flight under a new fence with its lease ended, so the
/// next delivery takes it over at once, or the reconciler does. The history keeps the reason the
/// re-drive clears.
inline constexpr Fragment redriven{"redriven", "", R"sql(
status = 'in_flight', fence = fence + 1, attempts = attempts + 1, reason = NULL,
history = {history_with('redriven', coalesce(reason, ''))},
lease_until = 'epoch', updated_at = now()
)sql"};

/// Re-drives one failed key.
inline constexpr Statement redrive_key{"idemgate_redrive_key", "$1 gate, $2 key", R"sql(
UPDATE {log} SET {redriven()}
 WHERE gate = $1::text AND key = $2::bytea AND status = 'failed'
)sql"};

/// Re-drives the failed keys of a time range. The rows are picked once, in a CTE: a LIMIT
/// subquery inside IN may be scanned again by the plan, and would then pick rows beyond the limit.
inline constexpr Statement redrive_range{
    "idemgate_redrive_range",
    "$1 gate, $2 from (µs since the epoch), $3 to (µs since the epoch), $4 limit", R"sql(
WITH picked AS MATERIALIZED (
  SELECT key FROM {log}
   WHERE gate = $1::text AND status = 'failed'
     AND updated_at >= 'epoch'::timestamptz + $2::bigint * interval '1 microsecond'
     AND updated_at < 'epoch'::timestamptz + $3::bigint * interval '1 microsecond'
   LIMIT $4::bigint FOR UPDATE SKIP LOCKED)
UPDATE {log} SET {redriven()}
  FROM picked WHERE {log}.gate = $1::text AND {log}.key = picked.key
)sql"};

/// Re-drives the failed keys of one reason, oldest failure first.
inline constexpr Statement redrive_cause{"idemgate_redrive_cause",
                                         "$1 gate, $2 reason or cause, $3 limit",
                                         R"sql(
WITH picked AS MATERIALIZED (
  SELECT key FROM {log}
   WHERE gate = $1::text AND status = 'failed' AND {reason_or_cause_is($2::text)}
   ORDER BY updated_at LIMIT $3::bigint FOR UPDATE SKIP LOCKED)
UPDATE {log} SET {redriven()}
  FROM picked WHERE {log}.gate = $1::text AND {log}.key = picked.key
)sql"};

/// A row's cause: the first line of its reason ('' for none). See `idemgate::cause_of`.
inline constexpr Fragment cause{"cause", "", R"sql(split_part(coalesce(reason, ''), E'\n', 1))sql"};

/// Whether the row's reason is `{1}`, or its cause is.
inline constexpr Fragment reason_or_cause_is{"reason_or_cause_is", "{1} reason or cause", R"sql(
(coalesce(reason, '') = {1} OR {cause()} = {1})
)sql"};

/// An operator's filters: each matches any row when its switch is off ('' for the status and the
/// label).
inline constexpr Fragment row_filter{"row_filter", "", R"sql(
WHERE gate = $1::text AND ($2::text = '' OR status = $2::text)
  AND (NOT $3::boolean OR {reason_or_cause_is($4::text)})
  AND ($5::text = '' OR strpos(coalesce(label, ''), $5::text) > 0)
  AND (NOT $6::boolean OR updated_at >= 'epoch'::timestamptz + $7::bigint * interval '1 microsecond')
  AND (NOT $8::boolean OR updated_at < 'epoch'::timestamptz + $9::bigint * interval '1 microsecond')
)sql"};

/// Lists rows by an operator's filters, the newest change first.
inline constexpr Statement rows{
    "idemgate_rows",
    "$1 gate, $2 status ('' for any), $3 by reason, $4 reason, $5 label contains ('' for any), "
    "$6 from on, $7 from (µs), $8 to on, $9 to (µs), $10 limit",
    R"sql(
SELECT {record_columns} FROM {log} {row_filter()}
 ORDER BY updated_at DESC, key LIMIT $10::bigint
)sql"};

/// Counts rows by an operator's filters. It takes `rows`' parameters, the limit included, so that
/// both bind the same list.
inline constexpr Statement count{
    "idemgate_count",
    "$1 gate, $2 status ('' for any), $3 by reason, $4 reason, $5 label contains ('' for any), "
    "$6 from on, $7 from (µs), $8 to on, $9 to (µs), $10 limit (unused)",
    R"sql(
SELECT count(*) FROM {log} {row_filter()} AND $10::bigint IS NOT NULL
)sql"};

/// Groups the failed and escalated rows by cause, most rows first (then the most recent).
inline constexpr Statement causes{"idemgate_causes", "$1 gate, $2 limit", R"sql(
SELECT status, {cause()}, count(*),
       (extract(epoch FROM min(updated_at)) * 1000000)::bigint,
       (extract(epoch FROM max(updated_at)) * 1000000)::bigint
  FROM {log}
 WHERE gate = $1::text AND status IN ('failed', 'escalated')
 GROUP BY status, {cause()}
 ORDER BY count(*) DESC, max(updated_at) DESC LIMIT $2::bigint
)sql"};

/// Lists the gates that have rows: one step of the primary key's index per gate, however many
/// rows each holds. Every gate, whatever the handle's ($1 is there because every statement gets
/// it).
inline constexpr Statement gates{"idemgate_gates", "$1 gate (unused)", R"sql(
WITH RECURSIVE g(name) AS (
  SELECT min(gate) FROM {log} WHERE gate > '' AND $1::text IS NOT NULL
  UNION ALL
  SELECT (SELECT min(gate) FROM {log} WHERE gate > g.name) FROM g WHERE g.name IS NOT NULL)
SELECT name FROM g WHERE name IS NOT NULL
)sql"};

}  // namespace idemgate::sql::postgres
