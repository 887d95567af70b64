// SPDX-License-Identifier: MIT
// PostgreSQL: the statements of batches and group commits, as data.
#pragma once

#include "../../sql.hpp"

namespace idemgate::sql::postgres {

/// Reserves many keys in one statement, each as `reserve` would (a key whose only row belongs to
/// no gate included, and on a log of generations a key the gate holds in an older one): one row
/// per item with its ordinal, whether it was claimed, its fence, and for a key met its status,
/// same request, live lease, result, reason and whether this batch wrote it (its reply lost).
inline constexpr Statement reserve_batch{
    "idemgate_reserve_batch",
    "$1 gate, $2 keys (bytea[]), $3 fingerprints (bytea[]), $4 requests (bytea[]), $5 lease (ms), "
    "$6 holder token, $7 labels (text[], '' for none)",
    R"sql(
WITH input AS (
  SELECT * FROM unnest($2::bytea[], $3::bytea[], $4::bytea[], $7::text[])
    WITH ORDINALITY AS i(key, fingerprint, request, label, n)),
adopted AS (
  UPDATE {log} AS log SET gate = $1::text, duplicates = log.duplicates + 1
    FROM input
   WHERE log.gate = '' AND log.key = input.key
     AND NOT EXISTS (SELECT 1 FROM {log} AS held WHERE held.gate = $1::text
                                                 AND held.key = input.key)
  RETURNING log.key, log.fence, log.status, log.fingerprint = input.fingerprint AS same,
            log.lease_until >= now() AS live, log.result, log.reason),
claimed AS (
  INSERT INTO {log} (gate, key, status, fence, lease_until, fingerprint, request, holder,
                     attempts, label{generation_column})
  SELECT $1::text, key, 'in_flight', 1, now() + $5::bigint * interval '1 millisecond',
         fingerprint, request, $6::bigint, 1, nullif(label, ''){generation_value}
    FROM input
   WHERE NOT EXISTS (SELECT 1 FROM {log} AS unowned WHERE unowned.gate = ''
                                                     AND unowned.key = input.key)
     AND NOT EXISTS (SELECT 1 FROM {log} AS held WHERE held.gate = $1::text
                                                 AND held.key = input.key AND {older_generation})
   ORDER BY n
  ON CONFLICT{conflict_target} DO NOTHING
  RETURNING key, fence),
seen AS (
  UPDATE {log} AS log
     SET duplicates = log.duplicates + CASE WHEN log.holder = $6::bigint THEN 0 ELSE 1 END,
         lease_until = CASE WHEN log.holder = $6::bigint AND log.status = 'in_flight'
                            THEN now() + $5::bigint * interval '1 millisecond'
                            ELSE log.lease_until END
    FROM input
   WHERE log.gate = $1::text AND log.key = input.key
     AND NOT EXISTS (SELECT 1 FROM claimed WHERE claimed.key = input.key)
  RETURNING log.key, log.fence, log.status, log.fingerprint = input.fingerprint AS same,
            log.lease_until >= now() AS live, log.result, log.reason,
            log.holder = $6::bigint AS mine,
            {released_by_this_attempt(log.history, log.attempts)} AS given_back),
met AS (
  SELECT key, fence, status, same, live, result, reason, mine, given_back FROM seen
  UNION ALL
  SELECT key, fence, status, same, live, result, reason, false, false FROM adopted)
SELECT input.n, claimed.fence IS NOT NULL, coalesce(claimed.fence, met.fence), met.status,
       met.same, met.live, met.result, met.reason, met.mine, met.given_back
  FROM input LEFT JOIN claimed ON claimed.key = input.key
             LEFT JOIN met ON met.key = input.key
)sql"};

/// Counts the items of a batch committed under their fences (after an in-doubt COMMIT).
inline constexpr Statement batch_landed{"idemgate_batch_landed",
                                        "$1 gate, $2 keys (bytea[]), $3 fences (bigint[])", R"sql(
SELECT count(*) FROM {log} AS log, unnest($2::bytea[], $3::bigint[]) AS v(key, fence)
 WHERE log.gate = $1::text AND log.key = v.key AND log.fence = v.fence
   AND log.status = 'committed'
)sql"};

/// The fenced commit update of many keys in one statement: it changes one row per item whose
/// fence still holds. Sent with its parameters as literals, after the bulk business write.
inline constexpr Statement commit_bulk{
    "commit_bulk", "$1 gate, $2 keys (bytea[]), $3 fences (bigint[]), $4 results (bytea[])",
    R"sql(
UPDATE {log} AS log SET status = 'committed', result = v.result, updated_at = now()
  FROM unnest($2::bytea[], $3::bigint[], $4::bytea[]) AS v(key, fence, result)
 WHERE log.gate = $1::text AND log.key = v.key AND log.status IN ('in_flight', '')
   AND log.fence = v.fence
)sql"};

/// A group commit's item: its savepoint, taken in front of its fenced update.
inline constexpr Statement item_savepoint{"item_savepoint", "", "SAVEPOINT idemgate_item"};

/// Ends the previous item's savepoint (sent in front of the next one's, or after the last).
inline constexpr Statement release_item_savepoint{"release_item_savepoint", "",
                                                  "RELEASE SAVEPOINT idemgate_item"};

/// Undoes one item of a group commit whose business write threw.
inline constexpr Statement rollback_item_savepoint{"rollback_item_savepoint", "",
                                                   "ROLLBACK TO SAVEPOINT idemgate_item"};

}  // namespace idemgate::sql::postgres
