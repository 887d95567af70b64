// SPDX-License-Identifier: MIT
// SQLite: the statements of batches and group commits, as data. A batch reserves and commits its
// items with the statements of one event, in one write transaction; a group commit puts each
// item under a savepoint of its own.
#pragma once

#include "../../sql.hpp"

namespace idemgate::sql::sqlite {

/// A group commit's item: its savepoint, taken in front of its fenced update.
inline constexpr Statement item_savepoint{"item_savepoint", "", "SAVEPOINT idemgate_item"};

/// Ends the item's savepoint after its business write.
inline constexpr Statement release_item_savepoint{"release_item_savepoint", "",
                                                  "RELEASE SAVEPOINT idemgate_item"};

/// Undoes one item of a group commit whose fence moved or whose business write threw.
inline constexpr Statement rollback_item_savepoint{"rollback_item_savepoint", "",
                                                   "ROLLBACK TO SAVEPOINT idemgate_item"};

}  // namespace idemgate::sql::sqlite
