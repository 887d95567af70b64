// SPDX-License-Identifier: MIT
// SQLite: how a statement appends to a row's history (JSON text), as SQL fragments.
#pragma once

#include "../../sql.hpp"

namespace idemgate::sql::sqlite {

/// The row's history with one more entry for the attempt the row is at, keeping the newest
/// `history_limit` entries (the oldest goes first).
inline constexpr Fragment history_with{"history_with",
                                       "{1} outcome, {2} reason, {3} when (SQL expressions)", R"sql(
json_insert(CASE WHEN json_array_length(coalesce(history, '[]')) >= {history_limit}
                 THEN json_remove(coalesce(history, '[]'), '$[0]')
                 ELSE coalesce(history, '[]') END,
            '$[#]', json_object('attempt', attempts, 'outcome', {1}, 'reason', {2}, 'at', {3}))
)sql"};

/// Whether the row's newest history entry is its current attempt's release (`{1}` its history,
/// `{2}` its attempts): a lease that is still live is then a back-off hold nobody works under.
inline constexpr Fragment released_by_this_attempt{
    "released_by_this_attempt", "{1} history, {2} attempts (SQL expressions)", R"sql(
coalesce(json_extract({1}, '$[#-1].outcome') = 'released'
         AND json_extract({1}, '$[#-1].attempt') = {2}, 0)
)sql"};

/// A takeover's history: an entry when the holder's lease ran out, none when the lease was
/// given back (released or re-driven: those wrote their own, and end the lease at the epoch or
/// before).
inline constexpr Fragment taken_over_history{"taken_over_history", "{1} when", R"sql(
CASE WHEN lease_until <= 0 OR {released_by_this_attempt(history, attempts)} THEN history
     ELSE {history_with('taken_over', 'lease expired', {1})} END
)sql"};

}  // namespace idemgate::sql::sqlite
