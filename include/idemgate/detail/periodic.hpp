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

  /// Starts the loop; does nothing when it already runs. After a stop that has not finished yet
  /// (`stop_until` answered false), waits for that pass to end first. `pass` must not throw. Any
  /// `interval` is safe: the next deadline saturates, so `milliseconds::max()` sleeps until a
  /// stop.
  void start(std::chrono::milliseconds interval, std::function<void()> pass) {
    std::lock_guard lock(control_);
    if (thread_.joinable()) {
      if (!stop_requested()) return;
      thread_.join();
    }
    stopping_ = false;  // no thread runs: nothing else reads them now
    finished_ = false;
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
      finished_ = true;
      ended_.notify_all();
    });
  }

  /// Asks the loop to stop after its current pass and returns at once.
  void request_stop() {
    {
      std::lock_guard state(state_);
      stopping_ = true;
    }
    wake_.notify_all();
  }

  /// Stops the loop and waits for the current pass to end; harmless when not running.
  void stop() {
    std::lock_guard lock(control_);
    if (!thread_.joinable()) return;
    request_stop();
    thread_.join();
  }

  /// Stops the loop and waits for the current pass to end, but not past `deadline`: true when
  /// the loop has ended, false when its pass still runs then (it ends on its own; `stop()` or the
  /// destructor waits for it).
  bool stop_until(std::chrono::steady_clock::time_point deadline) {
    std::lock_guard lock(control_);
    if (!thread_.joinable()) return true;
    request_stop();
    {
      std::unique_lock state(state_);
      if (!ended_.wait_until(state, deadline, [this] { return finished_; })) return false;
    }
    thread_.join();
    return true;
  }

 private:
  bool stop_requested() {
    std::lock_guard state(state_);
    return stopping_;
  }

  std::mutex control_;  // serialises start and stop
  std::mutex state_;    // guards stopping_ and finished_
  std::condition_variable wake_;
  std::condition_variable ended_;
  bool stopping_ = false;
  bool finished_ = false;
  std::thread thread_;
};

}  // namespace idemgate::detail
