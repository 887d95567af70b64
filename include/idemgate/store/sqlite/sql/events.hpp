// SPDX-License-Identifier: MIT
// SQLite: the statements of one event's path, reservation to commit, as data. Every statement
// takes the handle's gate as ?1: a handle never reads or writes another gate's row.
#pragma once

#include "../../sql.hpp"

namespace idemgate::sql::sqlite {

/// Opens the write transaction every write runs in: the write lock is taken at once.
inline constexpr Statement begin{"begin", "", "BEGIN IMMEDIATE"};
/// Commits it.
inline constexpr Statement commit_transaction{"commit_transaction", "", "COMMIT"};
/// Rolls it back.
inline constexpr Statement rollback{"rollback", "", "ROLLBACK"};

/// The reservation of a new key. No RETURNING (SQLite builds a temporary table per run for one)
/// and no statement journal: the common case allocates nothing per event. For a key that
/// exists, `duplicate` follows in the same write transaction, so no reservation goes uncounted.
/// `adopt_key` runs first, in the same write transaction.
inline constexpr Statement reserve{
    "reserve",
    "?1 gate, ?2 key, ?3 lease until (µs), ?4 fingerprint, ?5 request, ?6 now (µs), ?7 label ('' "
    "for none)",
    R"sql(
INSERT INTO {log} (gate, key, status, fence, lease_until, fingerprint, request, duplicates,
                   attempts, created_at, updated_at, label)
VALUES (?1, ?2, 'in_flight', 1, ?3, ?4, ?5, 0, 1, ?6, ?6, nullif(?7, ''))
ON CONFLICT (gate, key) DO NOTHING
)sql"};

/// Before a gate's reservation, in its write transaction: a row of the key that belongs to no gate
/// (written before logs knew their gates, not adopted yet) becomes the gate's, so the event an
/// earlier version finished is answered from it instead of being processed again. A key the gate
/// holds already keeps its own row (OR IGNORE). One primary-key probe, no temporary table (an
/// INSERT that read the log in a subquery would build one per run).
inline constexpr Statement adopt_key{"adopt_key", "?1 gate, ?2 key", R"sql(
UPDATE OR IGNORE {log} SET gate = ?1 WHERE gate = '' AND key = ?2
)sql"};

/// Counts a reservation that met a stored key, and returns the stored row.
inline constexpr Statement duplicate{"duplicate", "?1 gate, ?2 key", R"sql(
UPDATE {log} SET duplicates = duplicates + 1 WHERE gate = ?1 AND key = ?2
RETURNING fence, status, fingerprint, lease_until, result, reason,
          {released_by_this_attempt(history, attempts)}
)sql"};

/// Takes an expired lease over: the next fence, a new lease, one more attempt.
inline constexpr Statement take_over{"take_over",
                                     "?1 gate, ?2 key, ?3 fence, ?4 lease until (µs), ?5 now (µs)",
                                     R"sql(
UPDATE {log}
   SET fence = fence + 1, attempts = attempts + 1, lease_until = ?4, updated_at = ?5,
       history = {taken_over_history(?5)}
 WHERE gate = ?1 AND key = ?2 AND status = 'in_flight' AND fence = ?3 AND lease_until < ?5
RETURNING fence
)sql"};

/// The fenced status update of the commit transaction (the business write follows it).
inline constexpr Statement commit{"commit", "?1 gate, ?2 key, ?3 fence, ?4 result, ?5 now (µs)",
                                  R"sql(
UPDATE {log} SET status = 'committed', result = ?4, updated_at = ?5
 WHERE gate = ?1 AND key = ?2 AND status = 'in_flight' AND fence = ?3
)sql"};

/// `commit_computed`'s result, written once its producer ran, under the commit's fence.
inline constexpr Statement set_result{"set_result", "?1 gate, ?2 key, ?3 fence, ?4 result", R"sql(
UPDATE {log} SET result = ?4
 WHERE gate = ?1 AND key = ?2 AND status = 'committed' AND fence = ?3
)sql"};

/// Whether the row this transaction committed is still as the store wrote it (after the
/// business write, before the COMMIT).
inline constexpr Statement left_as_written{"left_as_written",
                                           "?1 gate, ?2 key, ?3 fence, ?4 updated at (µs)", R"sql(
SELECT count(*) FROM {log}
 WHERE gate = ?1 AND key = ?2 AND status = 'committed' AND fence = ?3 AND updated_at = ?4
)sql"};

/// Stores a permanent failure (fenced).
inline constexpr Statement fail{"fail", "?1 gate, ?2 key, ?3 fence, ?4 reason, ?5 now (µs)", R"sql(
UPDATE {log}
   SET status = 'failed', reason = ?4, updated_at = ?5,
       history = {history_with('failed', ?4, ?5)}
 WHERE gate = ?1 AND key = ?2 AND status = 'in_flight' AND fence = ?3
)sql"};

/// Parks the key for a human (fenced).
inline constexpr Statement escalate{"escalate", "?1 gate, ?2 key, ?3 fence, ?4 reason, ?5 now (µs)",
                                    R"sql(
UPDATE {log}
   SET status = 'escalated', reason = ?4, updated_at = ?5,
       history = {history_with('escalated', ?4, ?5)}
 WHERE gate = ?1 AND key = ?2 AND status = 'in_flight' AND fence = ?3
)sql"};

/// Ends the lease after a transient failure (fenced). The row stays in flight: the next delivery
/// takes it over with a higher fence (a worker still holding the old fence can never commit), and
/// if no delivery comes back the reconciler finishes the event.
inline constexpr Statement release{
    "release",
    "?1 gate, ?2 key, ?3 fence, ?4 ended lease (µs), ?5 now (µs), ?6 reason ('' for none)",
    R"sql(
UPDATE {log}
   SET lease_until = ?4, updated_at = ?5,
       reason = CASE WHEN ?6 = '' THEN reason ELSE ?6 END,
       history = CASE WHEN ?6 = '' THEN history ELSE {history_with('released', ?6, ?5)} END
 WHERE gate = ?1 AND key = ?2 AND status = 'in_flight' AND fence = ?3
)sql"};

/// Reads one row.
inline constexpr Statement find{"find", "?1 gate, ?2 key",
                                "SELECT {record_columns} FROM {log} WHERE gate = ?1 AND key = ?2"};

/// Reads status and fence after a fenced update missed.
inline constexpr Statement settled{"settled", "?1 gate, ?2 key",
                                   "SELECT status, fence FROM {log} WHERE gate = ?1 AND key = ?2"};

}  // namespace idemgate::sql::sqlite
