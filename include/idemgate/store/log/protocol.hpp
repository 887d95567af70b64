// SPDX-License-Identifier: MIT
// The log protocol every store shares: what a reservation does with a row it meets, what a
// fenced write that touched nothing means, and the words a row's history is written in.
#pragma once

#include "../../errors.hpp"
#include "../../record.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace idemgate::detail {

/// What a reservation does with the row of its key that it met.
enum class Met {
  own,       ///< In flight and written by this very attempt (its reply was lost): it holds the key.
  expired,   ///< In flight for the same request under a lease that ran out: take it over.
  existing,  ///< Anything else: answer what is stored (a duplicate, a conflict, in flight).
};

/// Reads the row a reservation met: its status, whether it holds the same request, whether its
/// lease is still live, and whether this attempt wrote it (a store that reserves in one
/// transaction never meets its own row: `own` is false there).
[[nodiscard]] constexpr Met met(RecordStatus status, bool same_request, bool lease_live,
                                bool own) noexcept {
  if (status != RecordStatus::in_flight) return Met::existing;
  if (own) return Met::own;
  if (same_request && !lease_live) return Met::expired;
  return Met::existing;
}

/// Whether a row a reservation met waits out a back-off: in flight under a live lease that its
/// current attempt's release set (`given_back`: the newest history entry is that release).
[[nodiscard]] constexpr bool held(RecordStatus status, bool lease_live, bool given_back) noexcept {
  return status == RecordStatus::in_flight && lease_live && given_back;
}

/// What became of a row after a fenced update touched nothing, read back as its status and
/// fence.
enum class Settled {
  by_this_attempt,  ///< It holds `target` under this attempt's fence: an earlier try landed.
  still_held,       ///< It is still in flight under this attempt's fence.
  taken_over,       ///< Another attempt took it over (a higher fence), or it settled otherwise.
  fence_went_back,  ///< In flight under a lower fence: this attempt's takeover was lost.
};

/// Reads a row's `status` and `stored` fence after this attempt's (`fence`) fenced update to
/// `target` touched nothing.
[[nodiscard]] constexpr Settled settled_state(RecordStatus status, std::int64_t stored,
                                              std::int64_t fence, RecordStatus target) noexcept {
  if (status == RecordStatus::in_flight && stored < fence) return Settled::fence_went_back;
  if (stored == fence && status == target) return Settled::by_this_attempt;
  if (stored == fence && status == RecordStatus::in_flight) return Settled::still_held;
  return Settled::taken_over;
}

/// A row's status and fence, as a fenced write reads them back.
struct StoredFence {
  /// Its status.
  RecordStatus status;
  /// Its fence.
  std::int64_t fence;
};

/**
 * What a fenced write of this attempt (`fence`) to `target` answers when it touched no row, from
 * the row read back (`stored`; nullopt when there is none): `committed` when this fence's own
 * earlier attempt landed, `lost_lease` when another attempt holds or settled the event, and
 * nullopt when the row is still in flight under this fence (the write may go ahead). A row that
 * is gone, or back in flight under a lower fence, means this attempt's own reservation or
 * takeover was lost (a database crash, a restore): nobody holds the event, so it throws
 * `StoreError` (do not ack). `where` names the log in the message.
 */
[[nodiscard]] inline std::optional<CommitStatus> after_missed_write(
    const std::optional<StoredFence>& stored, std::int64_t fence, RecordStatus target,
    std::string_view where) {
  if (!stored)
    throw StoreError("idemgate: the reservation of this event is gone from " + std::string(where) +
                     " (lost in a database crash or a restore?); nothing was written. Do not "
                     "ack: the redelivery reserves it again, and the downstream returns the "
                     "original outcome for the key.");
  switch (settled_state(stored->status, stored->fence, fence, target)) {
    case Settled::fence_went_back:
      throw StoreError("idemgate: the event's row in " + std::string(where) + " is back at fence " +
                       std::to_string(stored->fence) + ", below this attempt's " +
                       std::to_string(fence) +
                       ": this attempt's takeover was lost (a database crash or a restore) and "
                       "nobody holds the event. Nothing was written. Do not ack: the redelivery "
                       "or the reconciler takes it over again.");
    case Settled::by_this_attempt:
      return CommitStatus::committed;
    case Settled::still_held:
      return std::nullopt;
    case Settled::taken_over:
      break;
  }
  return CommitStatus::lost_lease;
}

/// The outcomes a row's history records (`HistoryEntry::outcome`) besides the final statuses
/// (`failed`, `escalated`), and the reason of a takeover. The SQL stores write the same words in
/// their statements.
namespace history {
/// The holder gave the event back after a transient failure (`release` with a reason).
inline constexpr std::string_view released = "released";
/// An operator put a failed event back in flight.
inline constexpr std::string_view redriven = "redriven";
/// An operator committed an escalated event.
inline constexpr std::string_view resolved = "resolved";
/// Another attempt took the event over after the holder's lease ran out ...
inline constexpr std::string_view taken_over = "taken_over";
/// ... for this reason.
inline constexpr std::string_view lease_expired = "lease expired";
}  // namespace history

}  // namespace idemgate::detail
