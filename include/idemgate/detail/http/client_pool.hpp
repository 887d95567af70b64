// SPDX-License-Identifier: MIT
// The kept-alive HTTP clients of one HttpDownstream, shared by its calling threads.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

namespace idemgate::detail::http {

/**
 * At most `max_connections` clients of type `Client`, each used by one thread at a time.
 *
 * A thread takes a client with `acquire`, uses it alone, and hands it back with `release`;
 * the pool keeps it idle for the next caller, most recently used first, and drops it once it has
 * been idle longer than `idle_timeout`. When every client is taken, `acquire` waits for one.
 * The pool never makes a client: `acquire` answers an empty lease when the caller may make one.
 */
template <class Client>
class ClientPool {
 public:
  /// What `acquire` hands out.
  struct Lease {
    /// A kept-alive client; null when the caller is to make a new one.
    std::unique_ptr<Client> client;
    /// Whether `client` served an earlier call and kept its connection.
    bool reused = false;
  };

  /// A pool of at most `max_connections` clients, dropping those idle for `idle_timeout`.
  ClientPool(std::size_t max_connections, std::chrono::milliseconds idle_timeout)
      : max_(max_connections), idle_timeout_(idle_timeout) {}

  /// A client (or leave to make one), waiting up to `wait` while all are taken; nullopt when
  /// none came free in time. Each lease must be handed back with `release`.
  [[nodiscard]] std::optional<Lease> acquire(std::chrono::milliseconds wait) {
    std::vector<std::unique_ptr<Client>> stale;  // closed after the lock is released
    std::unique_lock lock(mutex_);
    const auto deadline = std::chrono::steady_clock::now() + wait;
    for (;;) {
      drop_stale(stale);
      if (!idle_.empty()) {
        Lease lease{std::move(idle_.back().client), true};
        idle_.pop_back();
        ++taken_;
        return lease;
      }
      if (taken_ < max_) {
        ++taken_;
        return Lease{};
      }
      if (freed_.wait_until(lock, deadline) == std::cv_status::timeout && taken_ >= max_ &&
          idle_.empty())
        return std::nullopt;
    }
  }

  /// Hands back a leased client: kept for the next caller when `keep`, else closed.
  void release(std::unique_ptr<Client> client, bool keep) {
    {
      std::lock_guard lock(mutex_);
      --taken_;
      if (keep && client) idle_.push_back({std::move(client), std::chrono::steady_clock::now()});
    }
    freed_.notify_one();
    // A client not kept is closed here, outside the lock.
  }

 private:
  struct Idle {
    std::unique_ptr<Client> client;
    std::chrono::steady_clock::time_point since;
  };

  // Idle clients are in the order they came back, so the stale ones are at the front.
  void drop_stale(std::vector<std::unique_ptr<Client>>& out) {
    const auto now = std::chrono::steady_clock::now();
    std::size_t n = 0;
    while (n < idle_.size() && now - idle_[n].since > idle_timeout_) ++n;
    for (std::size_t i = 0; i < n; ++i) out.push_back(std::move(idle_[i].client));
    idle_.erase(idle_.begin(), idle_.begin() + static_cast<std::ptrdiff_t>(n));
  }

  const std::size_t max_;
  const std::chrono::milliseconds idle_timeout_;
  mutable std::mutex mutex_;
  std::condition_variable freed_;
  std::vector<Idle> idle_;
  std::size_t taken_ = 0;
};

}  // namespace idemgate::detail::http
