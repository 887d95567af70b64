// SPDX-License-Identifier: MIT
// SQLite: every statement of the log the store sends, and every fragment its statements call.
#pragma once

#include "../../sql.hpp"
#include "batches.hpp"
#include "events.hpp"
#include "history.hpp"
#include "leases.hpp"
#include "monitoring.hpp"
#include "operator.hpp"
#include "schema.hpp"

namespace idemgate::sql::sqlite {

/// Every statement of the log the store sends, rendered once per store; each is prepared at its
/// first use and kept.
inline constexpr const Statement* statements[] = {
    &begin,
    &commit_transaction,
    &rollback,
    &reserve,
    &adopt_key,
    &duplicate,
    &take_over,
    &commit,
    &set_result,
    &left_as_written,
    &fail,
    &escalate,
    &release,
    &find,
    &settled,
    &extend,
    &take_stale,
    &item_savepoint,
    &release_item_savepoint,
    &rollback_item_savepoint,
    &escalated,
    &resolve,
    &redrive_key,
    &redrive_range,
    &redrive_cause,
    &rows,
    &count,
    &causes,
    &gates,
    &signals,
    &record_mismatch,
    &mismatches,
    &purge,
    &purge_abandoned,
    &expire,
    &create_migrations,
    &migrated_version,
    &record_migration,
    &adopt,
    &adopt_mismatches,
};

/// Every fragment the statements call (`{name(…)}`).
inline constexpr const Fragment* fragments[] = {
    &history_with,
    &released_by_this_attempt,
    &taken_over_history,
    &redriven,
    &row_filter,
    &has_column,
    &cause,
    &reason_or_cause_is,
};

}  // namespace idemgate::sql::sqlite
