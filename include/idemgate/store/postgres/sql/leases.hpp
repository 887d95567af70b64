// SPDX-License-Identifier: MIT
// PostgreSQL: the statements that keep leases and take stranded work over, as data.
#pragma once

#include "../../sql.hpp"

namespace idemgate::sql::postgres {

/// Renews the leases still held, in one statement: one row per lease, in order, 'e' extended,
/// 'g' fence gone, 'b' busy. A row another transaction is writing (a commit group's fenced update
/// holds its row until COMMIT) is skipped, not waited for: one renewal renews every lease of the
/// gate, and waiting on one row would leave all the others unrenewed. The snapshot read tells a
/// skipped row (still held under the fence as last committed: busy) from one whose fence is gone.
inline constexpr Statement extend{"idemgate_extend",
                                  "$1 gate, $2 keys (bytea[]), $3 fences (bigint[]), $4 lease (ms)",
                                  R"sql(
WITH held AS (
  SELECT * FROM unnest($2::bytea[], $3::bigint[]) WITH ORDINALITY AS v(key, fence, n)),
free AS (
  SELECT log.key FROM {log} AS log JOIN held ON log.key = held.key AND log.fence = held.fence
   WHERE log.gate = $1::text AND log.status = 'in_flight'
  FOR UPDATE OF log SKIP LOCKED),
extended AS (
  UPDATE {log} AS log SET lease_until = now() + $4::bigint * interval '1 millisecond'
    FROM free WHERE log.gate = $1::text AND log.key = free.key
  RETURNING log.key)
SELECT CASE
  WHEN EXISTS (SELECT 1 FROM extended WHERE extended.key = held.key) THEN 'e'
  WHEN EXISTS (SELECT 1 FROM {log} AS log
                WHERE log.gate = $1::text AND log.key = held.key AND log.fence = held.fence
                  AND log.status = 'in_flight') THEN 'b'
  ELSE 'g' END
FROM held ORDER BY held.n
)sql"};

/// The reconciler's takeover of stranded rows: in flight, lease expired, unchanged for
/// `stale_after`; rows another reconciler is taking are skipped. The second half returns the rows
/// this pass's token already holds: a pass repeated after its reply was lost gets back what it
/// took the first time.
inline constexpr Statement take_stale{
    "idemgate_take_stale", "$1 gate, $2 stale after (ms), $3 limit, $4 lease (ms), $5 holder token",
    R"sql(
WITH stale AS (
  SELECT key FROM {log}
   WHERE gate = $1::text AND status = 'in_flight' AND lease_until < now()
     AND updated_at <= now() - $2::bigint * interval '1 millisecond'
   ORDER BY lease_until LIMIT $3::bigint
  FOR UPDATE SKIP LOCKED),
taken AS (
  UPDATE {log} AS log
     SET fence = log.fence + 1, attempts = log.attempts + 1, holder = $5::bigint,
         lease_until = now() + $4::bigint * interval '1 millisecond', updated_at = now(),
         history = {taken_over_history()}
    FROM stale WHERE log.gate = $1::text AND log.key = stale.key
  RETURNING log.key, log.fence, log.request, log.attempts, log.reason)
SELECT key, fence, request, attempts, reason FROM taken
UNION ALL
SELECT key, fence, request, attempts, reason FROM {log}
 WHERE gate = $1::text AND status = 'in_flight' AND holder = $5::bigint
)sql"};

}  // namespace idemgate::sql::postgres
