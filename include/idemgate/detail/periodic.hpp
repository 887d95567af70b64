// SPDX-License-Identifier: MIT
// A worker thread that runs a task periodically until stopped (reconciler, retention).
#pragma once

#include "durations.hpp"

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
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
    stopping_ = false;  // no thread runs: nothing else reads it now
    // std::thread and a flag, not std::jthread: some standard libraries (libc++ 16) lack it.
    thread_ = std::thread([this, interval, pass = std::move(pass)] {
      std::unique_lock state(state_);
      while (!stopping_) {
        state.unlock();
        pass();
        state.lock();
        // wait_for would add `interval` to the clock unchecked and overflow for huge ones.
        const auto deadline = saturating_add(std::chrono::steady_clock::now(), interval);
        wake_.wait_until(state, deadline, [this] { return stopping_; });
      }
    });
  }

  /// Stops the loop and waits for the current pass to end; harmless when not running.
  void stop() {
    std::lock_guard lock(control_);
    if (!thread_.joinable()) return;
    {
      std::lock_guard state(state_);
      stopping_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }

 private:
  std::mutex control_;  // serialises start and stop
  std::mutex state_;    // guards stopping_
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace idemgate::detail
