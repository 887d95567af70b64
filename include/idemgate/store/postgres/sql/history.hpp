// SPDX-License-Identifier: MIT
// PostgreSQL: how a statement appends to a row's history (a jsonb array), as SQL fragments.
#pragma once

#include "../../sql.hpp"

namespace idemgate::sql::postgres {

/// The row's history with one more entry for the attempt the row is at, now, keeping the newest
/// `history_limit` entries (the oldest goes first).
inline constexpr Fragment history_with{"history_with", "{1} outcome, {2} reason (SQL expressions)",
                                       R"sql(
(CASE WHEN jsonb_array_length(coalesce(history, '[]'::jsonb)) >= {history_limit}
      THEN coalesce(history, '[]'::jsonb) - 0
      ELSE coalesce(history, '[]'::jsonb) END
 || jsonb_build_array(jsonb_build_object(
      'attempt', attempts, 'outcome', {1}::text, 'reason', {2}::text,
      'at', (extract(epoch FROM now()) * 1000000)::bigint)))
)sql"};

/// Whether the row's newest history entry is its current attempt's release (`{1}` its history,
/// `{2}` its attempts): a lease that is still live is then a back-off hold nobody works under.
inline constexpr Fragment released_by_this_attempt{
    "released_by_this_attempt", "{1} history, {2} attempts (SQL expressions)", R"sql(
coalesce({1} -> -1 ->> 'outcome' = 'released' AND ({1} -> -1 ->> 'attempt')::bigint = {2}, false)
)sql"};

/// A takeover's history: an entry when the holder's lease ran out, none when the lease was
/// given back (released or re-driven: those wrote their own, and end the lease at the epoch, or
/// hold it for a back-off after a 'released' entry of this very attempt).
inline constexpr Fragment taken_over_history{"taken_over_history", "", R"sql(
CASE WHEN lease_until <= 'epoch' OR {released_by_this_attempt(history, attempts)} THEN history
     ELSE {history_with('taken_over', 'lease expired')} END
)sql"};

}  // namespace idemgate::sql::postgres
