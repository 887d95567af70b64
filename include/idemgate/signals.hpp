#pragma once

#include "detail/durations.hpp"
#include "key.hpp"
#include "outcome.hpp"
#include "record.hpp"

#include <array>
#include <atomic>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace idemgate {

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

  /// Duplicates ÷ events; 0 without events. Normal: 1–3 %.
  [[nodiscard]] double duplicate_ratio() const noexcept {
    return events == 0 ? 0.0 : static_cast<double>(duplicates) / static_cast<double>(events);
  }
};

/// When the signals call for attention: the story's three alarms. `evaluate` refuses values
/// outside the ranges below with `std::invalid_argument`.
struct SignalThresholds {
  /// At least this many events in the window before a duplicate ratio of 0 is suspicious: at
  /// least 1; the type's `max()` turns the alarm off.
  std::int64_t min_events_for_zero_ratio = 100;
  /// A duplicate ratio above this means an upstream misbehaves: from 0 to 1 (1 turns the alarm
  /// off).
  double high_duplicate_ratio = 0.20;
  /// An in-flight row older than this is stranded: at least 0; `seconds::max()` turns the alarm
  /// off.
  std::chrono::seconds stranded_after = std::chrono::minutes(10);

  /// Throws `std::invalid_argument`, naming the threshold and its range, when one is out of it.
  void validate() const {
    if (min_events_for_zero_ratio < 1)
      throw std::invalid_argument("idemgate: SignalThresholds::min_events_for_zero_ratio is " +
                                  std::to_string(min_events_for_zero_ratio) +
                                  "; it must be between 1 and " +
                                  std::to_string(std::numeric_limits<std::int64_t>::max()) +
                                  ". Without traffic no ratio is suspicious (default 100).");
    if (!(high_duplicate_ratio >= 0.0 && high_duplicate_ratio <= 1.0))
      throw std::invalid_argument("idemgate: SignalThresholds::high_duplicate_ratio is " +
                                  std::to_string(high_duplicate_ratio) +
                                  "; it must be between 0 and 1 (a fraction of the events, "
                                  "default 0.20).");
    detail::require_in_range("SignalThresholds::stranded_after", stranded_after,
                             std::chrono::seconds(0), std::chrono::seconds::max(),
                             "An in-flight row older than it raises the alarm (default 10 min).");
  }
};

/// What the signals say, alarm by alarm.
struct Health {
  /// Traffic but not a single duplicate: the key derivation is probably broken (a delivery id
  /// in the key, a timestamp, a random nonce).
  bool key_derivation_suspect = false;
  /// The duplicate ratio is above the threshold: an upstream redelivers far too much.
  bool upstream_misbehaving = false;
  /// An in-flight row outlived the threshold: the reconciler is not finishing work.
  bool stranded_work = false;
  /// The downstream gave two results for one key: it forgot its idempotency cache, or the key
  /// sent to it is wrong.
  bool result_mismatch = false;
  /// True when no alarm is raised.
  [[nodiscard]] bool healthy() const noexcept {
    return !key_derivation_suspect && !upstream_misbehaving && !stranded_work && !result_mismatch;
  }
};

/// Evaluates the signals against the thresholds; throws `std::invalid_argument` when a threshold
/// is out of its range (see `SignalThresholds::validate`).
[[nodiscard]] inline Health evaluate(const StoreSignals& s, const SignalThresholds& t = {}) {
  t.validate();
  Health h;
  h.key_derivation_suspect = s.events >= t.min_events_for_zero_ratio && s.duplicates == 0;
  h.upstream_misbehaving = s.events > 0 && s.duplicate_ratio() > t.high_duplicate_ratio;
  h.stranded_work = s.oldest_in_flight && *s.oldest_in_flight > t.stranded_after;
  h.result_mismatch = s.mismatched_keys > 0;
  return h;
}

