// SPDX-License-Identifier: MIT
// Group commit: the work items of concurrent callers, run as one group by one of them.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <utility>
#include <vector>

namespace idemgate::detail {

/// How a `Coalescer` forms its groups.
struct CoalescerLimits {
  /// How long a caller that finds no group running waits for others to join its group; 0 runs
  /// it at once (a caller then still joins a group that forms while another one runs).
  std::chrono::microseconds window{0};
  /// Most items in one group.
  std::size_t max_group = 32;
  /// Most groups running at once.
  std::size_t max_running = 1;
};

/**
 * Groups the items that concurrent callers submit, and has one of the callers (the leader) run
 * each group for all of them: the group-commit pattern. A caller that finds fewer than
 * `max_running` groups running leads a new group at once (after the window, if any); the others
 * queue, and the next leader takes every queued item, up to `max_group`. Items with equal keys
 * never share a group: a later one waits for the next, so it sees what the earlier one wrote.
 *
 * `Item` has a `key` member compared with `==`. The runner fills each slot's `answer`, or its
 * `error`; whatever the runner throws becomes the error of every slot it left unanswered.
 */
template <class Item, class Answer>
class Coalescer {
 public:
  /// One submitted item, its answer once the group ran, or what it threw.
  struct Slot {
    /// A slot for `submitted`, not yet answered.
    explicit Slot(Item submitted) : item(std::move(submitted)) {}

    /// What the caller submitted.
    Item item;
    /// The runner's answer.
    std::optional<Answer> answer;
    /// What the runner threw for this item (rethrown to its caller).
    std::exception_ptr error;
    // Taken into a group; its group ran.
    bool taken = false;
    bool done = false;
    // Signalled, with the coalescer's mutex held, when this caller may go on: its group ran, it
    // may lead the next group, or (leading) its group is full before the window ended.
    std::condition_variable wake;
  };

  /// Runs a group: answers every slot, or throws.
  using Runner = std::function<void(std::span<Slot* const>)>;

  /// A coalescer whose groups `run` runs.
  Coalescer(CoalescerLimits limits, Runner run) : limits_(limits), run_(std::move(run)) {
    if (limits_.max_group == 0 || limits_.max_running == 0)
      throw std::invalid_argument("idemgate: a coalescer needs groups of at least one item");
  }

  Coalescer(const Coalescer&) = delete;
  Coalescer& operator=(const Coalescer&) = delete;

  /// Runs `item` in a group, led by this caller or another, and returns its answer (or rethrows
  /// what its run threw).
  Answer submit(Item item) {
    Slot slot(std::move(item));
    {
      std::unique_lock lock(mutex_);
      queued_.push_back(&slot);
      // A leader waiting out its window goes at once when its group is full.
      for (Slot* leader : windowing_)
        if (queued_.size() + 1 >= limits_.max_group) leader->wake.notify_one();
      while (!slot.done) {
        // The oldest queued item leads the next group: groups form in the order of the calls.
        if (!slot.taken && running_ < limits_.max_running && queued_.front() == &slot) {
          lead(lock, slot);
          break;
        }
        slot.wake.wait(lock);
      }
    }
    if (slot.error) std::rethrow_exception(slot.error);
    if (!slot.answer)
      throw std::logic_error("idemgate: a coalesced group left an item without an answer");
    return std::move(*slot.answer);
  }

  /// Groups run so far (for tests and the benchmark).
  [[nodiscard]] std::size_t groups() const {
    std::lock_guard lock(mutex_);
    return groups_;
  }

  /// Items waiting for a group.
  [[nodiscard]] std::size_t waiting() const {
    std::lock_guard lock(mutex_);
    return queued_.size();
  }

  /// Items run in those groups.
  [[nodiscard]] std::size_t items() const {
    std::lock_guard lock(mutex_);
    return items_;
  }

  /// Callers that wait on another caller right now: queued behind a running group, or members
  /// of a group another caller runs (the oldest queued item, about to lead, is not counted).
  [[nodiscard]] std::size_t parked() const {
    std::lock_guard lock(mutex_);
    const bool next_leads = !queued_.empty() && running_ < limits_.max_running;
    return members_ + queued_.size() - (next_leads ? 1 : 0);
  }

 private:
  // With the lock held: forms a group around `own`, runs it unlocked, answers its callers.
  void lead(std::unique_lock<std::mutex>& lock, Slot& own) {
    ++running_;
    take(own);
    std::vector<Slot*> group{&own};
    if (limits_.window > std::chrono::microseconds(0)) {
      const auto until = std::chrono::steady_clock::now() + limits_.window;
      windowing_.push_back(&own);
      own.wake.wait_until(lock, until, [&] { return queued_.size() + 1 >= limits_.max_group; });
      std::erase(windowing_, &own);
    }
    for (std::size_t i = 0; i < queued_.size() && group.size() < limits_.max_group;) {
      Slot* next = queued_[i];
      bool same_key = false;
      for (const Slot* member : group) same_key = same_key || member->item.key == next->item.key;
      if (same_key) {
        ++i;
        continue;
      }
      take(*next);
      group.push_back(next);
    }
    ++groups_;
    items_ += group.size();
    members_ += group.size() - 1;
    wake_next_leader();  // with groups to spare, the new oldest item leads one of its own
    lock.unlock();
    try {
      run_(std::span<Slot* const>(group));
    } catch (...) {
      for (Slot* s : group)
        if (!s->answer && !s->error) s->error = std::current_exception();
    }
    lock.lock();
    members_ -= group.size() - 1;
    --running_;
    for (Slot* s : group) {
      s->done = true;
      if (s != &own) s->wake.notify_one();
    }
    wake_next_leader();
  }

  // With the lock held: lets the oldest queued item lead, when a group may start.
  void wake_next_leader() {
    if (!queued_.empty() && running_ < limits_.max_running) queued_.front()->wake.notify_one();
  }

  void take(Slot& slot) {
    slot.taken = true;
    std::erase(queued_, &slot);
  }

  const CoalescerLimits limits_;
  const Runner run_;
  mutable std::mutex mutex_;
  std::vector<Slot*> queued_;     // submitted, not yet in a group (oldest first)
  std::vector<Slot*> windowing_;  // leaders waiting out their window
  std::size_t running_ = 0;
  std::size_t members_ = 0;  // in a running group, not its leader
  std::size_t groups_ = 0;
  std::size_t items_ = 0;
};

}  // namespace idemgate::detail
