// SPDX-License-Identifier: MIT
// Graceful shutdown: SIGTERM turned into a flag a program waits on, and the parts stopped in order.
#pragma once

#include "detail/durations.hpp"
#include "gate.hpp"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <concepts>
#include <csignal>
#include <cstddef>
#include <cstring>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace idemgate {

namespace detail {

// The pipe a caught signal writes to, and the signal caught: what the handler may touch. Only
// async-signal-safe work happens in it: a store to a lock-free atomic and one write(2).
inline std::atomic<int> stop_signal_caught{0};
inline std::atomic<int> stop_signal_pipe{-1};
static_assert(std::atomic<int>::is_always_lock_free);

extern "C" inline void idemgate_stop_signal_handler(int signal) {
  const int saved = errno;
  int expected = 0;
  stop_signal_caught.compare_exchange_strong(expected, signal);
  const int fd = stop_signal_pipe.load();
  if (fd >= 0) {
    const char byte = 1;
    [[maybe_unused]] const auto ignored = ::write(fd, &byte, 1);
  }
  errno = saved;
}

}  // namespace detail

/**
 * Turns SIGTERM and SIGINT (or the signals given) into a stop request a program waits on, the
 * safe way: the handler only sets a flag and writes a byte to a pipe (a self-pipe); `wait`,
 * `requested` and whatever the program does next run on ordinary threads. The previous handlers
 * come back when it goes away. One at a time per process (a second throws `std::logic_error`).
 *
 * Example:
 *   idemgate::StopSignal sigterm;
 *   std::thread consumer([&] { while (!sigterm.requested()) consume_one(gate); });
 *   sigterm.wait();  // SIGTERM from the deployment, or Ctrl-C
 *   idemgate::stop_gracefully(std::chrono::seconds(20), gate, reconciler, retention);
 *   consumer.join();
 */
class StopSignal {
 public:
  /// Hooks `signals` (default SIGTERM and SIGINT); throws `std::logic_error` when another
  /// `StopSignal` is alive and `std::runtime_error` when the pipe or a handler cannot be set up.
  explicit StopSignal(std::initializer_list<int> signals = {SIGTERM, SIGINT}) : signals_(signals) {
    int expected = -1;
    int fds[2];
    if (::pipe(fds) != 0)
      throw std::runtime_error(std::string("idemgate: StopSignal could not create its pipe (") +
                               std::strerror(errno) + "); raise the process's file limit");
    for (int fd : fds) {
      ::fcntl(fd, F_SETFD, FD_CLOEXEC);
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    }
    if (!detail::stop_signal_pipe.compare_exchange_strong(expected, fds[1])) {
      ::close(fds[0]);
      ::close(fds[1]);
      throw std::logic_error(
          "idemgate: a StopSignal already exists in this process; share that one");
    }
    read_ = fds[0];
    write_ = fds[1];
    detail::stop_signal_caught.store(0);
    previous_.resize(signals_.size());
    for (std::size_t i = 0; i < signals_.size(); ++i) {
      struct sigaction action {};
      action.sa_handler = detail::idemgate_stop_signal_handler;
      sigemptyset(&action.sa_mask);
      action.sa_flags = SA_RESTART;
      if (::sigaction(signals_[i], &action, &previous_[i]) != 0) {
        restore(i);
        throw std::runtime_error("idemgate: StopSignal could not hook signal " +
                                 std::to_string(signals_[i]) + "; pass signals that can be caught");
      }
    }
  }
  StopSignal(const StopSignal&) = delete;
  StopSignal& operator=(const StopSignal&) = delete;
  ~StopSignal() { restore(signals_.size()); }

  /// True once a hooked signal arrived or `request()` was called.
  [[nodiscard]] bool requested() const noexcept { return detail::stop_signal_caught.load() != 0; }

  /// The signal that asked for the stop; -1 for `request()`, 0 while none has.
  [[nodiscard]] int signal() const noexcept { return detail::stop_signal_caught.load(); }

