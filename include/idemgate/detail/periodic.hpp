// SPDX-License-Identifier: MIT
// A worker thread that runs a task periodically until stopped (reconciler, retention).
#pragma once

#include "durations.hpp"

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <stop_token>
#include <thread>
#include <utility>

namespace idemgate::detail {

/// Runs a pass now and then every `interval` on a background thread, until stopped.
class PeriodicWorker {
 public:
  PeriodicWorker() = default;
  PeriodicWorker(const PeriodicWorker&) = delete;
  PeriodicWorker& operator=(const PeriodicWorker&) = delete;
  ~PeriodicWorker() { stop(); }

  /// Starts the loop; does nothing when it already runs. `pass` must not throw. Any `interval`
  /// is safe: the next deadline saturates, so `milliseconds::max()` sleeps until `stop()`.
  void start(std::chrono::milliseconds interval, std::function<void()> pass) {
    std::lock_guard lock(control_);
    if (thread_.joinable()) return;
    thread_ = std::jthread([this, interval, pass = std::move(pass)](std::stop_token stop) {
      std::mutex sleep_mutex;
      while (!stop.stop_requested()) {
        pass();
        std::unique_lock sleep_lock(sleep_mutex);
        // wait_for would add `interval` to the clock unchecked and overflow for huge ones.
        const auto deadline = saturating_add(std::chrono::steady_clock::now(), interval);
        wake_.wait_until(sleep_lock, stop, deadline, [] { return false; });
      }
    });
  }

  /// Stops the loop and waits for the current pass to end; harmless when not running.
  void stop() {
    std::lock_guard lock(control_);
    if (!thread_.joinable()) return;
    thread_.request_stop();
    wake_.notify_all();
    thread_.join();
  }

 private:
  std::mutex control_;
  std::condition_variable_any wake_;
  std::jthread thread_;
};

}  // namespace idemgate::detail
