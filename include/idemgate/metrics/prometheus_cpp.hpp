// SPDX-License-Identifier: MIT
// The gate's counters, latency histogram and store signals in a prometheus-cpp registry.
#pragma once

/// An observer that registers the gate's metrics in a `prometheus::Registry` the application
/// already exposes (prometheus-cpp; CMake target `idemgate::prometheus`). The metric names are
/// those of `render_prometheus` (prometheus.hpp), plus a latency histogram per result.

#include "../concepts.hpp"
#include "../detail/durations.hpp"
#include "../gate_name.hpp"
#include "../key.hpp"
#include "../outcome.hpp"
#include "../record.hpp"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/labels.h>
#include <prometheus/registry.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

// Inside this namespace `prometheus` names it; prometheus-cpp is always `::prometheus`.
namespace idemgate::prometheus {

/// The default bounds of the latency histogram, in seconds: a call through the gate takes from
/// about a millisecond (a duplicate answered from the cache or the store) to a minute (a slow
/// downstream under its timeout).
[[nodiscard]] inline std::vector<double> default_latency_buckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
}

/// How `RegistryObserver` registers its metrics. The constructor refuses unusable values with
/// `std::invalid_argument`.
struct RegistryOptions {
  /// The gate whose metrics these are: every series gets the label `gate="<name>"`, as
  /// `render_prometheus` writes it, and a gate of another name refuses the observer. Empty (the
  /// default): no gate label.
  std::string gate{};
  /// Upper bounds of the histogram `idemgate_gate_duration_seconds`, in seconds: from 1 to
  /// `max_buckets` finite values above 0, strictly increasing (`+Inf` is always added).
  std::vector<double> latency_buckets = default_latency_buckets();
  /// Labels added to every series, e.g. `{{"region", "eu"}}`. Names must not be `result` or
  /// `le`, which the metrics use themselves, nor `gate` when `gate` is set.
  ::prometheus::Labels labels{};

  /// Most histogram bounds: each one is a series per result.
  static constexpr std::size_t max_buckets = 64;
};

/**
 * An `observer` that counts the gate's results and their latency in a `prometheus::Registry`,
 * and mirrors a store's signals into gauges there when `update` is called.
 *
 * Registered in the constructor (each series starts at 0, so alerts see it before the first
 * event):
 * - `idemgate_events_total{result}` (counter): results of `Gate::process`, by result;
 * - `idemgate_gate_duration_seconds{result}` (histogram): how long each call took, by result;
 * - `idemgate_gate_seconds_total` (counter): time spent in `Gate::process`;
 * - `idemgate_reconciled_total` (counter): rows this process's reconciler finished;
 * - from `update(signals)`, the gauges of `render_prometheus` (`idemgate_duplicate_ratio`,
 *   `idemgate_oldest_in_flight_seconds`, `idemgate_result_mismatch_keys`, `idemgate_window_*`,
 *   `idemgate_in_flight_rows`, `idemgate_escalated_rows`, `idemgate_retrying_rows`,
 *   `idemgate_signal_window_seconds`, `idemgate_wal_bytes` and `idemgate_oldest_snapshot_seconds`
 * where the store has them) and the counter `idemgate_result_mismatch_total`, so `docs/alerts.yml`
 * applies unchanged.
 *
 * The signals come from the shared store, not from this process: call `update` on a timer
 * (every 15 to 60 s) from one place. The registry must outlive the observer; the series stay
 * in it afterwards. Two observers given the same `labels` add into the same series. All
 * members are thread-safe; `on_result` costs two atomic increments and a histogram
 * observation.
 *
 * Example:
 *   auto registry = std::make_shared<prometheus::Registry>();
 *   prometheus::Exposer exposer{"127.0.0.1:9464"};  // prometheus-cpp's pull library
 *   exposer.RegisterCollectable(registry);
 *   idemgate::prometheus::RegistryObserver metrics{*registry, {.gate = "ect.claim_slot"}};
 *   idemgate::Gate gate{"ect.claim_slot", store, terminal, book, {}, metrics};
 *   // every 30 s:
 *   metrics.update(gate.store().signals(std::chrono::hours(1)));
 */
