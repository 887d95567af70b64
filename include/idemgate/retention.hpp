// SPDX-License-Identifier: MIT
// Retention: purges finished rows older than the dedup window.
#pragma once

#include "detail/durations.hpp"
#include "detail/periodic.hpp"
#include "signals.hpp"

#include <atomic>
#include <chrono>
#include <cstddef>
#include <exception>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace idemgate {

/// Tuning of `Retention`. `Retention`'s constructor refuses values outside the ranges below with
/// `std::invalid_argument`.
struct RetentionOptions {
  /// How long a finished row is kept: the dedup window. It must be longer than the longest
  /// time after which the upstream may still redeliver or replay an event; a redelivery after
  /// its row was purged is processed again. At least a second; `std::chrono::seconds::max()`
  /// (or any window longer than a store can represent) keeps every row forever: nothing is
  /// ever purged.
  std::chrono::seconds keep = std::chrono::hours(24 * 7);
  /// Time between purges of the background loop: from 1 ms to 7 days.
  std::chrono::milliseconds interval = std::chrono::hours(1);
  /// Rows deleted per statement, so each delete is short beside live traffic: from 1 to
  /// `max_batch`.
  std::size_t batch = 1000;
  /// Also delete abandoned attempts: rows in flight whose lease ended and that nothing touched
  /// for this long (the store's `purge_abandoned`). Off by default, as a consumer's reconciler
  /// finishes those rows; set it on the handle of a gate no reconciler serves, an endpoint's
  /// (to its `key_lifetime`), so that keys whose requests never completed end too. From 1 s up;
  /// on a consumer's gate, keep it far above the reconciler's `stale_after` + `interval`.
  std::optional<std::chrono::seconds> abandoned_after = std::nullopt;

  /// Longest `interval`.
  static constexpr std::chrono::days max_interval{7};
  /// Largest `batch`.
  static constexpr std::size_t max_batch = 1'000'000;
};

/**
 * Keeps the idempotency log small: deletes committed and failed rows past the dedup window, in
 * bounded batches, never in-flight or escalated rows.
 *
 * Example:
 *   idemgate::Retention retention{gate.store(), {.keep = std::chrono::days(7)}};
 *   retention.start();  // purges every hour until stop() or destruction
 */
template <monitored_store Store>
class Retention {
 public:
  /// Retention over `store`, a gate's handle (`gate.store()`, `store.for_gate(name)`); throws
  /// `std::invalid_argument` when an option is out of its range, or when `store` is a handle of
  /// no gate (the store as constructed), which would purge none of any gate's rows.
  explicit Retention(Store& store, RetentionOptions options = {})
      : store_(scoped(store)), options_(checked(options)) {}
  Retention(const Retention&) = delete;
  Retention& operator=(const Retention&) = delete;
  ~Retention() { stop(); }

  /// One purge; returns the rows deleted.
  std::size_t run_once() {
    std::size_t deleted = store_.purge(options_.keep, options_.batch);
    if constexpr (expiring_store<Store>) {
      if (options_.abandoned_after)
        deleted += store_.purge_abandoned(*options_.abandoned_after, options_.batch);
    }
    return deleted;
  }

  /// Starts the background loop: a purge now, then one every `interval`, until `stop()`.
  void start() {
    worker_.start(options_.interval, [this] {
      try {
        purged_ += run_once();
      } catch (const std::exception& e) {
        // The store is unreachable: try again next interval.
        std::lock_guard lock(error_mutex_);
        last_error_ = e.what();
      }
    });
  }

  /// Stops the background loop and waits for the current purge to end.
  void stop() { worker_.stop(); }

  /// Asks the background loop to stop after the current purge; returns at once.
  void request_stop() { worker_.request_stop(); }

  /// Stops the background loop, waiting for the current purge up to `deadline`: true when it
  /// ended, false when it still runs then (`stop()` or the destructor waits for it).
  bool stop_until(std::chrono::steady_clock::time_point deadline) {
    return worker_.stop_until(deadline);
  }

  /// Rows the background loop deleted so far.
  [[nodiscard]] std::size_t purged() const noexcept { return purged_.load(); }

  /// The background loop's latest error, empty if none.
  [[nodiscard]] std::string last_error() const {
    std::lock_guard lock(error_mutex_);
    return last_error_;
  }

 private:
  static Store& scoped(Store& store) {
    if constexpr (requires { store.gate(); }) {
      if (std::string_view(store.gate()).empty())
        throw std::invalid_argument(
            "idemgate: Retention was given a store handle of no gate (the store as constructed), "
            "which sees only the rows written before logs knew their gates: it would purge none "
            "of a gate's rows. Give it the gate's handle, gate.store() or "
            "store.for_gate(name); rows of no gate are adopted with `idemgate adopt --gate NAME` "
            "or purged with `idemgate purge --all-gates`.");
    }
    return store;
  }

  static RetentionOptions checked(const RetentionOptions& o) {
    detail::require_in_range("RetentionOptions::keep", o.keep, std::chrono::seconds(1),
                             std::chrono::seconds::max(),
                             "Set it above the longest time after which an event may still be "
                             "redelivered (default 7 days); seconds::max() keeps rows forever.");
    detail::require_in_range("RetentionOptions::interval", o.interval, std::chrono::milliseconds(1),
                             RetentionOptions::max_interval,
                             "It is the pause between purges (default 1 hour).");
    detail::require_in_range("RetentionOptions::batch", o.batch, std::size_t{1},
                             RetentionOptions::max_batch,
                             "It is the rows deleted per statement (default 1000).");
    if (o.abandoned_after) {
      detail::require_in_range("RetentionOptions::abandoned_after", *o.abandoned_after,
                               std::chrono::seconds(1), std::chrono::seconds::max(),
                               "Leave it unset on a consumer's gate; on an endpoint's, set it to "
                               "the endpoint's key_lifetime.");
      if constexpr (!expiring_store<Store>)
        throw std::invalid_argument(
            "idemgate: RetentionOptions::abandoned_after is set, but the store has no "
            "purge_abandoned(older_than, batch): leave the option unset, or give the store that "
            "method.");
    }
    return o;
  }

  Store& store_;
  RetentionOptions options_;
  std::atomic<std::size_t> purged_{0};
  mutable std::mutex error_mutex_;
  std::string last_error_;
  detail::PeriodicWorker worker_;
};

}  // namespace idemgate
