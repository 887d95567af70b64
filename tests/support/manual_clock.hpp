#pragma once

// A clock the test moves by hand, for stores that take an injected clock: leases expire when
// the test says so, not when the machine is slow.

#include <chrono>
#include <functional>
#include <mutex>

namespace idemgate::test {

class ManualClock {
 public:
  /// The current time.
  std::chrono::system_clock::time_point now() const {
    std::lock_guard lock(mutex_);
    return now_;
  }
  /// Moves the time forward.
  void advance(std::chrono::milliseconds by) {
    std::lock_guard lock(mutex_);
    now_ += by;
  }
  /// The clock as a store takes it; the clock must outlive the store.
  std::function<std::chrono::system_clock::time_point()> fn() {
    return [this] { return now(); };
  }

 private:
  mutable std::mutex mutex_;
  std::chrono::system_clock::time_point now_ = std::chrono::system_clock::now();
};

}  // namespace idemgate::test