  /// Asks for a stop from the program itself (a fatal error elsewhere, a test).
  void request() noexcept { detail::idemgate_stop_signal_handler(-1); }

  /// Blocks until a stop is requested.
  void wait() const {
    while (!wait_for(std::chrono::hours(1))) {
    }
  }

  /// Blocks until a stop is requested or `timeout` passed; true when one was requested.
  bool wait_for(std::chrono::milliseconds timeout) const {
    const auto deadline = detail::saturating_add(std::chrono::steady_clock::now(), timeout);
    while (!requested()) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left <= std::chrono::milliseconds(0)) return false;
      // The pipe is never drained: once written, every waiter wakes up at once.
      pollfd readable{read_, POLLIN, 0};
      const auto slice = std::min<std::chrono::milliseconds::rep>(left.count(), 60'000);
      if (::poll(&readable, 1, static_cast<int>(slice)) < 0 && errno != EINTR)
        throw std::runtime_error(std::string("idemgate: StopSignal could not wait (") +
                                 std::strerror(errno) + ")");
    }
    return true;
  }

 private:
  void restore(std::size_t hooked) noexcept {
    for (std::size_t i = 0; i < hooked; ++i) ::sigaction(signals_[i], &previous_[i], nullptr);
    detail::stop_signal_pipe.store(-1);
    if (read_ >= 0) ::close(read_);
    if (write_ >= 0) ::close(write_);
    read_ = write_ = -1;
  }

  std::vector<int> signals_;
  std::vector<struct sigaction> previous_;
  int read_ = -1;
  int write_ = -1;
};

/// A background worker whose stop can be asked for at once and waited for up to a deadline
/// (`Reconciler`, `Retention`).
template <class Worker>
concept bounded_stop_worker = requires(Worker& w, std::chrono::steady_clock::time_point deadline) {
  w.request_stop();
  { w.stop_until(deadline) } -> std::convertible_to<bool>;
};

/**
 * Stops a consumer's parts in order, for a graceful shutdown, within `grace`: the gate first stops
 * taking new work (`process` answers `retry`), the background workers (`Reconciler`, `Retention`:
 * anything with `stop()`) are asked to end their current pass — a reconciler gives back the rows
 * it has not reached — and the calls in progress get what is left of `grace` to finish; the
 * leases of those still running, the reconciler's row in progress among them, are then given
 * back, so a redelivery takes their events over at once. Returns the gate's report, with the
 * workers still in a pass when `grace` ran out in `StopReport::workers_unfinished`: a slow
 * downstream under a reconciler's row cannot hold the stop past `grace`. A worker with only
 * `stop()` is stopped first and waited for without bound.
 *
 * Example:
 *   auto report = idemgate::stop_gracefully(std::chrono::seconds(20), gate, reconciler, retention);
 *   if (!report.clean()) log("handed on unfinished events: " + std::to_string(report.given_back));
 */
template <class GateType, class... Workers>
requires requires(GateType& g, std::chrono::milliseconds grace) {
  g.begin_stop();
  { g.stop(grace) } -> std::same_as<StopReport>;
}
StopReport stop_gracefully(std::chrono::milliseconds grace, GateType& gate,
                           Workers&... background) {
  const auto deadline = detail::saturating_add(std::chrono::steady_clock::now(), grace);
  gate.begin_stop();
  [[maybe_unused]] auto ask = [](auto& worker) {
    if constexpr (bounded_stop_worker<std::remove_cvref_t<decltype(worker)>>)
      worker.request_stop();
    else
      worker.stop();
  };
  (ask(background), ...);
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  StopReport report = gate.stop(std::max(left, std::chrono::milliseconds(0)));
  [[maybe_unused]] auto wait = [&](auto& worker) {
    if constexpr (bounded_stop_worker<std::remove_cvref_t<decltype(worker)>>) {
      if (!worker.stop_until(deadline)) ++report.workers_unfinished;
    }
  };
  (wait(background), ...);
  return report;
}

}  // namespace idemgate
