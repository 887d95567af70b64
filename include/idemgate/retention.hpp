#pragma once

#include "detail/periodic.hpp"
#include "signals.hpp"

#include <atomic>
#include <chrono>
#include <cstddef>
#include <exception>
#include <mutex>
#include <string>

namespace idemgate {

/// Tuning of `Retention`.
struct RetentionOptions {
  /// How long a finished row is kept: the dedup window. It must be longer than the longest
  /// time after which the upstream may still redeliver or replay an event; a redelivery after
  /// its row was purged is processed again.
  std::chrono::seconds keep = std::chrono::hours(24 * 7);
  /// Time between purges of the background loop.
  std::chrono::milliseconds interval = std::chrono::hours(1);
  /// Rows deleted per statement, so each delete is short beside live traffic.
  std::size_t batch = 1000;
};

/**
 * Keeps the idempotency log small: deletes committed and failed rows past the dedup window, in
 * bounded batches, never in-flight or escalated rows.
 *
 * Example:
 *   idemgate::Retention retention{store, {.keep = std::chrono::days(7)}};
 *   retention.start();  // purges every hour until stop() or destruction
 */
template <monitored_store Store>
class Retention {
 public:
  /// Retention over `store`.
  explicit Retention(Store& store, RetentionOptions options = {})
      : store_(store), options_(options) {}
  Retention(const Retention&) = delete;
  Retention& operator=(const Retention&) = delete;
  ~Retention() { stop(); }

  /// One purge; returns the rows deleted.
  std::size_t run_once() { return store_.purge(options_.keep, options_.batch); }

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

  /// Rows the background loop deleted so far.
  [[nodiscard]] std::size_t purged() const noexcept { return purged_.load(); }

  /// The background loop's latest error, empty if none.
  [[nodiscard]] std::string last_error() const {
    std::lock_guard lock(error_mutex_);
    return last_error_;
  }

 private:
  Store& store_;
  RetentionOptions options_;
  std::atomic<std::size_t> purged_{0};
  mutable std::mutex error_mutex_;
  std::string last_error_;
  detail::PeriodicWorker worker_;
};

}  // namespace idemgate
