// SPDX-License-Identifier: MIT
// PostgreSQL: every statement the store prepares, and every fragment its statements call.
#pragma once

#include "../../sql.hpp"
#include "batches.hpp"
#include "events.hpp"
#include "generations.hpp"
#include "history.hpp"
#include "leases.hpp"
#include "monitoring.hpp"
#include "operator.hpp"
#include "schema.hpp"

namespace idemgate::sql::postgres {

/// Every statement of the log that the store sends with parameters, rendered once per store:
/// each is prepared on a connection at its first use there (or sent with its parameters as
/// literals, as the commit's checked path does), and its place in this list is its bit in a
/// connection's set of prepared statements.
inline constexpr const Statement* prepared[] = {
    &reserve,
    &take_over,
    &commit,
    &fail,
    &escalate,
    &release,
    &find,
    &settled,
    &make_durable,
    &extend,
    &take_stale,
    &reserve_batch,
    &batch_landed,
    &commit_bulk,
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
    &adopt,
    &adopt_mismatches,
    &reserve_committed,
    &set_result,
};

/// Every fragment the statements call (`{name(…)}`).
inline constexpr const Fragment* fragments[] = {
    &history_with,       &released_by_this_attempt,
    &taken_over_history, &redriven,
    &row_filter,         &oldest_snapshot,
    &has_column,         &cause,
    &reason_or_cause_is, &purgeable,
};

}  // namespace idemgate::sql::postgres
