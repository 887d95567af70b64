// SPDX-License-Identifier: MIT
// Keeping held leases alive: the gate's heartbeat and the lease keeper of batches and passes.
#pragma once

#include "concepts.hpp"
#include "detail/durations.hpp"
#include "key.hpp"
#include "record.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace idemgate::detail {

/// Ends a lease the caller holds, keeping `reason` as why where the store can
/// (`explaining_store`), and holding the key for `hold` before the next attempt where the store
/// can (`backing_off_store`). False when the fence no longer holds.
template <class Store>
bool release_with_reason(Store& store, const Key& key, std::int64_t fence, std::string_view reason,
                         std::chrono::milliseconds hold = std::chrono::milliseconds(0)) {
  if constexpr (backing_off_store<Store>)
    return store.release(key, fence, reason, hold);
  else if constexpr (explaining_store<Store>)
    return store.release(key, fence, reason);
  else
    return store.release(key, fence);
}

/// Keeps the leases of a batch alive while its events are worked through one after another: every
/// third of the lease, one `extend` call renews every lease still held. A no-op on a store that
/// cannot extend leases.
template <class Store>
class LeaseKeeper {
 public:
  LeaseKeeper(Store& store, std::chrono::milliseconds lease) : store_(store), lease_(lease) {}

  /// Starts keeping `held` alive (from now).
  void hold(std::vector<HeldLease> held) {
    held_ = std::move(held);
    renewed_ = std::chrono::steady_clock::now();
  }

  /// Stops keeping the lease of `key` alive (it was settled).
  void drop(const Key& key) {
    std::erase_if(held_, [&](const HeldLease& h) { return h.key == key; });
  }

  /// Extends the leases still held when a third of the lease has passed since the last renewal.
  void keep_alive() {
    if constexpr (lease_extending_store<Store>) {
      const auto now = std::chrono::steady_clock::now();
      if (held_.empty() || now - renewed_ < lease_ / 3) return;
      store_.extend(held_, lease_);
      renewed_ = now;
    }
  }

 private:
  Store& store_;
  std::chrono::milliseconds lease_;
  std::vector<HeldLease> held_;
  std::chrono::steady_clock::time_point renewed_;
};

/**
 * The gate's heartbeat: one background thread per gate that renews every lease its calls hold,
 * every third of the lease, in one fenced `extend` call (`WHERE key = … AND status = 'in_flight'
 * AND fence = …`). A live worker's lease therefore never runs out however slow its downstream is,
 * while a dead worker's lease runs out one lease after its last renewal.
 *
 * The thread starts with the first lease held and never blocks a caller: `hold` and `drop` only
 * take a short lock, the store is called outside it. A renewal that finds a fence gone marks
 * that lease as lost, and a lease none of whose renewals is known to have landed within the last
 * lease (they failed, hung, or found its row busy) may be lost; `drop` reports both, so the
 * caller does not ack an event it can no longer vouch for. On a store without `extend` there is
 * no thread and every lease simply runs its length.
 */
template <class Store>
class Heartbeat {
 public:
  /// Renews leases of `lease` on `store` every `lease / 3` (at least every millisecond) when
  /// `enabled`; otherwise only keeps track of them (for `stop`).
  Heartbeat(Store& store, std::chrono::milliseconds lease, bool enabled)
      : store_(store),
        lease_(lease),
        period_(std::max(lease / 3, std::chrono::milliseconds(1))),
        enabled_(enabled && lease_extending_store<Store>) {}
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;
  ~Heartbeat() { stop(); }

  /// How often the leases are renewed.
  [[nodiscard]] std::chrono::milliseconds period() const noexcept { return period_; }

  /// Starts keeping the lease of `key` under `fence` alive; returns its ticket, or 0 when the
  /// heartbeat was stopped (the gate is stopping: the caller must give the lease back itself).
  std::uint64_t hold(const Key& key, std::int64_t fence) {
    std::lock_guard lock(mutex_);
    if (stopped_) return 0;
    const std::uint64_t ticket = ++last_ticket_;
    held_.emplace(ticket, Entry{{key, fence}, std::chrono::steady_clock::now(), {}, {}});
    if (enabled_ && !thread_.joinable()) thread_ = std::thread([this] { run(); });
    return ticket;
  }

