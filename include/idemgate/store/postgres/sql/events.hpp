// SPDX-License-Identifier: MIT
// PostgreSQL: the statements of one event's path, reservation to commit, as data.
#pragma once

#include "../../sql.hpp"

namespace idemgate::sql::postgres {

/// The reservation: inserts the key as in flight; when it exists, counts the duplicate and
/// returns the stored row. One statement, one round trip, either way.
///
/// A key whose only row belongs to no gate (written before logs knew their gates, not adopted
/// yet) is that row: the gate takes it over in the same statement and answers from it, so an
/// event the earlier version finished is never processed again, in whatever order the upgrade's
/// steps ran. The new row is inserted only when no row of no gate holds the key; a reservation
/// that waited for an adoption moving the row finds nothing and runs again. The key's row of no
/// gate is looked up once (`unowned`): the insert tests it, and the adoption looks further (for
/// that row to take over, then for the gate's own row) only when there is one.
///
/// On a log of generations the new row goes into the current generation, whose key the conflict
/// arbiter tests; it is inserted only when no older generation holds the gate's key either
/// (`{older_generation}`: the server prunes the current generation from that lookup when it
/// runs).
inline constexpr Statement reserve{
    "idemgate_reserve",
    "$1 gate, $2 key, $3 fingerprint, $4 request, $5 lease (ms), $6 holder token, $7 label ('' "
    "for none)",
    R"sql(
WITH unowned AS MATERIALIZED (
  SELECT 1 FROM {log} WHERE gate = '' AND key = $2::bytea),
adopted AS (
  UPDATE {log} AS log SET gate = $1::text, duplicates = log.duplicates + 1
   WHERE EXISTS (SELECT 1 FROM unowned) AND log.gate = '' AND log.key = $2::bytea
     AND NOT EXISTS (SELECT 1 FROM {log} AS held WHERE held.gate = $1::text AND held.key = log.key)
  RETURNING log.fence, log.status, log.fingerprint = $3::bytea AS same,
            log.lease_until >= now() AS live, log.result, log.reason),
claimed AS (
  INSERT INTO {log} (gate, key, status, fence, lease_until, fingerprint, request, holder,
                     attempts, label{generation_column})
  SELECT $1::text, $2::bytea, 'in_flight', 1, now() + $5::bigint * interval '1 millisecond',
         $3::bytea, $4::bytea, $6::bigint, 1, nullif($7::text, ''){generation_value}
   WHERE NOT EXISTS (SELECT 1 FROM unowned)
     AND NOT EXISTS (SELECT 1 FROM {log} WHERE gate = $1::text AND key = $2::bytea
                                         AND {older_generation})
  ON CONFLICT{conflict_target} DO NOTHING
  RETURNING fence),
-- A row this attempt wrote itself (its reply was lost) is not a duplicate: it comes back as
-- `mine`, its lease renewed from now, so the attempt goes on with a whole lease and no
-- reconciler takes the event over under it.
seen AS (
  UPDATE {log}
     SET duplicates = duplicates + CASE WHEN holder = $6::bigint THEN 0 ELSE 1 END,
         lease_until = CASE WHEN holder = $6::bigint AND status = 'in_flight'
                            THEN now() + $5::bigint * interval '1 millisecond'
                            ELSE lease_until END
   WHERE gate = $1::text AND key = $2::bytea AND NOT EXISTS (SELECT 1 FROM claimed)
  RETURNING fence, status, fingerprint = $3::bytea AS same, lease_until >= now() AS live,
            result, reason, holder = $6::bigint AS mine,
            {released_by_this_attempt(history, attempts)} AS given_back)
SELECT true, fence, NULL::text, NULL::boolean, NULL::boolean, NULL::bytea, NULL::text, true,
       false
  FROM claimed
UNION ALL
SELECT false, fence, status, same, live, result, reason, mine, given_back FROM seen
UNION ALL
SELECT false, fence, status, same, live, result, reason, false, false FROM adopted
)sql"};

/// Takes an expired lease over: the next fence, a new lease and holder, one more attempt.
///
/// Every statement that finds one row by its key tests `status IN ('in_flight', '')` ('' is
/// never a status): the same rows as `status = 'in_flight'`, without implying the in-flight
/// index's predicate, so the planner takes the row by its primary key instead of walking that
/// partial index, which holds an entry for every version reserved since the oldest snapshot while
/// one is held open (2,700 buffers against 5 on a log of 100,000 such versions).
inline constexpr Statement take_over{
    "idemgate_take_over", "$1 gate, $2 key, $3 fence, $4 lease (ms), $5 holder token", R"sql(
UPDATE {log}
   SET fence = fence + 1, lease_until = now() + $4::bigint * interval '1 millisecond',
       updated_at = now(), holder = $5::bigint, attempts = attempts + 1,
       history = {taken_over_history()}
 WHERE gate = $1::text AND key = $2::bytea AND status IN ('in_flight', '')
   AND fence = $3::bigint AND lease_until < now()
RETURNING fence
)sql"};

/// The fenced status update of the commit transaction (it follows the business write).
inline constexpr Statement commit{"idemgate_commit", "$1 gate, $2 key, $3 fence, $4 result", R"sql(
UPDATE {log}
   SET status = 'committed', result = $4::bytea, updated_at = now()
 WHERE gate = $1::text AND key = $2::bytea AND status IN ('in_flight', '')
   AND fence = $3::bigint
)sql"};

/// Sent in front of the status update after a business write, in the same round trip: PostgreSQL
/// refuses a SAVEPOINT outside a transaction block, so when the business write ended the
/// transaction itself (ROLLBACK, COMMIT) and went on, the update fails instead of committing on
/// its own.
inline constexpr Statement open_transaction_check{
    "open_transaction_check", "", "SAVEPOINT idemgate_open; RELEASE SAVEPOINT idemgate_open;"};

/// Sent after `open_transaction_check`, in the same round trip, with relaxed outcomes
/// (`PostgresOptions::relaxed_outcomes`): this transaction's COMMIT does not wait for the WAL
/// flush. Set for the transaction alone, so nothing stays on a pooled server connection.
inline constexpr Statement relax_outcome{"relax_outcome", "",
                                         "SET LOCAL synchronous_commit = off;"};

/// Stores a permanent failure (fenced).
inline constexpr Statement fail{"idemgate_fail", "$1 gate, $2 key, $3 fence, $4 reason", R"sql(
UPDATE {log}
   SET status = 'failed', reason = $4::text, updated_at = now(),
       history = {history_with('failed', $4::text)}
 WHERE gate = $1::text AND key = $2::bytea AND status IN ('in_flight', '')
   AND fence = $3::bigint
)sql"};

/// Parks the key for a human (fenced).
inline constexpr Statement escalate{"idemgate_escalate", "$1 gate, $2 key, $3 fence, $4 reason",
                                    R"sql(
UPDATE {log}
   SET status = 'escalated', reason = $4::text, updated_at = now(),
       history = {history_with('escalated', $4::text)}
 WHERE gate = $1::text AND key = $2::bytea AND status IN ('in_flight', '')
   AND fence = $3::bigint
)sql"};

/// Ends the lease after a transient failure (fenced). The row stays in flight: the next delivery
/// takes it over with a higher fence (a worker still holding the old fence can never commit), and
/// if no delivery comes back the reconciler finishes the event. With a hold, the key stays taken
/// that long (the back-off before the next attempt); a hold goes with a reason, whose history
/// entry tells the takeover after it from one after a lease that ran out.
inline constexpr Statement release{
    "idemgate_release", "$1 gate, $2 key, $3 fence, $4 reason ('' for none), $5 hold (ms)", R"sql(
UPDATE {log}
   SET lease_until = CASE WHEN $5::bigint > 0 THEN now() + $5::bigint * interval '1 millisecond'
                          ELSE 'epoch' END,
       updated_at = now(),
       reason = CASE WHEN $4::text = '' THEN reason ELSE $4::text END,
       history = CASE WHEN $4::text = '' THEN history
                      ELSE {history_with('released', $4::text)} END
 WHERE gate = $1::text AND key = $2::bytea AND status IN ('in_flight', '')
   AND fence = $3::bigint
)sql"};

/// The reservation of an event run as one transaction (`commit_once`): inserts the key's row
/// already committed, with an empty result and the reason `$8` until the business write returned
/// (`set_result` clears it). Nobody sees the row before the transaction commits, so it is never
/// in flight, and it enters no partial index; should a business write commit the transaction
/// itself, the row that commits says so and is answered `escalated`, never as an empty outcome.
/// Nothing is inserted when the key has a row of this gate or of none: `reserve` then answers
/// from it in the same transaction. `set_config`, in a subquery evaluated once whatever the
/// filter finds, bounds for the rest of the transaction how long this statement waits for a
/// concurrent transaction that holds the key uncommitted (and every later lock wait).
inline constexpr Statement reserve_committed{
    "idemgate_reserve_committed",
    "$1 gate, $2 key, $3 fingerprint, $4 request, $5 holder token, $6 label ('' for none), "
    "$7 lock timeout (ms, text), $8 reason until the result is stored",
    R"sql(
INSERT INTO {log} (gate, key, status, fence, lease_until, fingerprint, request, result, reason,
                   holder, attempts, label{generation_column})
SELECT $1::text, $2::bytea, 'committed', 1, now(), $3::bytea, $4::bytea, ''::bytea, $8::text,
       $5::bigint, 1, nullif($6::text, ''){generation_value}
  FROM (SELECT set_config('lock_timeout', $7::text, true) OFFSET 0) AS bounded
 WHERE NOT EXISTS (SELECT 1 FROM {log} WHERE gate = '' AND key = $2::bytea)
   AND NOT EXISTS (SELECT 1 FROM {log} WHERE gate = $1::text AND key = $2::bytea
                                       AND {older_generation})
ON CONFLICT{conflict_target} DO NOTHING
RETURNING fence
)sql"};

/// Sets the result of the row `reserve_committed` inserted in this transaction and clears its
/// reason. Neither is an indexed column: the new version can stay on the row's page (HOT).
inline constexpr Statement set_result{"idemgate_set_result",
                                      "$1 gate, $2 key, $3 result, $4 holder token", R"sql(
UPDATE {log} SET result = $3::bytea, reason = NULL
 WHERE gate = $1::text AND key = $2::bytea AND status = 'committed' AND holder = $4::bigint
)sql"};

/// Reads one row.
inline constexpr Statement find{"idemgate_find", "$1 gate, $2 key", R"sql(
SELECT {record_columns} FROM {log} WHERE gate = $1::text AND key = $2::bytea
)sql"};

/// Reads status and fence after a fenced update missed.
inline constexpr Statement settled{"idemgate_settled", "$1 gate, $2 key", R"sql(
SELECT status, fence FROM {log} WHERE gate = $1::text AND key = $2::bytea
)sql"};

/// A no-op update whose synchronous commit flushes the WAL up to here (relaxed reservations: before
/// an "in flight" answer goes out, the other attempt's reservation must be durable).
inline constexpr Statement make_durable{"idemgate_make_durable", "$1 gate, $2 key", R"sql(
UPDATE {log} SET duplicates = duplicates WHERE gate = $1::text AND key = $2::bytea
)sql"};

}  // namespace idemgate::sql::postgres