class RegistryObserver {
 public:
  /// Registers the metrics in `registry`; throws `std::invalid_argument` for unusable options,
  /// and whatever prometheus-cpp throws when a metric of the same name but another type is
  /// there already.
  explicit RegistryObserver(::prometheus::Registry& registry, RegistryOptions options = {})
      : registry_(registry), labels_(options.labels), gate_(options.gate) {
    validate(options);
    if (!gate_.empty()) labels_.emplace("gate", GateName(gate_).str());
    auto& events = ::prometheus::BuildCounter()
                       .Name("idemgate_events_total")
                       .Help("Deliveries through the gate in this process, by result.")
                       .Register(registry_);
    auto& durations = ::prometheus::BuildHistogram()
                          .Name("idemgate_gate_duration_seconds")
                          .Help("How long Gate::process took in this process, by result.")
                          .Register(registry_);
    const ::prometheus::Histogram::BucketBoundaries bounds(options.latency_buckets.begin(),
                                                           options.latency_buckets.end());
    for (std::size_t i = 0; i < kinds; ++i) {
      ::prometheus::Labels labels = labels_;
      labels.emplace("result", std::string(to_string(static_cast<Status>(i))));
      events_[i] = &events.Add(labels);
      durations_[i] = &durations.Add(labels, bounds);
    }
    seconds_ =
        &counter("idemgate_gate_seconds_total", "Time spent in Gate::process in this process.");
    reconciled_ = &counter("idemgate_reconciled_total",
                           "Stranded in-flight rows this process's reconciler finished.");
    mismatches_ = &counter("idemgate_result_mismatch_total",
                           "Downstream answers that differed from the stored result, ever "
                           "recorded (mirrored from the store by update).");
    window_ = &gauge("idemgate_signal_window_seconds",
                     "The window the event, duplicate and mismatch signals cover.");
    events_in_window_ = &gauge("idemgate_window_events",
                               "Reservations in the window: first deliveries plus duplicates.");
    duplicates_ = &gauge("idemgate_window_duplicates",
                         "Reservations in the window that met an existing key.");
    ratio_ = &gauge("idemgate_duplicate_ratio",
                    "Duplicates divided by events in the window (normal 0.01 to 0.03; 0 with "
                    "traffic: broken key derivation; above 0.2: a misbehaving upstream).");
    in_flight_ = &gauge("idemgate_in_flight_rows", "Rows in flight now.");
    oldest_ = &gauge("idemgate_oldest_in_flight_seconds",
                     "Age of the oldest in-flight row (0 when there is none).");
    escalated_ = &gauge("idemgate_escalated_rows", "Rows parked in the manual queue for a human.");
    retrying_ = &gauge("idemgate_retrying_rows",
                       "In-flight rows held by more than one attempt (growing: poison rows).");
    mismatched_keys_ = &gauge("idemgate_result_mismatch_keys",
                              "Keys for which the downstream returned more than one distinct "
                              "result, in the window (healthy: 0).");
  }

  RegistryObserver(const RegistryObserver&) = delete;
  RegistryObserver& operator=(const RegistryObserver&) = delete;

  /// Counts one result of `Gate::process` and observes how long it took. Never throws: a
  /// metric that cannot be recorded must not fail an event that was processed.
  void on_result(const Key&, Status status, std::chrono::nanoseconds took) noexcept {
    const auto index = static_cast<std::size_t>(status);
    if (index >= kinds) return;
    const double seconds = took.count() <= 0 ? 0.0 : std::chrono::duration<double>(took).count();
    try {
      events_[index]->Increment();
      durations_[index]->Observe(seconds);
      seconds_->Increment(seconds);
    } catch (...) {  // NOLINT(bugprone-empty-catch): see above
    }
  }
  /// Counts one row finished by the reconciler.
  void on_reconciled(const Key&, Status) { reconciled_->Increment(); }
  /// Ignored: the store records every mismatch once, whichever process saw it, and `update`
  /// mirrors its total into `idemgate_result_mismatch_total`.
  void on_mismatch(const Key&, std::string_view, std::string_view) noexcept {}