  /// Stops keeping the lease of `ticket` alive; returns why it may have been lost meanwhile (a
  /// renewal found its fence gone, no renewal known to have landed started within the last
  /// lease, or the gate stopped and gave it back), or an empty string when it was kept
  /// throughout.
  ///
  /// "Known to have landed" is what the heartbeat can vouch for: a renewal that answered that it
  /// extended the lease, counted from when it was sent. A renewal that hangs without an answer
  /// (a partition; its statement may or may not have run), one that answered an error, and one
  /// that skipped a busy row do not count: the lease may have run out under this worker and the
  /// event been taken over, however the renewals ended.
  std::string drop(std::uint64_t ticket) {
    std::lock_guard lock(mutex_);
    const auto it = held_.find(ticket);
    if (it == held_.end()) return {};
    const Entry& entry = it->second;
    std::string trouble = entry.lost;
    const auto unrenewed = std::chrono::steady_clock::now() - entry.renewed;
    if (trouble.empty() && enabled_ && unrenewed >= lease_) {
      trouble =
          "no renewal of it is known to have landed for " +
          std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(unrenewed).count()) +
          " ms, longer than the lease";
      if (!entry.failing.empty())
        trouble += " (its renewals failed: " + entry.failing + ")";
      else if (renewing_)
        trouble += " (a renewal is still waiting for an answer)";
    }
    held_.erase(it);
    return trouble;
  }

  /// Stops renewing the lease of `key` under `fence` before the caller gives it back: waits for
  /// a renewal under way, so none extends the lease again after the release — for one renewal
  /// period at most. A renewal that takes longer is stuck on a store that does not answer (a
  /// partition); the caller must not hang on it. Should it land after the release after all, it
  /// only keeps the event's lease for one more lease (a later takeover), never a second holder:
  /// every write is fenced.
  void give_up(const Key& key, std::int64_t fence) {
    std::unique_lock lock(mutex_);
    for (auto& [ticket, entry] : held_)
      if (entry.lease.fence == fence && entry.lease.key == key) entry.renew = false;
    idle_.wait_for(lock, period_, [this] { return !renewing_; });
  }

  /// Stops the thread (waiting for a renewal under way) and refuses later holds; returns the
  /// leases still held, now marked as given back, for the caller to release.
  std::vector<HeldLease> stop() {
    {
      std::lock_guard lock(mutex_);
      stopped_ = true;
    }
    wake_.notify_all();
    {
      std::lock_guard join(join_);
      if (thread_.joinable()) thread_.join();
    }
    std::lock_guard lock(mutex_);
    std::vector<HeldLease> left;
    for (auto& [ticket, entry] : held_) {
      if (!entry.given_back) left.push_back(entry.lease);
      entry.given_back = true;
      if (entry.lost.empty())
        entry.lost = "the gate stopped before this call finished and gave its lease back";
    }
    return left;
  }

 private:
  struct Entry {
    HeldLease lease;
    // When the last renewal that reached the store started (or when it was held).
    std::chrono::steady_clock::time_point renewed;
    // Why the lease may be lost; empty while it is kept.
    std::string lost;
    // The latest renewal's error while renewals fail; empty once one succeeds.
    std::string failing;
    bool given_back = false;
    // False once the caller gives the lease back.
    bool renew = true;
  };

  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait_for(lock, period_, [this] { return stopped_; });
      if (stopped_) return;
      std::vector<std::uint64_t> tickets;
      std::vector<HeldLease> leases;
      for (const auto& [ticket, entry] : held_) {
        if (!entry.lost.empty() || !entry.renew) continue;
        tickets.push_back(ticket);
        leases.push_back(entry.lease);
      }
      if (leases.empty()) continue;
      renewing_ = true;
      lock.unlock();
      const auto started = std::chrono::steady_clock::now();
      // 1 extended, 0 fence gone, -1 unknown (an error), 2 busy (the row was being written)
      std::vector<int> kept(leases.size(), 1);
      std::string error = renew(leases, kept);
      lock.lock();
      renewing_ = false;
      idle_.notify_all();
      for (std::size_t i = 0; i < tickets.size(); ++i) {
        const auto it = held_.find(tickets[i]);
        if (it == held_.end()) continue;
        Entry& entry = it->second;
        if (kept[i] == 1) {
          entry.renewed = started;
          entry.failing.clear();
        } else if (kept[i] == 0) {
          entry.lost = "a renewal found its fence gone: another attempt took the event over";
        } else if (kept[i] == -1) {
          entry.failing = error;
        }  // busy: neither renewed nor known to be lost; the next renewal tells
      }
    }
  }

  // One renewal of `leases`: one call for all (`renew` where the store says per lease what it
  // found; otherwise `extend`, and when fewer were extended than asked, one call each to learn
  // which fences are gone). Fills `kept`; returns the store's error, if any.
  std::string renew(const std::vector<HeldLease>& leases, std::vector<int>& kept) {
    if constexpr (lease_extending_store<Store>) {
      try {
        if constexpr (lease_renewing_store<Store>) {
          const std::vector<LeaseRenewal> found = store_.renew(leases, lease_);
          for (std::size_t i = 0; i < leases.size() && i < found.size(); ++i)
            kept[i] = found[i] == LeaseRenewal::extended ? 1
                      : found[i] == LeaseRenewal::gone   ? 0
                                                         : 2;
          return {};
        }
        const std::size_t extended = store_.extend(leases, lease_);
        if (extended == leases.size()) return {};
        if (leases.size() == 1) {
          kept[0] = 0;
          return {};
        }
        for (std::size_t i = 0; i < leases.size(); ++i)
          kept[i] = store_.extend(std::span<const HeldLease>(&leases[i], 1), lease_) == 1 ? 1 : 0;
        return {};
      } catch (const std::exception& e) {
        std::fill(kept.begin(), kept.end(), -1);
        return e.what();
      } catch (...) {
        std::fill(kept.begin(), kept.end(), -1);
        return "an unknown exception";
      }
    } else {
      return {};
    }
  }

  Store& store_;
  std::chrono::milliseconds lease_;
  std::chrono::milliseconds period_;
  bool enabled_;
  std::mutex join_;  // serialises joining the thread
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable idle_;  // a renewal ended
  bool stopped_ = false;
  bool renewing_ = false;
  std::uint64_t last_ticket_ = 0;
  std::unordered_map<std::uint64_t, Entry> held_;
  std::thread thread_;
};

}  // namespace idemgate::detail
