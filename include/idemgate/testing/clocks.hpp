// SPDX-License-Identifier: MIT
// Clocks a test moves by hand, for stores that take an injected clock (`idemgate::WallClock`):
// leases expire when the test says so, not when the machine is slow.
#pragma once

#include "../concepts.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>

namespace idemgate::testing {

/**
 * Real time plus an offset that `advance` moves forward; safe to read from any thread. For
 * traits whose store takes an injected clock (an `idemgate::WallClock`): pass it `fn()`.
 */
class ShiftableClock {
 public:
  /// The system clock's time plus every `advance` so far.
  std::chrono::system_clock::time_point now() const {
    return std::chrono::system_clock::now() + std::chrono::milliseconds(offset_ms_.load());
  }
  /// Moves this clock forward by `by`.
  void advance(std::chrono::milliseconds by) { offset_ms_ += by.count(); }
  /// This clock as a store's clock; the clock must outlive the store.
  WallClock fn() {
    return [this] { return now(); };
  }

 private:
  std::atomic<std::int64_t> offset_ms_{0};
};

/**
 * A clock that stands still until `advance` moves it; safe to read from any thread. For tests
 * that compare ages and deadlines exactly. Pass `fn()` to a store that takes an injected clock.
 */
class ManualClock {
 public:
  /// The current time: the system clock's time at construction plus every `advance` so far.
  std::chrono::system_clock::time_point now() const {
    std::lock_guard lock(mutex_);
    return now_;
  }
  /// Moves this clock forward by `by`.
  void advance(std::chrono::milliseconds by) {
    std::lock_guard lock(mutex_);
    now_ += by;
  }
  /// This clock as a store's clock; the clock must outlive the store.
  WallClock fn() {
    return [this] { return now(); };
  }

 private:
  mutable std::mutex mutex_;
  std::chrono::system_clock::time_point now_ = std::chrono::system_clock::now();
};

}  // namespace idemgate::testing
