// SPDX-License-Identifier: MIT
// What the idempotency log holds and what a store returns: rows, reservations, signals.
#pragma once

#include "errors.hpp"
#include "key.hpp"

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace idemgate {

/// SHA-256 of a request's canonical bytes; tells a duplicate from a conflicting reuse of a key.
using Fingerprint = std::array<unsigned char, 32>;

/// Where an event stands in the store.
enum class RecordStatus {
  in_flight,  ///< Reserved; a worker holds a lease on it.
  committed,  ///< Outcome and business write committed together.
  failed,     ///< The downstream refused for good; the reason is stored.
  escalated,  ///< Parked for a human; the reason is stored.
};

/// The name a store writes for a status.
[[nodiscard]] constexpr std::string_view to_string(RecordStatus status) noexcept {
  switch (status) {
    case RecordStatus::in_flight:
      return "in_flight";
    case RecordStatus::committed:
      return "committed";
    case RecordStatus::failed:
      return "failed";
    case RecordStatus::escalated:
      return "escalated";
  }
  return "unknown";
}

/// Parses a stored status name; throws `std::runtime_error` for anything else.
[[nodiscard]] inline RecordStatus parse_record_status(std::string_view text) {
  if (text == "in_flight") return RecordStatus::in_flight;
  if (text == "committed") return RecordStatus::committed;
  if (text == "failed") return RecordStatus::failed;
  if (text == "escalated") return RecordStatus::escalated;
  throw std::runtime_error("idemgate: the store holds an unknown status \"" + std::string(text) +
                           "\"; was the table written by a newer version?");
}

/// What one atomic reservation found.
struct Reservation {
  /// How the reservation went.
  enum class Kind {
    acquired,    ///< The key was new; this caller holds it.
    taken_over,  ///< The key was in flight under an expired lease; this caller took it over.
    existing,    ///< The key is held or finished; see the other fields.
  };
  /// How the reservation went.
  Kind kind = Kind::existing;
  /// The fence token this caller must present to commit (acquired, taken over).
  std::int64_t fence = 0;
  /// The stored status (existing).
  RecordStatus status = RecordStatus::in_flight;
  /// Whether the stored fingerprint equals the new request's (existing).
  bool same_request = true;
  /// The stored outcome bytes (existing, committed).
  std::string result;
  /// The stored reason (existing, failed or escalated).
  std::string reason;
  /// In flight under a live lease that is a back-off hold (existing): its last attempt failed for
  /// now and gave the event back with a hold (`GateOptions::retry_backoff`), so nobody works on
  /// it until the hold ends. The gate answers `retry` (do not ack) instead of `in_flight`.
  bool held = false;

  /// The key was new; this caller holds it under `fence`.
  [[nodiscard]] static Reservation acquired(std::int64_t fence) {
    Reservation r;
    r.kind = Kind::acquired;
    r.fence = fence;
    return r;
  }
  /// This caller took an expired lease over; it now holds `fence`.
  [[nodiscard]] static Reservation taken_over(std::int64_t fence) {
    Reservation r;
    r.kind = Kind::taken_over;
    r.fence = fence;
    return r;
  }
  /// The key is held or finished.
  [[nodiscard]] static Reservation existing(std::int64_t fence, RecordStatus status,
                                            bool same_request, std::string result = {},
                                            std::string reason = {}) {
    Reservation r;
    r.fence = fence;
    r.status = status;
    r.same_request = same_request;
    r.result = std::move(result);
    r.reason = std::move(reason);
    return r;
  }
};

/// What one event run as one transaction (`commit_once`, `TransactionGate`) came to.
struct OnceResult {
  /// How it went.
  enum class Kind {
    committed,  ///< The key was new (or stranded): the business write and its row committed.
    existing,   ///< The key was taken: nothing was written; `found` holds what is stored.
    busy,       ///< Another transaction held the key uncommitted past the wait: nothing written.
  };
  /// How it went.
  Kind kind = Kind::busy;
  /// The business write's outcome bytes, as stored (committed).
  std::string result;
  /// Whether the committed row was a stranded one taken over (committed).
  bool taken_over = false;
  /// What the log holds (existing).
  Reservation found;

  /// The event committed with `result`; `taken_over` when its row was stranded work taken over.
  [[nodiscard]] static OnceResult committed(std::string result, bool taken_over = false) {
    OnceResult r;
    r.kind = Kind::committed;
    r.result = std::move(result);
    r.taken_over = taken_over;
    return r;
  }
  /// The key was taken: `found` says by what.
  [[nodiscard]] static OnceResult existing(Reservation found) {
    OnceResult r;
    r.kind = Kind::existing;
    r.found = std::move(found);
    return r;
  }
  /// A concurrent transaction held the key past the wait.
  [[nodiscard]] static OnceResult busy() { return {}; }
};

/// How a fenced write went.
enum class CommitStatus {
  committed,   ///< The status changed; with `commit`, the business write is committed with it.
  lost_lease,  ///< The fence no longer matched: another worker took the event over. Nothing
               ///< was written.
};

/// How many entries a row's history keeps: the newest ones; older entries drop off.
inline constexpr std::size_t history_limit = 16;

/**
 * One end of an attempt that did not commit, or an operator's action, kept with its row
 * (`Record::history`). Stores write:
 * - `failed`, `escalated`: the attempt stored a failure or parked the event (`reason`: why);
 * - `released`: the attempt gave the event back after a transient failure, saying why;
 * - `taken_over`: the attempt's lease ran out while it held the event (its worker crashed or
 *   stalled) and a redelivery or the reconciler took the event over;
 * - `redriven`: an operator put the failed event back in flight (`reason`: the failure it had);
 * - `resolved`: an operator committed the escalated event by hand (`reason`: why it was parked).
 * A commit writes no entry: the row's status says it.
 */
struct HistoryEntry {
  /// `Record::attempts` of the attempt the entry ends or acts on.
  std::int64_t attempt = 0;
  /// What happened: "failed", "escalated", "released", "taken_over", "redriven", "resolved".
  std::string outcome;
  /// Why, when known ("" otherwise).
  std::string reason;
  /// When it happened.
  std::chrono::system_clock::time_point at;

  /// Entries are equal when every field is.
  friend bool operator==(const HistoryEntry&, const HistoryEntry&) = default;
};

/// One row of the idempotency log, as read back for inspection and reconciliation.
struct Record {
  /// The gate the row belongs to ("" for a row written before logs knew their gates).
  std::string gate;
  /// The idempotency key.
  Key key;
  /// Where the event stands.
  RecordStatus status = RecordStatus::in_flight;
  /// The current fence token.
  std::int64_t fence = 0;
  /// The request's canonical bytes.
  std::string request;
  /// SHA-256 of `request`.
  Fingerprint fingerprint{};
  /// The outcome's bytes (committed).
  std::optional<std::string> result;
  /// Why it failed or was escalated.
  std::string reason;
  /// When the key was first reserved.
  std::chrono::system_clock::time_point created_at;
  /// When the row last changed.
  std::chrono::system_clock::time_point updated_at;
  /// Until when the current holder's lease runs.
  std::chrono::system_clock::time_point lease_until;
  /// How many later reservations met this key (duplicates, replays, in-flight collisions).
  std::int64_t duplicates = 0;
  /// How many attempts held this event: 1 for the first reservation, plus one for every
  /// takeover (a redelivery after an expired lease, a reconciler pass) and re-drive.
  std::int64_t attempts = 0;
  /// The readable label kept with the row ("" when none was kept: labels are off by default,
  /// see `GateOptions::keep_labels`).
  std::string label;
  /// The ends of earlier attempts and operators' actions, oldest first; at most `history_limit`
  /// (the newest). See `HistoryEntry`.
  std::vector<HistoryEntry> history;
};

/// Which rows an operator asks for: every field that is set narrows the list; empty means any.
struct RowQuery {
  /// Only rows with this status.
  std::optional<RecordStatus> status = std::nullopt;
  /// Only rows whose reason, or whose cause (`cause_of` the reason), is exactly this ("" matches
  /// rows without one).
  std::optional<std::string> reason = std::nullopt;
  /// Only rows whose label contains this text (case-sensitive), such as an upstream's id.
  std::string label_contains = {};
  /// Only rows that last changed at or after this instant (`updated_at >= changed_from`).
  std::optional<std::chrono::system_clock::time_point> changed_from = std::nullopt;
  /// Only rows that last changed before this instant (`updated_at < changed_to`).
  std::optional<std::chrono::system_clock::time_point> changed_to = std::nullopt;
  /// At most this many rows (`rows`; `count` ignores it).
  std::size_t limit = 100;
};

/// A reason's cause: its first line (the text before the first line feed), or the whole reason
/// when it has one line. A failure's reason puts its short, stable class first (for an HTTP
/// downstream: method, route, status and the problem's type) and the details of this one event
/// on the lines after it; `causes` groups rows by the first line, and the row and its history
/// keep every line.
[[nodiscard]] constexpr std::string_view cause_of(std::string_view reason) noexcept {
  return reason.substr(0, reason.find('\n'));
}

/// Failed or escalated rows of one gate that share a status and a cause: one cause.
struct Cause {
  /// `failed` or `escalated`.
  RecordStatus status = RecordStatus::failed;
  /// The cause they share: the first line of their reasons ("" for rows without one). An
  /// operator's filter or re-drive given this text finds every row of the cause.
  std::string reason;
  /// How many rows.
  std::int64_t rows = 0;
  /// The oldest `updated_at` among them.
  std::chrono::system_clock::time_point first_seen;
  /// The newest `updated_at` among them.
  std::chrono::system_clock::time_point last_seen;

  /// A short name of the cause that stays the same while its rows come and go: the first 12 hex
  /// digits of SHA-256 over the status and the cause. `idemgate redrive --cause` takes it.
  [[nodiscard]] std::string id() const {
    const std::string named = std::string(to_string(status)) + '\n' + reason;
    const auto digest = detail::sha256(named);
    std::string out;
    detail::append_hex(out, std::string_view(reinterpret_cast<const char*>(digest.data()), 6));
    return out;
  }
};

/// The text of the failed rows' cause whose `Cause::id()` is `id`, among `causes`; none when no
/// failed cause has it. What the command and the console turn an operator's cause id into.
[[nodiscard]] inline std::optional<std::string> failed_cause_with_id(
    const std::vector<Cause>& causes, std::string_view id) {
  for (const Cause& c : causes)
    if (c.status == RecordStatus::failed && c.id() == id) return c.reason;
  return std::nullopt;
}

/// A downstream answer for a key that differed from the stored one (healthy: never).
struct Mismatch {
  /// The key.
  Key key;
  /// The outcome the store holds.
  std::string stored;
  /// The different outcome the downstream gave.
  std::string observed;
  /// Where it was seen, e.g. "lost_lease" or "reconciler".
  std::string source;
  /// When it was recorded.
  std::chrono::system_clock::time_point at;
};

/// A stranded row taken over by a reconciler: the new fence and what is needed to finish it.
struct Stranded {
  /// The idempotency key.
  Key key;
  /// The fence token after the takeover.
  std::int64_t fence = 0;
  /// The request's canonical bytes.
  std::string request;
  /// Attempts that held this event, this takeover included (see `Record::attempts`).
  std::int64_t attempts = 0;
  /// Why the previous attempt gave the event back, when it said (empty otherwise).
  std::string last_error;
};

/// A lease a caller holds: the key and its fence.
struct HeldLease {
  /// The idempotency key.
  Key key;
  /// The fence the caller holds.
  std::int64_t fence = 0;
};

/// What one renewal (`renew`) found for one held lease.
enum class LeaseRenewal {
  extended,  ///< The fence still held: the lease now runs `lease` from the renewal.
  gone,      ///< The fence no longer holds (taken over, or settled): nothing to renew any more.
  busy,      ///< Another transaction was writing the row (a commit of it under way, or a
             ///< takeover): not extended, and not known to be lost. The next renewal tells.
};

/// One key of a batch reservation.
struct ReserveItem {
  /// The idempotency key.
  Key key;
  /// SHA-256 of `request`.
  Fingerprint fingerprint{};
  /// The request's canonical bytes.
  std::string_view request;
  /// The readable label to keep with a new row ("" keeps none; see `labelling_store`).
  std::string_view label = {};
};

/// One outcome of a batch commit.
struct CommitItem {
  /// The idempotency key.
  Key key;
  /// The fence the caller holds.
  std::int64_t fence = 0;
  /// The outcome's bytes.
  std::string_view result;
};

/// What became of one item of a group commit (`commit_each`).
struct ItemCommit {
  /// `committed`, or `lost_lease` when its fence no longer held (then nothing of it was written).
  CommitStatus status = CommitStatus::lost_lease;
  /// What its business write (or its fenced update) threw, when it threw: nothing of the item
  /// was committed, and the other items of the group were not affected.
  std::exception_ptr error;
};

namespace detail {

/// The help text of the `idemgate_oldest_snapshot_seconds` gauge, in both exporters.
inline constexpr const char* oldest_snapshot_help =
    "Age of the oldest transaction open in the log's database (PostgreSQL; 0 when none): no "
    "vacuum reclaims what the log deleted or replaced since it began.";

}  // namespace detail

/// The three signals of a gate, read from its store over a window, plus the rows that need a
/// human. A gate fails silently if nobody watches these.
struct StoreSignals {
  /// The window the event counts cover.
  std::chrono::seconds window{0};
  /// Reservations in the window: first deliveries plus those that met an existing key. Counted
  /// per event reserved in the window (a late duplicate counts toward its event's window).
  std::int64_t events = 0;
  /// Reservations in the window that met an existing key.
  std::int64_t duplicates = 0;
  /// Rows in flight now.
  std::int64_t in_flight = 0;
  /// Age of the oldest in-flight row; nullopt when there is none.
  std::optional<std::chrono::seconds> oldest_in_flight;
  /// Rows parked for a human now.
  std::int64_t escalated = 0;
  /// Keys for which the downstream gave more than one distinct result, in the window.
  std::int64_t mismatched_keys = 0;
  /// Every mismatch ever recorded (a counter: it only grows, until purged).
  std::int64_t mismatches_total = 0;
  /// In-flight rows held by more than one attempt so far: work that failed or stalled before
  /// and is being retried. A number that keeps growing means poison rows.
  std::int64_t retrying = 0;
  /// Bytes in the store's write-ahead log file, where the store keeps one of its own (SQLite);
  /// nullopt elsewhere.
  std::optional<std::int64_t> wal_bytes;
  /// How long the oldest transaction still open in the log's database has been open, where the
  /// store can tell (PostgreSQL; nullopt elsewhere): zero when no other transaction is open. No
  /// vacuum removes a row version of the log deleted or replaced after that transaction began,
  /// so while it stays open the log grows by every purge and every commit (docs/operations.md).
  std::optional<std::chrono::seconds> oldest_snapshot;
  /// Who holds that transaction: "session 4242 (reports), idle in transaction" or "prepared
  /// transaction 'gid'"; empty when none is open.
  std::string oldest_snapshot_holder;

  /// Duplicates ÷ events; 0 without events. Normal: 1–3 %.
  [[nodiscard]] double duplicate_ratio() const noexcept {
    return events == 0 ? 0.0 : static_cast<double>(duplicates) / static_cast<double>(events);
  }
};

}  // namespace idemgate
