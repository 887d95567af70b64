// SPDX-License-Identifier: MIT
// PostgreSQL: the statements of the signals, the mismatches and retention, as data.
#pragma once

#include "../../sql.hpp"

namespace idemgate::sql::postgres {

/// The oldest transaction open in this database besides the caller's own, as two more columns of
/// the signals row: its age in whole seconds (0 when none is open) and who holds it. A session's
/// transaction counts while it holds a snapshot or a transaction id (either keeps vacuum from
/// removing what was deleted after it began), and so does a prepared transaction. Other roles'
/// sessions are visible only to a role with pg_read_all_stats (or pg_monitor).
inline constexpr Fragment oldest_snapshot{"oldest_snapshot", "", R"sql(
coalesce(horizon.age, 0), coalesce(horizon.holder, '')
FROM (SELECT 1) AS one LEFT JOIN LATERAL (
  SELECT floor(extract(epoch FROM now() - held.since))::bigint AS age, held.holder
    FROM (SELECT xact_start AS since,
                 greatest(age(backend_xmin), age(backend_xid)) AS xids,
                 format('session %s%s, %s', pid,
                        coalesce(' (' || nullif(application_name, '') || ')', ''),
                        state) AS holder
            FROM pg_stat_activity
           WHERE datname = current_database() AND backend_type = 'client backend'
             AND pid <> pg_backend_pid() AND xact_start IS NOT NULL
             AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
          UNION ALL
          SELECT prepared, age(transaction), format('prepared transaction %L', gid)
            FROM pg_prepared_xacts WHERE database = current_database()) AS held
   ORDER BY held.xids DESC, held.since LIMIT 1) AS horizon ON true
)sql"};

/// The three signals over the events reserved in the window, as the columns `signals_from`
/// reads, then the oldest open transaction: one round trip.
inline constexpr Statement signals{"idemgate_signals", "$1 gate, $2 window (s)", R"sql(
SELECT
  (SELECT count(*) FROM {log}
    WHERE gate = $1::text AND created_at >= now() - $2::bigint * interval '1 second'),
  (SELECT coalesce(sum(duplicates), 0) FROM {log}
    WHERE gate = $1::text AND created_at >= now() - $2::bigint * interval '1 second'),
  (SELECT count(*) FROM {log} WHERE gate = $1::text AND status = 'in_flight'),
  (SELECT floor(extract(epoch FROM now() - min(created_at)))::bigint FROM {log}
    WHERE gate = $1::text AND status = 'in_flight'),
  (SELECT count(*) FROM {log} WHERE gate = $1::text AND status = 'escalated'),
  (SELECT count(DISTINCT key) FROM {mismatches}
    WHERE gate = $1::text AND at >= now() - $2::bigint * interval '1 second'),
  (SELECT count(*) FROM {mismatches} WHERE gate = $1::text),
  (SELECT count(*) FROM {log} WHERE gate = $1::text AND status = 'in_flight' AND attempts > 1),
  {oldest_snapshot()}
)sql"};

/// Keeps a downstream answer that differed from the stored one.
inline constexpr Statement record_mismatch{"idemgate_record_mismatch",
                                           "$1 gate, $2 key, $3 stored, $4 observed, $5 source",
                                           R"sql(
INSERT INTO {mismatches} (gate, key, stored, observed, source)
VALUES ($1::text, $2::bytea, $3::bytea, $4::bytea, $5::text)
)sql"};

/// Lists mismatches, newest first.
inline constexpr Statement mismatches{"idemgate_mismatches", "$1 gate, $2 limit", R"sql(
SELECT key, stored, observed, source, (extract(epoch FROM at) * 1000000)::bigint
  FROM {mismatches} WHERE gate = $1::text ORDER BY at DESC LIMIT $2::bigint
)sql"};

/// A row a purge may delete: finished (committed or failed), reserved and last changed more than
/// `$2` seconds ago (the purges of both shapes of the log, and the count of what a generation
/// keeps).
inline constexpr Fragment purgeable{"purgeable", "$2 older than (s)", R"sql(
status IN ('committed', 'failed')
     AND created_at < now() - $2::bigint * interval '1 second'
     AND updated_at < now() - $2::bigint * interval '1 second')sql"};

/// Deletes one batch of finished rows past the window, skipping rows locked by live traffic.
inline constexpr Statement purge{"idemgate_purge", "$1 gate, $2 older than (s), $3 limit", R"sql(
WITH picked AS MATERIALIZED (
  SELECT key FROM {log}
   WHERE gate = $1::text AND {purgeable()}
   LIMIT $3::bigint FOR UPDATE SKIP LOCKED)
DELETE FROM {log} USING picked WHERE {log}.gate = $1::text AND {log}.key = picked.key
)sql"};

/// Deletes one batch of abandoned attempts: rows in flight whose lease ended and that nothing
/// touched for the window (no retry, no takeover, no reconciler pass), skipping locked rows.
inline constexpr Statement purge_abandoned{"idemgate_purge_abandoned",
                                           "$1 gate, $2 older than (s), $3 limit", R"sql(
WITH picked AS MATERIALIZED (
  SELECT key FROM {log}
   WHERE gate = $1::text AND status = 'in_flight' AND lease_until < now()
     AND updated_at < now() - $2::bigint * interval '1 second'
   LIMIT $3::bigint FOR UPDATE SKIP LOCKED)
DELETE FROM {log} USING picked WHERE {log}.gate = $1::text AND {log}.key = picked.key
)sql"};

/// Deletes one key's row when its life is over: finished (committed or failed) longer than the
/// lifetime ago, or in flight with its lease ended and untouched as long. An escalated row or a
/// live lease stays.
inline constexpr Statement expire{"idemgate_expire", "$1 gate, $2 key, $3 lifetime (s)", R"sql(
DELETE FROM {log}
 WHERE gate = $1::text AND key = $2::bytea
   AND status IN ('committed', 'failed', 'in_flight')
   AND (status <> 'in_flight' OR lease_until < now())
   AND updated_at < now() - $3::bigint * interval '1 second'
)sql"};

/// Reclaims the space of purged rows at once, instead of at autovacuum's next turn (skipped while
/// another vacuum holds the table).
inline constexpr Statement vacuum{"vacuum", "", "VACUUM (SKIP_LOCKED) {log}"};

}  // namespace idemgate::sql::postgres