  /// Sets the signal gauges from `signals` (from `store.signals(window)`), and adds the
  /// mismatches recorded since the last call to `idemgate_result_mismatch_total`. A total that
  /// went down (rows purged) is taken as the new base.
  void update(const StoreSignals& signals) {
    const std::lock_guard lock(update_mutex_);
    window_->Set(static_cast<double>(signals.window.count()));
    events_in_window_->Set(static_cast<double>(signals.events));
    duplicates_->Set(static_cast<double>(signals.duplicates));
    ratio_->Set(signals.duplicate_ratio());
    in_flight_->Set(static_cast<double>(signals.in_flight));
    oldest_->Set(signals.oldest_in_flight ? static_cast<double>(signals.oldest_in_flight->count())
                                          : 0.0);
    escalated_->Set(static_cast<double>(signals.escalated));
    retrying_->Set(static_cast<double>(signals.retrying));
    mismatched_keys_->Set(static_cast<double>(signals.mismatched_keys));
    if (signals.mismatches_total > mismatches_seen_)
      mismatches_->Increment(static_cast<double>(signals.mismatches_total - mismatches_seen_));
    mismatches_seen_ = signals.mismatches_total;
    if (signals.wal_bytes) {
      if (wal_bytes_ == nullptr)
        wal_bytes_ = &gauge("idemgate_wal_bytes",
                            "Size of the store's write-ahead log file (SQLite), in bytes.");
      wal_bytes_->Set(static_cast<double>(*signals.wal_bytes));
    }
    if (signals.oldest_snapshot) {
      if (oldest_snapshot_ == nullptr)
        oldest_snapshot_ = &gauge("idemgate_oldest_snapshot_seconds", detail::oldest_snapshot_help);
      oldest_snapshot_->Set(static_cast<double>(signals.oldest_snapshot->count()));
    }
  }

 public:
  /// The gate these metrics are for ("" when not named).
  [[nodiscard]] const std::string& gate() const noexcept { return gate_; }

 private:
  static constexpr std::size_t kinds = 8;
  static_assert(static_cast<std::size_t>(Status::lost_lease) + 1 == kinds,
                "a new Status needs its series here");

  static void validate(const RegistryOptions& options) {
    detail::require_in_range("RegistryOptions::latency_buckets (its size)",
                             options.latency_buckets.size(), std::size_t{1},
                             RegistryOptions::max_buckets,
                             "Each bound is a series per result; the default has 15, from 1 ms "
                             "to 60 s.");
    double previous = 0.0;
    for (const double bound : options.latency_buckets) {
      if (!std::isfinite(bound) || bound <= previous)
        throw std::invalid_argument(
            "idemgate: RegistryOptions::latency_buckets must be finite numbers of seconds above "
            "0, strictly increasing (e.g. 0.001, 0.01, 0.1, 1, 10, 60); got " +
            std::to_string(bound) + " after " + std::to_string(previous) +
            ". Leave +Inf out: the histogram adds it.");
      previous = bound;
    }
    for (const auto& [name, value] : options.labels) {
      if (name == "result" || name == "le")
        throw std::invalid_argument("idemgate: RegistryOptions::labels holds \"" + name +
                                    "\", a label the metrics use themselves; name it otherwise "
                                    "(e.g. \"region\")");
      if (name == "gate" && !options.gate.empty())
        throw std::invalid_argument(
            "idemgate: RegistryOptions::labels holds \"gate\" and RegistryOptions::gate is set; "
            "set only RegistryOptions::gate");
    }
  }

  ::prometheus::Counter& counter(const char* name, const char* help) {
    return ::prometheus::BuildCounter().Name(name).Help(help).Register(registry_).Add(labels_);
  }
  ::prometheus::Gauge& gauge(const char* name, const char* help) {
    return ::prometheus::BuildGauge().Name(name).Help(help).Register(registry_).Add(labels_);
  }

  ::prometheus::Registry& registry_;
  ::prometheus::Labels labels_;
  std::string gate_;
  std::array<::prometheus::Counter*, kinds> events_{};
  std::array<::prometheus::Histogram*, kinds> durations_{};
  ::prometheus::Counter* seconds_ = nullptr;
  ::prometheus::Counter* reconciled_ = nullptr;
  ::prometheus::Counter* mismatches_ = nullptr;
  ::prometheus::Gauge* window_ = nullptr;
  ::prometheus::Gauge* events_in_window_ = nullptr;
  ::prometheus::Gauge* duplicates_ = nullptr;
  ::prometheus::Gauge* ratio_ = nullptr;
  ::prometheus::Gauge* in_flight_ = nullptr;
  ::prometheus::Gauge* oldest_ = nullptr;
  ::prometheus::Gauge* escalated_ = nullptr;
  ::prometheus::Gauge* retrying_ = nullptr;
  ::prometheus::Gauge* mismatched_keys_ = nullptr;
  ::prometheus::Gauge* wal_bytes_ = nullptr;
  ::prometheus::Gauge* oldest_snapshot_ = nullptr;
  std::mutex update_mutex_;
  std::int64_t mismatches_seen_ = 0;
};

static_assert(observer<RegistryObserver>);

}  // namespace idemgate::prometheus
