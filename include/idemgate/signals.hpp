// SPDX-License-Identifier: MIT
// Alarm thresholds over a store's signals, their evaluation, and the counting observer.
#pragma once

#include "concepts.hpp"
#include "detail/durations.hpp"
#include "gate_name.hpp"
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

/// When the signals call for attention: the thresholds of the alarms `Health` reports.
/// `evaluate` refuses values outside the ranges below with `std::invalid_argument`.
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
  /// A transaction open in the log's database for longer than this holds back its cleanup
  /// (`StoreSignals::oldest_snapshot`): at least 0; `seconds::max()` turns the alarm off.
  std::chrono::seconds old_snapshot_after = std::chrono::minutes(5);

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
    detail::require_in_range("SignalThresholds::old_snapshot_after", old_snapshot_after,
                             std::chrono::seconds(0), std::chrono::seconds::max(),
                             "A transaction open longer than it raises the alarm (default 5 min).");
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
  /// A transaction has been open in the log's database for longer than the threshold: until it
  /// ends, no vacuum reclaims what retention deletes or what commits replace, and the log grows.
  bool old_snapshot = false;
  /// True when no alarm is raised.
  [[nodiscard]] bool healthy() const noexcept {
    return !key_derivation_suspect && !upstream_misbehaving && !stranded_work && !result_mismatch &&
           !old_snapshot;
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
  h.old_snapshot = s.oldest_snapshot && *s.oldest_snapshot > t.old_snapshot_after;
  return h;
}

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
/// with `render_prometheus` (prometheus.hpp). Made for a named gate, it labels that gate's
/// samples, and a gate of another name refuses it at construction.
class Counters {
 public:
  /// Number of result kinds.
  static constexpr std::size_t kinds = 8;

  /// Counters whose samples carry no gate label (one gate per process).
  Counters() = default;
  /// Counters of gate `gate`: the samples carry `gate="<name>"`.
  explicit Counters(const GateName& gate) : gate_(gate.str()) {}

  /// The gate these counters are for ("" when not named).
  [[nodiscard]] const std::string& gate() const noexcept { return gate_; }

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
  std::string gate_;
  std::array<std::atomic<std::uint64_t>, kinds> by_status_{};
  std::atomic<std::uint64_t> reconciled_{0};
  std::atomic<std::uint64_t> mismatches_{0};
  std::atomic<std::uint64_t> seconds_sum_ns_{0};
};

static_assert(observer<NullObserver>);
static_assert(observer<Counters>);

}  // namespace idemgate
