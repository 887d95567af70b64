// SPDX-License-Identifier: MIT
// SQLite: the statements that keep leases and take stranded work over, as data.
#pragma once

#include "../../sql.hpp"

namespace idemgate::sql::sqlite {

/// Extends one lease still held (one per held lease, in one write transaction).
inline constexpr Statement extend{"extend", "?1 gate, ?2 key, ?3 fence, ?4 lease until (µs)",
                                  R"sql(
UPDATE {log} SET lease_until = ?4
 WHERE gate = ?1 AND key = ?2 AND status = 'in_flight' AND fence = ?3
)sql"};

/// The reconciler's takeover of stranded rows, oldest lease first: in flight, lease expired,
/// unchanged since `?3`. One write transaction: two reconcilers never take the same row.
inline constexpr Statement take_stale{
    "take_stale", "?1 gate, ?2 now (µs), ?3 stale before (µs), ?4 lease until (µs), ?5 limit",
    R"sql(
UPDATE {log}
   SET fence = fence + 1, attempts = attempts + 1, lease_until = ?4, updated_at = ?2,
       history = {taken_over_history(?2)}
 WHERE gate = ?1 AND key IN (SELECT key FROM {log}
                              WHERE gate = ?1 AND status = 'in_flight' AND lease_until < ?2
                                AND updated_at <= ?3
                              ORDER BY lease_until LIMIT ?5)
RETURNING key, fence, request, attempts, reason
)sql"};

}  // namespace idemgate::sql::sqlite