/**
 * Concept: a store that can report the signals and keep itself small.
 *
 * `signals(window)` reads the three signals; `record_mismatch` keeps a downstream answer that
 * differed from the stored one; `purge(older_than, batch)` deletes finished rows (committed or
 * failed, never in flight or escalated) that finished longer ago than `older_than`, `batch` rows
 * per statement, and returns how many it deleted.
 */
template <class S>
concept monitored_store = requires(S& s, std::chrono::seconds window, const Key& key,
                                   std::string_view bytes, std::size_t limit) {
  { s.signals(window) } -> std::same_as<StoreSignals>;
  s.record_mismatch(key, bytes, bytes, bytes);
  { s.mismatches(limit) } -> std::same_as<std::vector<Mismatch>>;
  { s.purge(window, limit) } -> std::same_as<std::size_t>;
};

/**
 * Concept: what the gate and the reconciler tell an observer, so users feed their own metrics
 * and logs without the library choosing a dependency. Called on the worker's thread; keep it
 * cheap and thread-safe.
 */
template <class O>
concept observer = requires(O& o, const Key& key, Status status, std::chrono::nanoseconds took,
                            std::string_view bytes) {
  o.on_result(key, status, took);
  o.on_reconciled(key, status);
  o.on_mismatch(key, bytes, bytes);
};

/// An observer that ignores everything (the default; compiles away).
struct NullObserver {
  /// Ignored.
  void on_result(const Key&, Status, std::chrono::nanoseconds) noexcept {}
  /// Ignored.
  void on_reconciled(const Key&, Status) noexcept {}
  /// Ignored.
  void on_mismatch(const Key&, std::string_view, std::string_view) noexcept {}
};

/// Counts results per kind, reconciliations and mismatches; lock-free, thread-safe. Render it
/// with `render_prometheus` (prometheus.hpp).
class Counters {
 public:
  /// Number of result kinds.
  static constexpr std::size_t kinds = 8;

  /// Counts one result of `Gate::process`.
  void on_result(const Key&, Status status, std::chrono::nanoseconds took) noexcept {
    by_status_[static_cast<std::size_t>(status)].fetch_add(1, std::memory_order_relaxed);
    seconds_sum_ns_.fetch_add(static_cast<std::uint64_t>(took.count()), std::memory_order_relaxed);
  }
  /// Counts one row finished by the reconciler.
  void on_reconciled(const Key&, Status) noexcept {
    reconciled_.fetch_add(1, std::memory_order_relaxed);
  }
  /// Counts one mismatch.
  void on_mismatch(const Key&, std::string_view, std::string_view) noexcept {
    mismatches_.fetch_add(1, std::memory_order_relaxed);
  }

  /// Results of one kind so far.
  [[nodiscard]] std::uint64_t count(Status status) const noexcept {
    return by_status_[static_cast<std::size_t>(status)].load(std::memory_order_relaxed);
  }
  /// Results of every kind so far.
  [[nodiscard]] std::uint64_t total() const noexcept {
    std::uint64_t n = 0;
    for (const auto& c : by_status_) n += c.load(std::memory_order_relaxed);
    return n;
  }
  /// Rows the reconciler finished so far.
  [[nodiscard]] std::uint64_t reconciled() const noexcept {
    return reconciled_.load(std::memory_order_relaxed);
  }
  /// Mismatches seen by this process so far.
  [[nodiscard]] std::uint64_t mismatches() const noexcept {
    return mismatches_.load(std::memory_order_relaxed);
  }
  /// Time spent in `Gate::process`, summed over every call, in seconds.
  [[nodiscard]] double seconds_in_gate() const noexcept {
    return static_cast<double>(seconds_sum_ns_.load(std::memory_order_relaxed)) / 1e9;
  }

 private:
  std::array<std::atomic<std::uint64_t>, kinds> by_status_{};
  std::atomic<std::uint64_t> reconciled_{0};
  std::atomic<std::uint64_t> mismatches_{0};
  std::atomic<std::uint64_t> seconds_sum_ns_{0};
};

static_assert(observer<NullObserver>);
static_assert(observer<Counters>);

}  // namespace idemgate
